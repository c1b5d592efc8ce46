// swiglu: the vector-exp fast path at every SIMD level against the f64 std::exp reference,
// elementwise within 2e-6 relative; in place (out aliasing gate); NaN propagation.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

// exp ≈ 2 ulp, then a divide and a multiply (0.5 ulp each): ≲ 4e-7 relative; 2e-6 is the
// "~1e-6 relative" promise with headroom. The absolute floor covers silu(g ≪ 0) ≈ 0.
::testing::AssertionResult close_relative(const std::vector<float>& got, const std::vector<float>& want) {
  int bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(got[i]) || std::isnan(want[i]) || !(err <= 2e-6 * std::fabs(want[i]) + 1e-30)) {
      if (bad < 5) first << "\n  [" << i << "] got " << got[i] << " want " << want[i];
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " mismatches; first:" << first.str();
}

TEST(Swiglu, CpuMatchesReferenceWithin2e6Relative) {
  for (int64_t n : {1, 7, 83, 769, 1536, 5125, 100003}) {
    const std::vector<float> gate = test::random_floats(n, 1, -30.0f, 30.0f);
    const std::vector<float> up = test::random_floats(n, 2, -2.0f, 2.0f);
    std::vector<float> want(static_cast<size_t>(n));
    swiglu_ref(gate.data(), up.data(), want.data(), n);
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      std::vector<float> got(want.size());
      swiglu_cpu(gate.data(), up.data(), got.data(), n);
      EXPECT_TRUE(close_relative(got, want)) << test::level_name(level) << " n " << n;
      std::vector<float> inplace = gate;
      swiglu_cpu(inplace.data(), up.data(), inplace.data(), n);
      EXPECT_TRUE(close_relative(inplace, want)) << "in place, " << test::level_name(level) << " n " << n;
    }
  }
}

TEST(Swiglu, ReferenceMatchesSiluDefinition) {
  const float gate[3] = {0.0f, 1.0f, -2.0f};
  const float up[3] = {5.0f, 2.0f, 3.0f};
  float out[3];
  swiglu_ref(gate, up, out, 3);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 2.0 / (1.0 + std::exp(-1.0)), 1e-7);
  EXPECT_NEAR(out[2], 3.0 * -2.0 / (1.0 + std::exp(2.0)), 1e-7);
}

TEST(Swiglu, NanPropagates) {
  for (SimdLevel level : test::supported_levels()) {
    test::LevelGuard guard(level);
    std::vector<float> gate = test::random_floats(40, 3), up = test::random_floats(40, 4);
    gate[3] = NAN;
    up[17] = NAN;
    std::vector<float> out(40);
    swiglu_cpu(gate.data(), up.data(), out.data(), 40);
    for (int i = 0; i < 40; ++i) EXPECT_EQ(std::isnan(out[i]), i == 3 || i == 17) << test::level_name(level) << " " << i;
  }
}

}  // namespace
}  // namespace snap::kernels
