// generate(): validate, size the block pool from the request, open the sequence, prefill
// chunk by chunk (compression happens on every rank when the prompt reaches the policy's
// point), then the decode loop — each forward one StepPlan.
#include "coordinator/engine/generate.h"

#include <algorithm>

#include "common/sys.h"
#include "coordinator/engine/prefill_choice.h"
#include "kernels/kv_convert.h"

namespace snap {
namespace {

constexpr uint64_t k_seq = 1;  // generate runs one sequence at a time

// Prefill, decode loop and stats; the caller opened the sequence and closes it.
Status run_sequence(StepDriver& driver, const GenerateRequest& req, const GenerateHooks& hooks, int64_t limit,
                    int64_t compress_at, GenerateResult& result) {
  Worker& local = driver.local();
  const ModelConfig& c = local.config();
  const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
  const int64_t vocab = c.vocab_size;
  const Worker::Sequence& seq = *local.sequence(k_seq);
  std::vector<float> logits(vocab);
  std::vector<float> rows;
  float* last = logits.data();

  double t0 = now_seconds();
  bool layerwise = req.kv_policy.layerwise && seq.compressor->active();
  if (!layerwise && req.auto_layerwise && seq.compressor->active() && compress_at == n && !hooks.on_prompt_logits) {
    // Peak bytes of either prefill on this rank (coordinator/engine/prefill_choice.h).
    PrefillPeakInputs in;
    in.prompt_tokens = n;
    in.num_layers = c.num_layers;
    in.kv_heads = local.shard().num_kv_heads;
    in.block_size = local.pool()->block_size();
    in.block_bytes = local.pool()->block_bytes();
    for (int l = 0; l < c.num_layers; ++l) in.max_layer_budget = std::max(in.max_layer_budget, seq.compressor->layer_budget(l));
    in.prefill_chunk = req.prefill_chunk;
    in.hidden_size = c.hidden_size;
    layerwise = layerwise_prefill_is_cheaper(in);
  }
  result.stats.layerwise = layerwise;
  if (layerwise) {
    if (hooks.on_prompt_logits) return invalid_argument("layer-wise prefill does not produce per-position logits");
    StepPlan plan;
    plan.chunk = req.prefill_chunk;
    plan.items.push_back({k_seq, 0, req.prompt_ids, true, true, LogitsWanted::last});
    SNAP_RETURN_IF_ERROR(driver.run(plan, {&last, 1}));
  } else {
    for (int64_t start = 0; start < n;) {
      int64_t len = std::min(req.prefill_chunk, n - start);
      // A chunk never crosses the compression point: compress exactly at compress_at.
      if (seq.compressor->active() && start < compress_at) len = std::min(len, compress_at - start);
      StepPlan plan;
      StepItem item{k_seq, static_cast<int32_t>(start), {}, true, false, LogitsWanted::last};
      item.tokens.assign(req.prompt_ids.begin() + start, req.prompt_ids.begin() + start + len);
      float* out = last;
      if (hooks.on_prompt_logits) {
        item.logits = LogitsWanted::all;
        rows.resize(static_cast<size_t>(len * vocab));
        out = rows.data();
      }
      plan.items.push_back(std::move(item));
      SNAP_RETURN_IF_ERROR(driver.run(plan, {&out, 1}));
      if (hooks.on_prompt_logits) {
        for (int64_t t = 0; t < len; ++t) hooks.on_prompt_logits(start + t, rows.data() + t * vocab);
        std::copy_n(rows.data() + (len - 1) * vocab, vocab, logits.data());
      }
      start += len;
    }
  }
  result.stats.prefill_seconds = now_seconds() - t0;
  result.stats.selection_seconds = seq.compressor->selection_seconds();
  const int64_t peak_blocks = local.pool()->peak_used();
  if (!req.kv_selection_dump.empty()) {
    StepPlan plan;
    plan.dumps.push_back({k_seq, req.kv_selection_dump, n});
    SNAP_RETURN_IF_ERROR(driver.run(plan));
  }
  if (hooks.on_prefilled) hooks.on_prefilled(*seq.cache);

  t0 = now_seconds();
  kernels::Rng rng(req.sampling.seed);
  for (int64_t step = 0; step < req.max_tokens; ++step) {
    if (hooks.on_step_logits) hooks.on_step_logits(logits.data());
    const int32_t id = kernels::sample_cpu(logits.data(), vocab, req.sampling, rng);
    result.tokens.push_back(id);
    const bool is_stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end();
    const bool keep_going = hooks.on_token ? hooks.on_token(id) : true;
    if (is_stop || !keep_going) {
      result.finish_reason = "stop";
      break;
    }
    if (step + 1 == req.max_tokens) break;
    const int32_t pos = seq.cache->next_position();
    if (pos >= limit) break;  // context full: finish with "length"
    StepPlan plan;
    plan.items.push_back({k_seq, pos, {id}, false, false, LogitsWanted::last});
    SNAP_RETURN_IF_ERROR(driver.run(plan, {&last, 1}));
  }
  result.stats.decode_seconds = now_seconds() - t0;
  result.stats.prompt_tokens = n;
  result.stats.generated_tokens = static_cast<int64_t>(result.tokens.size());
  result.stats.kv_resident_bytes = seq.cache->resident_bytes();
  result.stats.kv_stored_bytes = seq.cache->stored_bytes();
  result.stats.kv_full_equivalent_bytes = seq.cache->full_equivalent_bytes();
  result.stats.kv_pool_peak_bytes = std::max(peak_blocks, local.pool()->peak_used()) * local.pool()->block_bytes();
  result.stats.kv_dtype = local.pool()->kv_dtype();
  result.stats.scratch_peak_bytes = local.forward().peak_scratch_bytes();
  return {};
}

}  // namespace

Status validate_generate_request(const ModelConfig& c, const GenerateRequest& req) {
  const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
  if (n == 0) return invalid_argument("prompt is empty (0 tokens)");
  if (req.max_tokens < 0) return invalid_argument("max_tokens must be >= 0, got " + std::to_string(req.max_tokens));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = req.prompt_ids[i];
    if (id < 0 || id >= c.vocab_size) {
      return invalid_argument("prompt token " + std::to_string(i) + " has id " + std::to_string(id) +
                              " outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
  }
  const int64_t context = req.context_limit > 0 ? req.context_limit : c.max_position;
  if (context > 0 && n > context) {
    return invalid_argument("prompt has " + std::to_string(n) + " tokens, more than the model's context of " +
                            std::to_string(context));
  }
  const KvPolicy& policy = req.kv_policy;
  SNAP_RETURN_IF_ERROR(policy.validate());
  if (policy.context_tokens > n) {
    return invalid_argument("context of " + std::to_string(policy.context_tokens) + " tokens is longer than the prompt (" +
                            std::to_string(n) + ")");
  }
  if (policy.layerwise && policy.context_tokens > 0) {
    return invalid_argument("layer-wise prefill compresses the whole prompt; it cannot be combined with context-only compression");
  }
  if (req.prefill_chunk <= 0) return invalid_argument("prefill chunk must be > 0");
  return {};
}

Result<GenerateResult> generate(StepDriver& driver, const GenerateRequest& req, const GenerateHooks& hooks) {
  Worker& local = driver.local();
  const ModelConfig& c = local.config();
  SNAP_RETURN_IF_ERROR(validate_generate_request(c, req));
  const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
  const int64_t context = req.context_limit > 0 ? req.context_limit : c.max_position;
  // Positions up to the prompt and every new token, capped by the context.
  int64_t limit = n + req.max_tokens;
  if (context > 0) limit = std::min(limit, context);
  limit = std::max(limit, n);

  // A pool (per rank, for this rank's KV heads) that can hold the uncompressed sequence:
  // address space only — pages are touched as blocks are first used, and blocks freed by
  // compression are reused first.
  StepPlan open;
  open.block_size = req.kv_block_size;
  open.kv_dtype = req.kv_dtype;
  const int64_t blocks_per_head = (limit + req.kv_block_size - 1) / req.kv_block_size;
  const int64_t block_bytes_estimate =
      2LL * req.kv_block_size * kernels::kv_row_bytes(req.kv_dtype, c.head_dim) + req.kv_block_size * 4 + 64;
  open.pool_bytes = req.kv_pool_bytes > 0
                        ? req.kv_pool_bytes
                        : int64_t{c.num_layers} * local.shard().num_kv_heads * blocks_per_head * block_bytes_estimate;
  const int64_t compress_at = req.kv_policy.context_tokens > 0 ? req.kv_policy.context_tokens : n;
  open.open.push_back({k_seq, req.kv_policy, compress_at});
  SNAP_RETURN_IF_ERROR(driver.run(open));

  GenerateResult result;
  result.finish_reason = "length";
  const Status st = run_sequence(driver, req, hooks, limit, compress_at, result);
  StepPlan close;
  close.close.push_back(k_seq);
  const Status closed = driver.run(close);
  SNAP_RETURN_IF_ERROR(st);
  SNAP_RETURN_IF_ERROR(closed);
  return result;
}

Result<GenerateResult> generate(LlamaForward& model, const GenerateRequest& req, const GenerateHooks& hooks) {
  Worker local(model);
  StepDriver driver(local, nullptr);
  return generate(driver, req, hooks);
}

}  // namespace snap
