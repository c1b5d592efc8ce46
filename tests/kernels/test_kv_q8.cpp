// q8_0 KV rows (kernels/kv_convert.h, kernels/cpu/kv_q8.cpp): the byte layout and rounding
// pinned on hand-computed rows, the SIMD quantize/dequantize equal to the scalar reference
// bit for bit at every SIMD level over awkward head_dims (8 … 256, with a short last group
// for 80 and 40), non-finite groups read back NaN without touching their neighbours, and the
// round-trip error within the q8_0 bound (half a step plus the f16 rounding of the scale).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/kv_convert.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

uint16_t scale_bits(const std::vector<uint8_t>& row, int64_t hd, int64_t group) {
  uint16_t d;
  std::memcpy(&d, row.data() + hd + 2 * group, 2);
  return d;
}

TEST(KvQ8, RowBytes) {
  EXPECT_EQ(kv_row_bytes(DType::q8_0, 64), 68);
  EXPECT_EQ(kv_row_bytes(DType::q8_0, 80), 86);  // groups of 32, 32, 16
  EXPECT_EQ(kv_row_bytes(DType::q8_0, 128), 136);
  EXPECT_EQ(kv_row_bytes(DType::q8_0, 36), 40);
  EXPECT_EQ(kv_row_bytes(DType::f32, 64), 256);
  EXPECT_EQ(kv_row_bytes(DType::bf16, 64), 128);
  EXPECT_FALSE(kv_dtype_supported(DType::q4_0));
}

TEST(KvQ8, ReferencePinnedOnHandComputedRow) {
  // Group 0: amax 127 → d = 1 (f16 0x3c00), values round to nearest even: 2.5 → 2, 3.5 → 4,
  // −0.5 → −0. Group 1 (8 values): amax 2 → d = 2/127, q = round(x · 63.5).
  const int64_t hd = 40;
  std::vector<float> x(hd, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -0.5f;
  x[4] = -127.0f;
  x[5] = 1.49f;
  x[32] = 2.0f;
  x[33] = -1.0f;
  x[34] = 0.01f;
  std::vector<uint8_t> row(static_cast<size_t>(kv_row_bytes(DType::q8_0, hd)), 0xee);
  kv_convert_ref(x.data(), DType::q8_0, row.data(), hd);
  const auto* q = reinterpret_cast<const int8_t*>(row.data());
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], 4);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(q[4], -127);
  EXPECT_EQ(q[5], 1);
  EXPECT_EQ(q[6], 0);
  EXPECT_EQ(scale_bits(row, hd, 0), 0x3c00);
  EXPECT_EQ(q[32], 127);
  EXPECT_EQ(q[33], -64);  // −63.5 → −64 (even)
  EXPECT_EQ(q[34], 1);    // 0.635 → 1
  EXPECT_EQ(scale_bits(row, hd, 1), f32_to_f16(2.0f / 127.0f));
  std::vector<float> back(hd);
  kv_to_f32_ref(row.data(), DType::q8_0, back.data(), hd);
  EXPECT_EQ(back[0], 127.0f);
  EXPECT_EQ(back[2], 4.0f);
  EXPECT_EQ(back[33], f16_to_f32(f32_to_f16(2.0f / 127.0f)) * -64.0f);
  // An all-zero group stores d = 0 and reads back zeros.
  std::vector<float> zeros(hd, 0.0f);
  kv_convert_ref(zeros.data(), DType::q8_0, row.data(), hd);
  kv_to_f32_ref(row.data(), DType::q8_0, back.data(), hd);
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

TEST(KvQ8, NonFiniteGroupReadsNanAndLeavesOthersAlone) {
  const int64_t hd = 64;
  const float special[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  for (float bad : special) {
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      std::vector<float> x = test::random_floats(hd, 5, -3.0f, 3.0f);
      x[40] = bad;
      std::vector<uint8_t> row(static_cast<size_t>(kv_row_bytes(DType::q8_0, hd)));
      kv_convert_cpu(x.data(), DType::q8_0, row.data(), hd);
      std::vector<float> back(hd);
      kv_to_f32_cpu(row.data(), DType::q8_0, back.data(), hd);
      for (int64_t i = 0; i < 32; ++i) EXPECT_LE(std::fabs(back[i] - x[i]), 3.0f / 127) << i;
      for (int64_t i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(back[i])) << test::level_name(level) << " " << i;
    }
  }
}

TEST(KvQ8, SimdEqualsReferenceBitForBit) {
  for (int64_t hd : {8, 16, 24, 32, 40, 64, 80, 96, 128, 256}) {
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      std::vector<float> x = test::random_floats(hd, seed, -1.0f, 1.0f);
      // Magnitudes from 2^-20 to 2^20 across rows, an exact tie in some, a zero group in one.
      const float mag = std::ldexp(1.0f, static_cast<int>(seed * 2) - 20);
      for (float& v : x) v *= mag;
      if (seed % 3 == 0) x[0] = mag, x[1] = mag * 0.5f / 127.0f * 3.0f;
      if (seed == 7) std::fill(x.begin(), x.begin() + std::min<int64_t>(hd, 32), 0.0f);
      const int64_t rb = kv_row_bytes(DType::q8_0, hd);
      std::vector<uint8_t> want(static_cast<size_t>(rb)), got(static_cast<size_t>(rb));
      kv_convert_ref(x.data(), DType::q8_0, want.data(), hd);
      std::vector<float> back_want(hd), back_got(hd);
      kv_to_f32_ref(want.data(), DType::q8_0, back_want.data(), hd);
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        std::fill(got.begin(), got.end(), 0xee);
        kv_convert_cpu(x.data(), DType::q8_0, got.data(), hd);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), static_cast<size_t>(rb)), 0)
            << test::level_name(level) << " head_dim " << hd << " seed " << seed;
        std::fill(back_got.begin(), back_got.end(), -7.0f);
        kv_to_f32_cpu(want.data(), DType::q8_0, back_got.data(), hd);
        EXPECT_EQ(std::memcmp(back_got.data(), back_want.data(), static_cast<size_t>(hd) * 4), 0)
            << test::level_name(level) << " back head_dim " << hd << " seed " << seed;
      }
    }
  }
}

TEST(KvQ8, RoundTripErrorWithinHalfAStepPlusScaleRounding) {
  // |x − d16·q| ≤ d/2 + 127·|d − d16| ≤ amax·(1/254 + 2^-11) per group; a truncating
  // quantizer errs by up to a whole step (amax/127) and fails.
  const int64_t hd = 80;
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    const std::vector<float> x = test::random_floats(hd, 100 + seed, -5.0f, 5.0f);
    std::vector<uint8_t> row(static_cast<size_t>(kv_row_bytes(DType::q8_0, hd)));
    std::vector<float> back(hd);
    kv_convert_cpu(x.data(), DType::q8_0, row.data(), hd);
    kv_to_f32_cpu(row.data(), DType::q8_0, back.data(), hd);
    for (int64_t g = 0; g * 32 < hd; ++g) {
      float amax = 0.0f;
      for (int64_t i = g * 32; i < std::min<int64_t>(hd, g * 32 + 32); ++i) amax = std::max(amax, std::fabs(x[i]));
      const double bound = amax * (1.0 / 254 + 1.0 / 2048) * 1.0001;
      for (int64_t i = g * 32; i < std::min<int64_t>(hd, g * 32 + 32); ++i)
        ASSERT_LE(std::fabs(double{back[i]} - x[i]), bound) << "seed " << seed << " [" << i << "]";
    }
  }
}

}  // namespace
}  // namespace snap::kernels
