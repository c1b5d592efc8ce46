// The automatic layer-wise prefill rule (coordinator/engine/prefill_choice.h). At SmolLM2's
// shape with f32 KV (8,256-byte blocks), a 7,493-token prompt under snapkv 1024: chunked
// holds 30 layers × 3 heads × 469 blocks (332 MiB); layer-wise one layer's 3 × 469 (11 MiB)
// + 29 layers at 64 blocks (44 MiB) + the prompt's hidden states (16 MiB) = 71 MiB. Long
// prompts go layer-wise; a prompt within the budget never does (nothing is dropped).
#include "coordinator/engine/prefill_choice.h"

#include <algorithm>

namespace snap {

PrefillPeaks prefill_peaks(const PrefillPeakInputs& in) {
  const int64_t n = in.prompt_tokens, bs = std::max<int64_t>(in.block_size, 1);
  const int64_t full_blocks = (n + bs - 1) / bs;
  const int64_t kept_blocks = (std::min(n, in.max_layer_budget) + bs - 1) / bs;
  PrefillPeaks p;
  p.chunked_bytes = in.num_layers * in.kv_heads * full_blocks * in.block_bytes +
                    std::min(n, in.prefill_chunk) * in.hidden_size * 4;
  p.layerwise_bytes = in.kv_heads * full_blocks * in.block_bytes +
                      (in.num_layers - 1) * in.kv_heads * kept_blocks * in.block_bytes + n * in.hidden_size * 4;
  return p;
}

bool layerwise_prefill_is_cheaper(const PrefillPeakInputs& in) {
  const PrefillPeaks p = prefill_peaks(in);
  return p.layerwise_bytes < p.chunked_bytes;
}

const char* prefill_kind_name(bool layerwise, bool chosen_automatically) {
  if (!layerwise) return "chunked";
  return chosen_automatically ? "layerwise_auto" : "layerwise";
}

}  // namespace snap
