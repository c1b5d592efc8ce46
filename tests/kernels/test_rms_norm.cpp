// rms_norm: fast path at every SIMD level against the f64 reference over awkward shapes,
// in place (y aliasing x), a hand-checked value, and NaN propagation to its own token only.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

// f32 sum of squares in 16 lanes: relative error ≲ (n/16)·6e-8 ≈ 2e-5 worst case at n 5125,
// ~1e-7 typical; the rsqrt and products add 2 ulp. Outputs are ~|x|·|w| ≤ 3, so 1e-5
// normalized is loose for the typical case and still catches a wrong element (≥ 1e-2).
constexpr double k_tol = 1e-5;

TEST(RmsNorm, CpuMatchesReferenceOnAwkwardShapes) {
  for (int64_t hidden : {7, 16, 83, 576, 769, 5125}) {
    for (int64_t num_tokens : {1, 3, 17, 128}) {
      const std::vector<float> x = test::random_floats(num_tokens * hidden, 1, -3.0f, 3.0f);
      const std::vector<float> w = test::random_floats(hidden, 2, 0.5f, 1.5f);
      std::vector<float> want(x.size());
      rms_norm_ref(x.data(), w.data(), want.data(), num_tokens, hidden, 1e-5f);
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        std::vector<float> got(x.size());
        rms_norm_cpu(x.data(), w.data(), got.data(), num_tokens, hidden, 1e-5f);
        EXPECT_TRUE(test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), k_tol))
            << test::level_name(level) << " hidden " << hidden << " tokens " << num_tokens;
        std::vector<float> inplace = x;
        rms_norm_cpu(inplace.data(), w.data(), inplace.data(), num_tokens, hidden, 1e-5f);
        EXPECT_TRUE(test::all_close(inplace.data(), want.data(), static_cast<int64_t>(got.size()), k_tol))
            << "in place, " << test::level_name(level) << " hidden " << hidden;
      }
    }
  }
}

TEST(RmsNorm, ReferenceMatchesHandComputedValue) {
  const float x[4] = {1, -2, 3, -4};  // mean square 7.5
  const float w[4] = {1, 1, 2, 0.5f};
  float y[4];
  rms_norm_ref(x, w, y, 1, 4, 0.0f);
  const float inv = 1.0f / std::sqrt(7.5f);
  EXPECT_NEAR(y[0], inv, 1e-6);
  EXPECT_NEAR(y[1], -2 * inv, 1e-6);
  EXPECT_NEAR(y[2], 6 * inv, 1e-6);
  EXPECT_NEAR(y[3], -2 * inv, 1e-6);
}

TEST(RmsNorm, NanPropagatesToItsTokenOnly) {
  const int64_t hidden = 83, num_tokens = 3;
  std::vector<float> x = test::random_floats(num_tokens * hidden, 4);
  const std::vector<float> w(hidden, 1.0f);
  x[hidden + 5] = NAN;  // token 1
  for (SimdLevel level : test::supported_levels()) {
    test::LevelGuard guard(level);
    std::vector<float> y(x.size());
    rms_norm_cpu(x.data(), w.data(), y.data(), num_tokens, hidden, 1e-6f);
    for (int64_t i = 0; i < hidden; ++i) {
      EXPECT_FALSE(std::isnan(y[i])) << test::level_name(level) << " token 0 index " << i;
      EXPECT_TRUE(std::isnan(y[hidden + i])) << test::level_name(level) << " token 1 index " << i;
      EXPECT_FALSE(std::isnan(y[2 * hidden + i])) << test::level_name(level) << " token 2 index " << i;
    }
  }
}

}  // namespace
}  // namespace snap::kernels
