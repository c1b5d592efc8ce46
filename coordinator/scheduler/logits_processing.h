// What happens to a sequence's logits between the model and the sampler, for the OpenAI and
// vLLM request fields: repetition, frequency and presence penalties, logit_bias, min_tokens;
// and the log-probabilities reported back. Pure functions over one row of logits.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "coordinator/scheduler/engine.h"

namespace snap {

// The token history the penalties read.
struct TokenHistory {
  std::vector<int32_t> prompt_unique;               // sorted, distinct prompt tokens (repetition)
  std::unordered_map<int32_t, int32_t> output_counts;  // output token -> times sampled
};

// True when `r` changes the logits at all (the engine skips the pass otherwise).
bool logits_processing_active(const EngineRequest& r);

// In place, in vLLM's order: repetition penalty (prompt and output tokens), frequency and
// presence penalties (output tokens), logit_bias, then -inf for `eos_ids` and
// r.stop_token_ids while `generated` < r.min_tokens (EOS only when !r.ignore_eos).
void apply_logits_processing(float* logits, int64_t vocab, const EngineRequest& r, const TokenHistory& history,
                             int64_t generated, const std::vector<int32_t>& eos_ids);

// The plain reference: the same result, one token at a time over the whole vocabulary.
void apply_logits_processing_ref(float* logits, int64_t vocab, const EngineRequest& r, const TokenHistory& history,
                                 int64_t generated, const std::vector<int32_t>& eos_ids);

struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // most likely first; ties: lower id first
};
// log-softmax of `logits` at `chosen` and the `k` largest entries (k >= 0).
TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t chosen, int k);

}  // namespace snap
