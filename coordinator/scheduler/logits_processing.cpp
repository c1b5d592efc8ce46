// Logits processing (see logits_processing.h). The fast pass touches only the tokens the
// history, the bias and the masks name; the reference walks the whole vocabulary and asks
// each token what applies to it. Both must give identical floats: same operations, same order.
#include "coordinator/scheduler/logits_processing.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace snap {
namespace {

float repetition(float logit, float p) { return logit > 0.0f ? logit / p : logit * p; }

bool masked_now(const EngineRequest& r, int64_t generated) { return generated < r.min_tokens; }

}  // namespace

bool logits_processing_active(const EngineRequest& r) {
  return r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f || r.repetition_penalty != 1.0f ||
         !r.logit_bias.empty() || r.min_tokens > 0;
}

void apply_logits_processing(float* logits, int64_t vocab, const EngineRequest& r, const TokenHistory& h,
                             int64_t generated, const std::vector<int32_t>& eos_ids) {
  if (r.repetition_penalty != 1.0f) {
    // Once per distinct token of prompt ∪ output.
    for (int32_t t : h.prompt_unique) {
      if (t >= 0 && t < vocab) logits[t] = repetition(logits[t], r.repetition_penalty);
    }
    for (const auto& [t, n] : h.output_counts) {
      if (t < 0 || t >= vocab) continue;
      if (std::binary_search(h.prompt_unique.begin(), h.prompt_unique.end(), t)) continue;  // done above
      logits[t] = repetition(logits[t], r.repetition_penalty);
    }
  }
  if (r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f) {
    for (const auto& [t, n] : h.output_counts) {
      if (t < 0 || t >= vocab || n <= 0) continue;
      logits[t] -= r.frequency_penalty * static_cast<float>(n) + r.presence_penalty;
    }
  }
  for (const auto& [t, bias] : r.logit_bias) {
    if (t >= 0 && t < vocab) logits[t] += bias;
  }
  if (masked_now(r, generated)) {
    constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();
    if (!r.ignore_eos) {
      for (int32_t t : eos_ids) {
        if (t >= 0 && t < vocab) logits[t] = k_neg_inf;
      }
    }
    for (int32_t t : r.stop_token_ids) {
      if (t >= 0 && t < vocab) logits[t] = k_neg_inf;
    }
  }
}

void apply_logits_processing_ref(float* logits, int64_t vocab, const EngineRequest& r, const TokenHistory& h,
                                 int64_t generated, const std::vector<int32_t>& eos_ids) {
  for (int64_t t = 0; t < vocab; ++t) {
    const int32_t id = static_cast<int32_t>(t);
    const bool in_prompt = std::find(h.prompt_unique.begin(), h.prompt_unique.end(), id) != h.prompt_unique.end();
    const auto out = h.output_counts.find(id);
    const int32_t count = out == h.output_counts.end() ? 0 : out->second;
    float x = logits[t];
    if (r.repetition_penalty != 1.0f && (in_prompt || out != h.output_counts.end())) x = repetition(x, r.repetition_penalty);
    if ((r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f) && count > 0) {
      x -= r.frequency_penalty * static_cast<float>(count) + r.presence_penalty;
    }
    for (const auto& [b, bias] : r.logit_bias) {
      if (b == id) x += bias;
    }
    if (masked_now(r, generated)) {
      const bool eos = std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end();
      const bool stop = std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), id) != r.stop_token_ids.end();
      if ((eos && !r.ignore_eos) || stop) x = -std::numeric_limits<float>::infinity();
    }
    logits[t] = x;
  }
}

TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t chosen, int k) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < vocab; ++t) max = std::max(max, logits[t]);
  double sum = 0.0;
  for (int64_t t = 0; t < vocab; ++t) sum += std::exp(static_cast<double>(logits[t]) - max);
  const double lse = static_cast<double>(max) + std::log(sum);
  TokenLogprobs out;
  out.logprob = static_cast<float>(static_cast<double>(logits[chosen]) - lse);
  if (k > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    for (int64_t t = 0; t < vocab; ++t) ids[t] = static_cast<int32_t>(t);
    const int64_t n = std::min<int64_t>(k, vocab);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    for (int64_t i = 0; i < n; ++i) {
      out.top.emplace_back(ids[i], static_cast<float>(static_cast<double>(logits[ids[i]]) - lse));
    }
  }
  return out;
}

}  // namespace snap
