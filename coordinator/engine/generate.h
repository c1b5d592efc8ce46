// One sequence, start to finish: prefill the prompt ids, then sample and decode token by
// token until max_tokens, a stop id, or the context limit. Used by `snapserve generate`
// and by the tests; the server's scheduler will batch many of these.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"
#include "worker/model/llama.h"

namespace snap {

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;
  int64_t max_tokens = 128;
  kernels::SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
  int64_t prefill_chunk = 512;    // tokens per prefill forward (bounds scratch memory)
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;         // all decode steps (tokens after the first)
  int64_t kv_bytes = 0;              // bytes holding the stored K/V at the end
  int64_t kv_allocated_bytes = 0;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (including a final stop id, if any)
  std::string finish_reason;    // "stop" or "length"
  GenerateStats stats;
};

struct GenerateHooks {
  // Called with each generated id as soon as it is sampled; return false to stop.
  std::function<bool(int32_t)> on_token;
  // When set, called with the logits of every prompt position (row of vocab_size floats).
  std::function<void(int64_t position, const float* logits)> on_prompt_logits;
};

Result<GenerateResult> generate(LlamaForward& model, const GenerateRequest& request, const GenerateHooks& hooks = {});

}  // namespace snap
