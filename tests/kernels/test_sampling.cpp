// sampling: Rng against an independent Python xoshiro256** (tools/gen_kernel_vectors.py);
// seeded determinism; greedy ties; top_k=1 and tiny top_p equal greedy; sample_cpu returns
// exactly sample_ref's token for the same Rng state over a table of parameters; filters
// keep only what they should; a fixed-seed chi-square test of the temperature-1 distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kernels/kernels.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

// xoshiro256** seeded by splitmix64(0)
const uint64_t k_xoshiro_seed0[4] = {0x99ec5f36cb75f2b4ull, 0xbf6e1f784956452aull, 0x1a5f849d4933e6e0ull, 0x6aa594f1262d2d2cull};
// xoshiro256** seeded by splitmix64(42)
const uint64_t k_xoshiro_seed42[4] = {0x15780b2e0c2ec716ull, 0x6104d9866d113a7eull, 0xae17533239e499a1ull, 0xecb8ad4703b360a1ull};

TEST(Sampling, RngMatchesIndependentImplementation) {
  Rng a(0), b(42);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a.next_u64(), k_xoshiro_seed0[i]) << i;
    EXPECT_EQ(b.next_u64(), k_xoshiro_seed42[i]) << i;
  }
  Rng c(7);
  for (int i = 0; i < 100000; ++i) {
    const float u = c.next_unit();
    ASSERT_TRUE(u >= 0.0f && u < 1.0f) << u;
  }
}

TEST(Sampling, GreedyTakesLowestIdOnTies) {
  std::vector<float> logits = test::random_floats(100, 1);
  logits[42] = 5.0f;
  logits[17] = 5.0f;
  logits[90] = 5.0f;
  Rng rng(1);
  SamplingParams p;  // temperature 0
  EXPECT_EQ(sample_ref(logits.data(), 100, p, rng), 17);
  EXPECT_EQ(sample_cpu(logits.data(), 100, p, rng), 17);
  logits[3] = NAN;  // NaN never wins
  EXPECT_EQ(sample_cpu(logits.data(), 100, p, rng), 17);
}

TEST(Sampling, TopK1AndTinyTopPEqualGreedy) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> logits = test::random_floats(5125, seed, -5.0f, 5.0f);
    Rng g(seed);
    const int32_t greedy = sample_cpu(logits.data(), 5125, SamplingParams{}, g);
    SamplingParams k1{1.5f, 1, 1.0f, 0.0f, 0};
    SamplingParams p0{1.5f, 0, 1e-6f, 0.0f, 0};
    Rng r1(seed), r2(seed), r3(seed), r4(seed);
    EXPECT_EQ(sample_ref(logits.data(), 5125, k1, r1), greedy);
    EXPECT_EQ(sample_cpu(logits.data(), 5125, k1, r2), greedy);
    EXPECT_EQ(sample_ref(logits.data(), 5125, p0, r3), greedy);
    EXPECT_EQ(sample_cpu(logits.data(), 5125, p0, r4), greedy);
  }
}

TEST(Sampling, CpuReturnsReferenceTokenForSameRngState) {
  int checked = 0;
  for (int64_t vocab : {7, 83, 5125, 49152, 128256}) {
    std::vector<float> logits = test::random_floats(vocab, static_cast<uint32_t>(vocab), -8.0f, 8.0f);
    for (int64_t i = 0; i < vocab; i += 5) logits[i] = std::round(logits[i]);  // ties in the order
    for (int64_t i = 3; i < vocab; i += 11) logits[i] = -INFINITY;  // masked (logit_bias -100, grammar)
    for (int64_t i = 4; i < vocab; i += 13) logits[i] = NAN;        // counts as -inf
    for (float temperature : {0.5f, 1.0f, 2.0f}) {
      for (int top_k : {0, 1, 5, 50, 100000}) {
        for (float top_p : {1.0f, 0.95f, 0.5f, 1e-6f}) {
          for (float min_p : {0.0f, 0.05f, 0.5f}) {
            const SamplingParams p{temperature, top_k, top_p, min_p, 0};
            Rng a(vocab + top_k), b(vocab + top_k);
            const int draws = vocab >= 100000 ? 1 : vocab >= 5125 ? 2 : 8;  // the reference sorts the vocab per draw
            for (int draw = 0; draw < draws; ++draw) {
              const int32_t want = sample_ref(logits.data(), vocab, p, a);
              const int32_t got = sample_cpu(logits.data(), vocab, p, b);
              ASSERT_EQ(got, want) << "vocab " << vocab << " T " << temperature << " top_k " << top_k << " top_p "
                                   << top_p << " min_p " << min_p << " draw " << draw;
              ASSERT_TRUE(want >= 0 && want < vocab);
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 3000);
  // Every logit -inf or NaN: the argmax (id 0), from both.
  std::vector<float> none(300, -INFINITY);
  none[7] = NAN;
  for (const SamplingParams& p : {SamplingParams{1.0f, 0, 1.0f, 0.0f, 0}, SamplingParams{1.0f, 5, 0.9f, 0.1f, 0}}) {
    Rng a(1), b(1);
    EXPECT_EQ(sample_cpu(none.data(), 300, p, b), sample_ref(none.data(), 300, p, a));
  }
}

TEST(Sampling, SameSeedSameSequenceDifferentSeedDiffers) {
  const std::vector<float> logits = test::random_floats(1000, 3, -2.0f, 2.0f);
  const SamplingParams p{1.0f, 0, 1.0f, 0.0f, 0};
  std::vector<int32_t> s1, s2, s3;
  Rng a(123), b(123), c(124);
  for (int i = 0; i < 50; ++i) {
    s1.push_back(sample_cpu(logits.data(), 1000, p, a));
    s2.push_back(sample_cpu(logits.data(), 1000, p, b));
    s3.push_back(sample_cpu(logits.data(), 1000, p, c));
  }
  EXPECT_EQ(s1, s2);
  EXPECT_NE(s1, s3);
}

TEST(Sampling, FiltersKeepOnlyWhatTheyShould) {
  // p = [0.5, 0.3, 0.2] at temperature 1.
  const float logits[3] = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  const auto seen = [&](SamplingParams p) {
    std::set<int32_t> s;
    Rng rng(9);
    for (int i = 0; i < 2000; ++i) s.insert(sample_cpu(logits, 3, p, rng));
    return s;
  };
  EXPECT_EQ(seen({1.0f, 0, 1.0f, 0.0f, 0}), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(seen({1.0f, 2, 1.0f, 0.0f, 0}), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(seen({1.0f, 0, 0.7f, 0.0f, 0}), (std::set<int32_t>{0, 1}));   // 0.5 < 0.7 ≤ 0.8
  EXPECT_EQ(seen({1.0f, 0, 0.5f, 0.0f, 0}), (std::set<int32_t>{0}));      // 0.5 ≥ 0.5
  EXPECT_EQ(seen({1.0f, 0, 1.0f, 0.5f, 0}), (std::set<int32_t>{0, 1}));   // keep p ≥ 0.25
  EXPECT_EQ(seen({1.0f, 0, 1.0f, 0.7f, 0}), (std::set<int32_t>{0}));      // keep p ≥ 0.35
}

TEST(Sampling, Temperature1DistributionPassesChiSquare) {
  // Fixed seed, so deterministic: the statistic is compared with the 99.99% quantile of
  // chi-square with 5 degrees of freedom (25.74); a wrong softmax or an off-by-one in the
  // inverse CDF moves it into the thousands at 200K draws.
  const double probs[6] = {0.05, 0.1, 0.15, 0.2, 0.25, 0.25};
  float logits[6];
  for (int i = 0; i < 6; ++i) logits[i] = static_cast<float>(std::log(probs[i])) + 3.0f;
  const int n = 200000;
  int counts[6] = {0};
  Rng rng(2024);
  const SamplingParams p{1.0f, 0, 1.0f, 0.0f, 0};
  for (int i = 0; i < n; ++i) ++counts[sample_cpu(logits, 6, p, rng)];
  double chi2 = 0.0;
  for (int i = 0; i < 6; ++i) {
    const double expected = n * probs[i];
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  EXPECT_LT(chi2, 25.74);
  // Temperature 2 flattens: token 0's share must rise toward sqrt-weighted 0.05^0.5/Σ.
  double z = 0.0;
  for (double q : probs) z += std::sqrt(q);
  int hot = 0;
  const SamplingParams p2{2.0f, 0, 1.0f, 0.0f, 0};
  for (int i = 0; i < n; ++i) hot += sample_cpu(logits, 6, p2, rng) == 0;
  EXPECT_NEAR(static_cast<double>(hot) / n, std::sqrt(0.05) / z, 0.005);
}

}  // namespace
}  // namespace snap::kernels
