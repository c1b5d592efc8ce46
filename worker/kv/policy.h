// Per-request KV-cache policy: which compression runs at the end of prefill and its
// parameters. `full` keeps everything; `snapkv`, `pyramidkv` (layer budgets), `adakv`
// (head budgets) select by the observation window's attention; `streaming` keeps sinks +
// recent; `h2o` keeps accumulated-attention heavy hitters + recent. Budgets count tokens
// kept per KV head per layer, window included.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "worker/kv/selection.h"

namespace snap {

enum class KvPolicyKind : uint8_t { full, snapkv, streaming, h2o, pyramidkv, adakv };

const char* kv_policy_name(KvPolicyKind k);
Result<KvPolicyKind> kv_policy_from_name(const std::string& name);
Result<KvPooling> kv_pooling_from_name(const std::string& name);
Result<GqaAggregation> gqa_aggregation_from_name(const std::string& name);

struct KvPolicy {
  KvPolicyKind kind = KvPolicyKind::full;
  int64_t budget = 1024;  // B, tokens per KV head per layer (average for pyramidkv/adakv)
  int window = 32;        // W (snapkv, pyramidkv, adakv)
  int kernel = 31;        // pooling kernel (odd); 31, not the paper's 7: docs/eval.md (second sweep)
  KvPooling pooling = KvPooling::avg;  // avg, not the paper's max: docs/eval.md (sixth and seventh sweeps)
  GqaAggregation aggregation = GqaAggregation::mean;
  int num_sink = 4;             // streaming
  double adakv_alpha = 0.2;     // adakv safeguard share
  int pyramid_beta = 20;        // pyramidkv min/max ratio parameter
  // Compress after the first `context_tokens` prompt tokens (the context), then prefill
  // the rest (the question) on the compressed cache; 0 = compress after the whole prompt.
  int64_t context_tokens = 0;
  // Run the prompt through one layer at a time and compress each layer right away, so
  // peak memory holds one layer's full KV instead of all layers'.
  bool layerwise = false;

  // Checks the parameters (budget > window, odd kernel, ...): one-line message naming the field.
  Status validate() const;
  // Tokens kept per KV head per layer after compressing a prompt of n tokens (upper bound
  // for adakv heads, exact on average) — what admission control reserves.
  int64_t kept_per_head(int64_t n) const;
  std::string describe() const;
};

}  // namespace snap
