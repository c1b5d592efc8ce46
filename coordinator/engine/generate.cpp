// generate(): validate, size a block pool from the request, prefill (+ compression), then
// the decode loop.
#include "coordinator/engine/generate.h"

#include <algorithm>

#include "common/sys.h"

namespace snap {

Result<GenerateResult> generate(LlamaForward& model, const GenerateRequest& req, const GenerateHooks& hooks) {
  const ModelConfig& c = model.config();
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
  // Positions up to the prompt and every new token, capped by the context.
  int64_t limit = n + req.max_tokens;
  if (context > 0) limit = std::min(limit, context);
  limit = std::max(limit, n);

  // A pool that can hold the uncompressed sequence: address space only — pages are touched
  // as blocks are first used, and blocks freed by compression are reused first.
  BlockPoolConfig pc;
  pc.block_size = req.kv_block_size;
  pc.head_dim = c.head_dim;
  const int64_t blocks_per_head = (limit + pc.block_size - 1) / pc.block_size;
  const int64_t block_bytes_estimate = 2LL * pc.block_size * c.head_dim * 4 + pc.block_size * 4 + 64;
  pc.capacity_bytes = req.kv_pool_bytes > 0 ? req.kv_pool_bytes
                                            : int64_t{c.num_layers} * c.num_kv_heads * blocks_per_head * block_bytes_estimate;
  SNAP_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool, BlockPool::create(pc));
  PagedKvCache cache(*pool, model.kv_shape());

  const int64_t compress_at = policy.context_tokens > 0 ? policy.context_tokens : n;
  KvCompressor compressor(policy, model.compressor_shape(), compress_at);

  GenerateResult result;
  result.finish_reason = "length";
  const int64_t vocab = c.vocab_size;
  std::vector<float> logits(vocab);
  kernels::Rng rng(req.sampling.seed);
  int64_t peak_blocks = 0;

  double t0 = now_seconds();
  if (policy.layerwise && compressor.active()) {
    if (hooks.on_prompt_logits) return invalid_argument("layer-wise prefill does not produce per-position logits");
    SNAP_RETURN_IF_ERROR(model.prefill_layerwise(req.prompt_ids.data(), n, cache, logits.data(), req.prefill_chunk,
                                                 compressor));
  } else {
    SNAP_RETURN_IF_ERROR(model.prefill(req.prompt_ids.data(), n, cache, logits.data(), req.prefill_chunk, &compressor,
                                       hooks.on_prompt_logits));
  }
  result.stats.prefill_seconds = now_seconds() - t0;
  result.stats.selection_seconds = compressor.selection_seconds();
  peak_blocks = pool->peak_used();
  if (hooks.on_prefilled) hooks.on_prefilled(cache);

  t0 = now_seconds();
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
    if (cache.next_position() >= limit) break;  // context full: finish with "length"
    SNAP_RETURN_IF_ERROR(model.forward(&id, 1, cache, logits.data(), false));
  }
  result.stats.decode_seconds = now_seconds() - t0;
  result.stats.prompt_tokens = n;
  result.stats.generated_tokens = static_cast<int64_t>(result.tokens.size());
  result.stats.kv_resident_bytes = cache.resident_bytes();
  result.stats.kv_stored_bytes = cache.stored_bytes();
  result.stats.kv_full_equivalent_bytes = cache.full_equivalent_bytes();
  result.stats.kv_pool_peak_bytes = std::max(peak_blocks, pool->peak_used()) * pool->block_bytes();
  return result;
}

}  // namespace snap
