// matmul_rowwise_cpu: a row's result does not depend on the other rows of the call (the
// property continuous batching relies on), for every weight format, at every SIMD level.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace snap::kernels {
namespace {

// Random weights of `rows` x `cols` in `dtype` (block formats get finite f16 scales).
std::vector<uint8_t> random_weights(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * dtype_row_bytes(dtype, cols)));
  if (dtype == DType::f32) {
    for (size_t i = 0; i < bytes.size() / 4; ++i) {
      const float v = u(rng);
      std::memcpy(&bytes[i * 4], &v, 4);
    }
    return bytes;
  }
  if (dtype == DType::f16 || dtype == DType::bf16) {
    for (size_t i = 0; i < bytes.size() / 2; ++i) {
      const uint16_t h = dtype == DType::f16 ? f32_to_f16(u(rng)) : f32_to_bf16(u(rng));
      std::memcpy(&bytes[i * 2], &h, 2);
    }
    return bytes;
  }
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  // Every block starts with an f16 scale d (q4_1: then an f16 min m): make them finite.
  const int64_t block_bytes = dtype_block_bytes(dtype);
  for (size_t off = 0; off + block_bytes <= bytes.size(); off += block_bytes) {
    const uint16_t d = f32_to_f16(0.01f + 0.02f * std::fabs(u(rng)));
    std::memcpy(&bytes[off], &d, 2);
    if (dtype == DType::q4_1) {
      const uint16_t m = f32_to_f16(0.05f * u(rng));
      std::memcpy(&bytes[off + 2], &m, 2);
    }
  }
  return bytes;
}

TEST(MatmulRowwise, RowResultIndependentOfBatchSize) {
  std::mt19937 rng(7);
  const int64_t rows = 83, cols = 576, tokens = 13;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_1}) {
    const auto w_bytes = random_weights(dtype, rows, cols, rng);
    const WeightView w{dtype, w_bytes.data(), rows, cols};
    std::vector<float> x(tokens * cols), bias(rows);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (auto& v : x) v = u(rng);
    for (auto& v : bias) v = u(rng);
    for (SimdLevel level : {SimdLevel::scalar, SimdLevel::avx2, SimdLevel::avx512}) {
      if (level > simd_level_supported()) continue;
      simd_level_override(level);
      std::vector<float> all(tokens * rows), one(rows);
      matmul_rowwise_cpu(x.data(), w, bias.data(), all.data(), tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        matmul_rowwise_cpu(&x[t * cols], w, bias.data(), one.data(), 1);
        for (int64_t r = 0; r < rows; ++r) ASSERT_FALSE(std::isnan(one[r]));
        EXPECT_EQ(0, std::memcmp(one.data(), &all[t * rows], rows * sizeof(float)))
            << dtype_name(dtype) << " at SIMD level " << int(level) << ", token " << t;
      }
    }
    simd_level_override(simd_level_supported());
  }
}

}  // namespace
}  // namespace snap::kernels
