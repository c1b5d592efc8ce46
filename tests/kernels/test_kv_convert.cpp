// kv_convert: the SIMD conversions f32 → bf16/f16 and back equal the scalar reference bit
// for bit at every SIMD level, over lengths that exercise the 16-, 8- and 1-wide tails and
// values that exercise rounding (ties to even), subnormals, overflow, ±0, ±inf and NaN; the
// reference itself is pinned on hand-computed bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/kv_convert.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

// Random values of every magnitude plus the special cases, repeated to length n.
std::vector<float> awkward_values(int64_t n) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special{0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                             1.0f + 1.0f / 256, 1.0f + 3.0f / 256,  // bf16 ties: to 1 and to 1 + 2^-6
                             1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,  // f16 ties
                             65504.0f, 65520.0f, 70000.0f, -1e6f, 3.0e38f,  // f16 max, f16 overflow, near f32 max
                             6.0e-8f, 3.0e-5f, -1.0e-7f, 1.0e-40f, 1.0e-30f};  // f16 subnormals, f32 subnormal
  const std::vector<float> r = test::random_floats(n, 7, -4.0f, 4.0f);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const size_t s = static_cast<size_t>(i) % (special.size() + 3);
    out[i] = s < special.size() ? special[s] : r[i] * std::ldexp(1.0f, static_cast<int>(i % 41) - 20);
  }
  return out;
}

bool same_bits_or_both_nan(uint16_t a, uint16_t b, DType dtype) {
  if (a == b) return true;
  const float fa = dtype == DType::f16 ? f16_to_f32(a) : bf16_to_f32(a);
  const float fb = dtype == DType::f16 ? f16_to_f32(b) : bf16_to_f32(b);
  return std::isnan(fa) && std::isnan(fb);
}

TEST(KvConvert, ReferenceRoundsToNearestEven) {
  uint16_t h[6];
  const float x[6] = {1.0f / 3, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f, 65520.0f, 1.0f + 3.0f / 2048};
  kv_convert_ref(x, DType::bf16, h, 4);
  EXPECT_EQ(h[0], 0x3eab);  // 0x3eaaaaab rounds up
  EXPECT_EQ(h[1], 0x3f80);  // tie → even (1.0)
  EXPECT_EQ(h[2], 0x3f82);  // tie → even (1 + 2^-6)
  EXPECT_EQ(h[3], 0xc020);
  kv_convert_ref(x, DType::f16, h, 6);
  EXPECT_EQ(h[0], 0x3555);
  EXPECT_EQ(h[3], 0xc100);
  EXPECT_EQ(h[4], 0x7c00);  // above the largest f16 half-way: +inf
  EXPECT_EQ(h[5], 0x3c02);  // tie → even
}

TEST(KvConvert, SimdEqualsReferenceBitForBit) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 64, 83, 769, 5125}) {
      const std::vector<float> x = awkward_values(n);
      std::vector<uint16_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      kv_convert_ref(x.data(), dtype, want.data(), n);
      std::vector<float> back_want(static_cast<size_t>(n)), back_got(static_cast<size_t>(n));
      kv_to_f32_ref(want.data(), dtype, back_want.data(), n);
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        std::fill(got.begin(), got.end(), 0xdead);
        kv_convert_cpu(x.data(), dtype, got.data(), n);
        int bad = 0;
        for (int64_t i = 0; i < n && bad < 5; ++i) {
          if (!same_bits_or_both_nan(got[i], want[i], dtype)) {
            ADD_FAILURE() << dtype_name(dtype) << " " << test::level_name(level) << " n " << n << " [" << i << "] "
                          << x[i] << ": got 0x" << std::hex << got[i] << " want 0x" << want[i] << std::dec;
            ++bad;
          }
        }
        std::fill(back_got.begin(), back_got.end(), -7.0f);
        kv_to_f32_cpu(want.data(), dtype, back_got.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const bool ok = std::memcmp(&back_got[i], &back_want[i], 4) == 0 ||
                          (std::isnan(back_got[i]) && std::isnan(back_want[i]));
          if (!ok) {
            ADD_FAILURE() << dtype_name(dtype) << " " << test::level_name(level) << " back n " << n << " [" << i
                          << "] got " << back_got[i] << " want " << back_want[i];
            break;
          }
        }
      }
    }
  }
}

TEST(KvConvert, RoundTripErrorIsHalfAnUlp) {
  // Half an ulp: |x − round(x)| ≤ 2^-8 |x| for bf16 (8 significant bits), 2^-11 |x| for f16 (11,
  // normal range); truncation instead of rounding errs by up to a whole ulp and fails.
  const std::vector<float> x = test::random_floats(4096, 11, -300.0f, 300.0f);
  for (DType dtype : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> h(x.size());
    std::vector<float> back(x.size());
    kv_convert_cpu(x.data(), dtype, h.data(), static_cast<int64_t>(x.size()));
    kv_to_f32_cpu(h.data(), dtype, back.data(), static_cast<int64_t>(x.size()));
    const double rel = dtype == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::fabs(x[i]) < 1e-3f) continue;
      ASSERT_LE(std::fabs(double{back[i]} - x[i]), rel * std::fabs(x[i])) << dtype_name(dtype) << " " << x[i];
    }
  }
}

TEST(KvConvert, F32IsACopy) {
  const std::vector<float> x = awkward_values(83);
  std::vector<float> y(x.size()), z(x.size());
  kv_convert_cpu(x.data(), DType::f32, y.data(), 83);
  kv_to_f32_cpu(y.data(), DType::f32, z.data(), 83);
  EXPECT_EQ(std::memcmp(x.data(), z.data(), x.size() * 4), 0);
}

}  // namespace
}  // namespace snap::kernels
