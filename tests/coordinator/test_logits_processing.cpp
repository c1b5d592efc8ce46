// Logits processing: the fast pass equals the whole-vocabulary reference bit for bit on
// random rows and histories; each field does what OpenAI/vLLM say (worked by hand); and
// token_logprobs is a log-softmax with the k largest, ties to the lower id.
#include "coordinator/scheduler/logits_processing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace snap {
namespace {

TEST(LogitsProcessing, FastEqualsReferenceOnRandomRows) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t vocab = 997;
  const std::vector<int32_t> eos = {2, 990};
  for (int trial = 0; trial < 200; ++trial) {
    EngineRequest r;
    r.presence_penalty = trial % 3 ? std::uniform_real_distribution<float>(-2, 2)(rng) : 0.0f;
    r.frequency_penalty = trial % 5 ? std::uniform_real_distribution<float>(-2, 2)(rng) : 0.0f;
    r.repetition_penalty = trial % 2 ? std::uniform_real_distribution<float>(0.5f, 2.0f)(rng) : 1.0f;
    r.min_tokens = trial % 4;
    r.ignore_eos = trial % 7 == 0;
    for (int i = 0; i < trial % 6; ++i) r.logit_bias.emplace_back(rng() % vocab, std::uniform_real_distribution<float>(-100, 100)(rng));
    if (trial % 3 == 0) r.logit_bias.emplace_back(5, 1.5f), r.logit_bias.emplace_back(5, -0.25f);  // repeated id
    for (int i = 0; i < trial % 3; ++i) r.stop_token_ids.push_back(rng() % vocab);
    TokenHistory h;
    for (int i = 0; i < 40; ++i) h.prompt_unique.push_back(rng() % vocab);
    std::sort(h.prompt_unique.begin(), h.prompt_unique.end());
    h.prompt_unique.erase(std::unique(h.prompt_unique.begin(), h.prompt_unique.end()), h.prompt_unique.end());
    for (int i = 0; i < 30; ++i) ++h.output_counts[rng() % 60];  // overlaps the prompt's low ids
    std::vector<float> a(vocab);
    for (auto& x : a) x = normal(rng);
    std::vector<float> b = a;
    const int64_t generated = trial % 5;
    apply_logits_processing(a.data(), vocab, r, h, generated, eos);
    apply_logits_processing_ref(b.data(), vocab, r, h, generated, eos);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), vocab * sizeof(float))) << "trial " << trial;
  }
}

TEST(LogitsProcessing, EachFieldByHand) {
  const int64_t vocab = 8;
  const std::vector<int32_t> eos = {7};
  const std::vector<float> base = {1.0f, -1.0f, 2.0f, 0.5f, -0.5f, 3.0f, 0.0f, 4.0f};
  TokenHistory h;
  h.prompt_unique = {1, 2};
  h.output_counts = {{2, 3}, {3, 1}};

  EngineRequest none;
  EXPECT_FALSE(logits_processing_active(none));

  EngineRequest rep;
  rep.repetition_penalty = 2.0f;  // tokens 1, 2 (prompt) and 3 (output): positive / 2, negative * 2
  std::vector<float> x = base;
  apply_logits_processing(x.data(), vocab, rep, h, 5, eos);
  EXPECT_EQ(x, (std::vector<float>{1.0f, -2.0f, 1.0f, 0.25f, -0.5f, 3.0f, 0.0f, 4.0f}));

  EngineRequest pen;
  pen.frequency_penalty = 0.5f;  // output only: 2 appeared 3 times, 3 once
  pen.presence_penalty = 0.25f;
  x = base;
  apply_logits_processing(x.data(), vocab, pen, h, 5, eos);
  EXPECT_EQ(x, (std::vector<float>{1.0f, -1.0f, 2.0f - 1.5f - 0.25f, 0.5f - 0.5f - 0.25f, -0.5f, 3.0f, 0.0f, 4.0f}));

  EngineRequest bias;
  bias.logit_bias = {{0, -100.0f}, {6, 10.0f}};
  x = base;
  apply_logits_processing(x.data(), vocab, bias, h, 5, eos);
  EXPECT_EQ(x[0], -99.0f);
  EXPECT_EQ(x[6], 10.0f);

  EngineRequest min;
  min.min_tokens = 3;
  min.stop_token_ids = {5};
  x = base;
  apply_logits_processing(x.data(), vocab, min, h, 2, eos);  // 2 < 3: EOS and stop ids masked
  EXPECT_EQ(x[7], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(x[5], -std::numeric_limits<float>::infinity());
  x = base;
  apply_logits_processing(x.data(), vocab, min, h, 3, eos);  // reached: nothing masked
  EXPECT_EQ(x, base);
  min.ignore_eos = true;  // EOS is not a stop then, so not masked; stop_token_ids still are
  x = base;
  apply_logits_processing(x.data(), vocab, min, h, 0, eos);
  EXPECT_EQ(x[7], 4.0f);
  EXPECT_EQ(x[5], -std::numeric_limits<float>::infinity());
}

TEST(LogitsProcessing, TokenLogprobsIsALogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  double z = 0;
  for (float v : logits) z += std::exp(static_cast<double>(v));
  const TokenLogprobs lp = token_logprobs(logits.data(), 5, 4, 3);
  EXPECT_NEAR(lp.logprob, 0.5 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // a tie: the lower id first
  EXPECT_EQ(lp.top[1].first, 2);
  EXPECT_EQ(lp.top[2].first, 0);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  double mass = 0;
  for (int i = 0; i < 5; ++i) mass += std::exp(token_logprobs(logits.data(), 5, i, 0).logprob);
  EXPECT_NEAR(mass, 1.0, 1e-6);
  EXPECT_TRUE(token_logprobs(logits.data(), 5, 0, 0).top.empty());
  EXPECT_EQ(token_logprobs(logits.data(), 5, 0, 20).top.size(), 5u);  // k past the vocabulary
}

}  // namespace
}  // namespace snap
