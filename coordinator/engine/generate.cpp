// generate(): validate, size the KV cache from the request, prefill, then the decode loop.
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
  if (c.max_position > 0 && n > c.max_position) {
    return invalid_argument("prompt has " + std::to_string(n) + " tokens, more than the model's context of " +
                            std::to_string(c.max_position));
  }
  // Room for the prompt and every new token, capped by the context; sized from the request.
  int64_t limit = n + req.max_tokens;
  if (c.max_position > 0) limit = std::min(limit, c.max_position);

  GenerateResult result;
  result.finish_reason = "length";
  KvCache cache(model.kv_shape());
  cache.reserve(std::max(limit, n));

  const int64_t vocab = c.vocab_size;
  std::vector<float> logits(vocab);
  kernels::Rng rng(req.sampling.seed);

  double t0 = now_seconds();
  if (hooks.on_prompt_logits) {
    model.prefill(req.prompt_ids.data(), n, cache, logits.data(), req.prefill_chunk, hooks.on_prompt_logits);
  } else {
    model.prefill(req.prompt_ids.data(), n, cache, logits.data(), req.prefill_chunk, nullptr);
  }
  result.stats.prefill_seconds = now_seconds() - t0;

  t0 = now_seconds();
  for (int64_t step = 0; step < req.max_tokens; ++step) {
    const int32_t id = kernels::sample_cpu(logits.data(), vocab, req.sampling, rng);
    result.tokens.push_back(id);
    const bool is_stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end();
    const bool keep_going = hooks.on_token ? hooks.on_token(id) : true;
    if (is_stop) {
      result.finish_reason = "stop";
      break;
    }
    if (!keep_going) {
      result.finish_reason = "stop";
      break;
    }
    if (step + 1 == req.max_tokens) break;
    if (cache.length() >= limit) break;  // context full: finish with "length"
    model.forward(&id, 1, cache, logits.data(), false);
  }
  result.stats.decode_seconds = now_seconds() - t0;
  result.stats.prompt_tokens = n;
  result.stats.generated_tokens = static_cast<int64_t>(result.tokens.size());
  result.stats.kv_bytes = cache.used_bytes();
  result.stats.kv_allocated_bytes = cache.allocated_bytes();
  return result;
}

}  // namespace snap
