// rope: inv_freq against Hugging Face's own rope init (table below, produced by
// tools/gen_kernel_vectors.py) for llama3 and linear scaling and against the closed form
// for none; rope_cpu against rope_ref at every SIMD level; position 0 is the identity;
// rotation preserves each pair's norm; NaN propagates.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

// From python3 tools/gen_kernel_vectors.py (transformers 5.24 ROPE_INIT_FUNCTIONS).
// llama3: theta 500000, head_dim 128, factor 8, low 1, high 4, original_max 8192
const float k_hf_llama3_inv_freq[64] = {1.0f, 0.814617217f, 0.663601279f, 0.540580988f, 0.440366626f, 0.358730227f, 0.292227834f, 0.238053814f, 0.193922758f, 0.157972813f, 0.128687382f, 0.10483095f, 0.0853971019f, 0.0695659518f, 0.0566696189f, 0.0461640507f, 0.0376060307f, 0.0306345206f, 0.0249554086f, 0.0203291047f, 0.0165604409f, 0.0134904198f, 0.0109895291f, 0.00895225909f, 0.00729266508f, 0.00594073068f, 0.00483942125f, 0.00394227589f, 0.00321144611f, 0.00216657063f, 0.00137189368f, 0.00085675146f, 0.000524846022f, 0.00031269365f, 0.000178507791f, 9.55621217e-05f, 7.78465546e-05f, 6.34151438e-05f, 5.16590699e-05f, 4.20823671e-05f, 3.42810235e-05f, 2.79259093e-05f, 2.2748929e-05f, 1.85316694e-05f, 1.50962178e-05f, 1.22976389e-05f, 1.00178686e-05f, 8.1607277e-06f, 6.64786967e-06f, 5.41546933e-06f, 4.41153452e-06f, 3.59371188e-06f, 2.92749974e-06f, 2.38479174e-06f, 1.94269251e-06f, 1.58255079e-06f, 1.28917316e-06f, 1.05018262e-06f, 8.55496921e-07f, 6.96902532e-07f, 5.6770881e-07f, 4.6246538e-07f, 3.7673226e-07f, 3.06892588e-07f};
// linear: theta 10000, head_dim 64, factor 4
const float k_hf_linear_inv_freq[32] = {0.25f, 0.18747355f, 0.140585333f, 0.105424128f, 0.079056941f, 0.0592843406f, 0.0444569848f, 0.0333380364f, 0.0250000004f, 0.0187473539f, 0.0140585322f, 0.0105424123f, 0.00790569466f, 0.00592843397f, 0.00444569858f, 0.00333380373f, 0.00249999994f, 0.00187473558f, 0.00140585331f, 0.00105424121f, 0.000790569466f, 0.000592843455f, 0.000444569858f, 0.000333380362f, 0.000250000012f, 0.000187473546f, 0.000140585325f, 0.000105424122f, 7.90569466e-05f, 5.92843462e-05f, 4.44569851e-05f, 3.33380376e-05f};

::testing::AssertionResult close_rel(const std::vector<float>& got, const float* want, size_t n, double tol) {
  if (got.size() != n) return ::testing::AssertionFailure() << "size " << got.size() << " want " << n;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) || !(std::fabs(got[i] - want[i]) <= tol * std::fabs(want[i])))
      return ::testing::AssertionFailure() << "[" << i << "] got " << got[i] << " want " << want[i];
  }
  return ::testing::AssertionSuccess();
}

TEST(Rope, InvFreqNoneIsThetaPower) {
  RopeConfig cfg;
  cfg.theta = 10000.0f;
  cfg.head_dim = 64;
  const std::vector<float> inv = rope_inv_freq(cfg);
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(inv[i], std::exp(-std::log(10000.0) * (2.0 * i) / 64.0), 1e-6 * inv[i]);
}

// HF computes the base frequencies in f32 (theta ** (arange/dim)); ours in f64 then rounded,
// so the two may differ by an ulp or two: 1e-6 relative.
TEST(Rope, InvFreqLlama3MatchesHuggingFace) {
  RopeConfig cfg;
  cfg.theta = 500000.0f;
  cfg.head_dim = 128;
  cfg.scaling = RopeScaling::llama3;
  cfg.factor = 8.0f;
  cfg.low_freq_factor = 1.0f;
  cfg.high_freq_factor = 4.0f;
  cfg.original_max_position = 8192;
  EXPECT_TRUE(close_rel(rope_inv_freq(cfg), k_hf_llama3_inv_freq, 64, 1e-6));
}

TEST(Rope, InvFreqLinearMatchesHuggingFace) {
  RopeConfig cfg;
  cfg.theta = 10000.0f;
  cfg.head_dim = 64;
  cfg.scaling = RopeScaling::linear;
  cfg.factor = 4.0f;
  EXPECT_TRUE(close_rel(rope_inv_freq(cfg), k_hf_linear_inv_freq, 32, 1e-6));
}

// Both paths form the angle in f64; the fast one rounds cos/sin to f32 (≤ 6e-8) before
// rotating: |error| ≲ 2e-7·|x|. 1e-6 normalized.
TEST(Rope, CpuMatchesReference) {
  for (int head_dim : {64, 128}) {
    RopeConfig cfg;
    cfg.head_dim = head_dim;
    const std::vector<float> inv = rope_inv_freq(cfg);
    for (int num_heads : {1, 3, 9}) {
      for (int64_t num_tokens : {1, 3, 17, 128}) {
        std::vector<int32_t> pos(static_cast<size_t>(num_tokens));
        for (int64_t t = 0; t < num_tokens; ++t) pos[t] = static_cast<int32_t>((t * 7919) % 131072);
        const std::vector<float> x = test::random_floats(num_tokens * num_heads * head_dim, 5, -2.0f, 2.0f);
        std::vector<float> want = x;
        rope_ref(want.data(), pos.data(), num_tokens, num_heads, head_dim, inv.data());
        for (SimdLevel level : test::supported_levels()) {
          test::LevelGuard guard(level);
          std::vector<float> got = x;
          rope_cpu(got.data(), pos.data(), num_tokens, num_heads, head_dim, inv.data());
          EXPECT_TRUE(test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-6))
              << test::level_name(level) << " head_dim " << head_dim << " heads " << num_heads << " tokens "
              << num_tokens;
        }
      }
    }
  }
}

TEST(Rope, PositionZeroIsIdentityAndRotationKeepsPairNorms) {
  RopeConfig cfg;
  const std::vector<float> inv = rope_inv_freq(cfg);
  const std::vector<float> x = test::random_floats(2 * 64, 6);
  std::vector<float> y = x;
  const int32_t pos[2] = {0, 1234};
  rope_cpu(y.data(), pos, 2, 1, 64, inv.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(y[i], x[i]) << i;
  for (int i = 0; i < 32; ++i) {
    const float* a = x.data() + 64;
    const float* b = y.data() + 64;
    EXPECT_NEAR(std::hypot(b[i], b[i + 32]), std::hypot(a[i], a[i + 32]), 1e-6) << i;
  }
  // Pair 0 rotates by 1234 rad exactly: check one pair against cos/sin directly.
  const double c = std::cos(1234.0), s = std::sin(1234.0);
  EXPECT_NEAR(y[64], x[64] * c - x[96] * s, 1e-6);
  EXPECT_NEAR(y[96], x[96] * c + x[64] * s, 1e-6);
}

TEST(Rope, NanPropagatesWithinItsPair) {
  RopeConfig cfg;
  const std::vector<float> inv = rope_inv_freq(cfg);
  for (SimdLevel level : test::supported_levels()) {
    test::LevelGuard guard(level);
    std::vector<float> x = test::random_floats(64, 7);
    x[3] = NAN;
    const int32_t pos = 17;
    rope_cpu(x.data(), &pos, 1, 1, 64, inv.data());
    for (int i = 0; i < 64; ++i) EXPECT_EQ(std::isnan(x[i]), i == 3 || i == 35) << test::level_name(level) << " " << i;
  }
}

}  // namespace
}  // namespace snap::kernels
