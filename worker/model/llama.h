// The Llama-family forward pass (llama, mistral, qwen2) on CPU over a full KV cache.
// Prefill runs a whole prompt (in chunks, so scratch memory stays bounded) and decode
// runs one token at a time; both append K/V (after RoPE) to the cache at positions
// cache.length().. and return logits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/weights.h"

namespace snap {

class LlamaForward {
 public:
  // The model must outlive this object.
  explicit LlamaForward(const LoadedModel& model);

  const ModelConfig& config() const { return model_.config; }
  KvCacheShape kv_shape() const;

  // Runs tokens[0..num_tokens) at positions cache.length().. and appends their K/V.
  // logits: [num_tokens, vocab_size] if all_logits, else [vocab_size] for the last token.
  // The cache must have room (KvCache::reserve) for the new tokens.
  void forward(const int32_t* tokens, int64_t num_tokens, KvCache& cache, float* logits, bool all_logits);

  // forward() in chunks of at most `chunk` tokens (bounded scratch memory); logits of the
  // last token only, or of every position through on_logits(position, row) when given.
  template <typename OnLogits>
  void prefill(const int32_t* tokens, int64_t num_tokens, KvCache& cache, float* last_logits, int64_t chunk,
               OnLogits&& on_logits);

 private:
  void ensure_scratch(int64_t num_tokens);

  const LoadedModel& model_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  // Scratch, sized for the largest chunk seen: [num_tokens, ...]
  int64_t scratch_tokens_ = 0;
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_;
  std::vector<int32_t> positions_;
};

template <typename OnLogits>
void LlamaForward::prefill(const int32_t* tokens, int64_t num_tokens, KvCache& cache, float* last_logits,
                           int64_t chunk, OnLogits&& on_logits) {
  CHECK_GT(chunk, 0);
  constexpr bool k_all = !std::is_same_v<std::decay_t<OnLogits>, std::nullptr_t>;
  std::vector<float> rows;
  const int64_t vocab = model_.config.vocab_size;
  for (int64_t start = 0; start < num_tokens; start += chunk) {
    const int64_t n = std::min(chunk, num_tokens - start);
    if constexpr (k_all) {
      rows.resize(static_cast<size_t>(n * vocab));
      forward(tokens + start, n, cache, rows.data(), true);
      for (int64_t t = 0; t < n; ++t) on_logits(start + t, rows.data() + t * vocab);
      if (start + n == num_tokens) std::copy_n(rows.data() + (n - 1) * vocab, vocab, last_logits);
    } else {
      forward(tokens + start, n, cache, last_logits, false);
    }
  }
}

}  // namespace snap
