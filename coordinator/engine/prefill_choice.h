// Which prefill a compressing request gets when it did not ask for one: layer by layer
// (every layer of the whole prompt in turn, compressed before the next) when that peaks
// lower in memory than chunked prefill (every layer's full KV until the end of the prompt),
// and nothing needs all layers' prompt logits. One rule for generate, serve and batch, so a
// request's prefill kind — and its peak — does not depend on the front end.
#pragma once

#include <cstdint>

namespace snap {

// What the two peaks depend on (bytes on this rank; KV of this rank's heads).
struct PrefillPeakInputs {
  int64_t prompt_tokens = 0;
  int64_t num_layers = 0;
  int64_t kv_heads = 0;          // this rank's KV heads per layer
  int64_t block_size = 16;       // tokens per KV block
  int64_t block_bytes = 0;       // bytes per KV block (K + V + positions, kv_dtype's rows)
  int64_t max_layer_budget = 0;  // tokens the largest layer keeps after compression
  int64_t prefill_chunk = 0;     // prompt tokens per chunk of chunked prefill
  int64_t hidden_size = 0;       // f32 hidden states: layer-wise keeps the whole prompt's
};

struct PrefillPeaks {
  // All layers' full KV + one chunk's hidden states.
  int64_t chunked_bytes = 0;
  // One layer's full KV + the other layers compressed + the whole prompt's hidden states.
  int64_t layerwise_bytes = 0;
};

PrefillPeaks prefill_peaks(const PrefillPeakInputs& in);

// True when layer-wise prefill peaks strictly lower (the caller checks that the policy
// compresses the whole prompt and that no per-position prompt logits are wanted).
bool layerwise_prefill_is_cheaper(const PrefillPeakInputs& in);

// How a request was prefilled, for reports: "chunked", "layerwise" (asked for) or
// "layerwise_auto" (chosen by layerwise_prefill_is_cheaper).
const char* prefill_kind_name(bool layerwise, bool chosen_automatically);

}  // namespace snap
