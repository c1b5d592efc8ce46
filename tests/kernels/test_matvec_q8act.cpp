// The q8-activation matvec (kernels/matvec_act.h): the activation quantizer (SIMD equal to
// scalar bit for bit, |x − d·q| ≤ d/2, NaN/inf blocks poisoned), the AVX2 tiles against the
// scalar q8act reference over awkward shapes, the whole kernel against the f32 reference
// within the error bound activation quantization allows, batch invariance, NaN propagation,
// and the matvec dispatch following matvec_act_set().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/kernels.h"
#include "kernels/matvec_act.h"
#include "tests/kernels/block_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

using test::all_close;
using test::random_floats;
using test::make_blocks;
using test::ActGuard;

// Σ_j |w_j| of one block, decoded here from the ggml layout (common/dtype.h) on its own.
double block_abs_sum(DType dtype, const uint8_t* b) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  const double d = f16_to_f32(h);
  double m = 0.0, sum = 0.0;
  if (dtype == DType::q4_1) {
    std::memcpy(&h, b + 2, 2);
    m = f16_to_f32(h);
  }
  for (int j = 0; j < 32; ++j) {
    double w;
    if (dtype == DType::q8_0) {
      w = d * static_cast<int8_t>(b[2 + j]);
    } else {
      const uint8_t byte = b[(dtype == DType::q4_1 ? 4 : 2) + j % 16];
      const int n = j < 16 ? byte & 0x0f : byte >> 4;
      w = dtype == DType::q4_1 ? d * n + m : d * (n - 8);
    }
    sum += std::fabs(w);
  }
  return sum;
}

struct Shape {
  int64_t rows, cols, num_tokens;
};

// Every register-block tail (rows % 4, tokens 1..5), 1 row, 1 block, and the SmolLM2 shapes.
const std::vector<Shape> k_shapes = {
    {1, 32, 1},   {1, 576, 3},   {7, 32, 2},    {7, 64, 5},    {83, 576, 1},  {83, 1536, 4},
    {769, 64, 3}, {769, 576, 1}, {576, 576, 2}, {1536, 576, 1}, {576, 1536, 5}, {5, 96, 9}, {4099, 576, 1},
};

const DType k_types[] = {DType::q8_0, DType::q4_0, DType::q4_1};

// Activations like a transformer's: most blocks ~1, some with one large outlier, one zero.
std::vector<float> make_x(int64_t n, uint32_t seed) {
  std::vector<float> x = random_floats(n, seed);
  for (int64_t i = 0; i < n; i += 97) x[i] *= 20.0f;
  for (int64_t i = 0; i < std::min<int64_t>(n, 32); ++i) x[i] = 0.0f;
  return x;
}

TEST(QuantizeActQ8, SimdEqualsScalarAndStaysWithinHalfAStep) {
  const int64_t cols = 32 * 41;
  std::vector<float> x = make_x(cols, 3);
  x[40] = 1e-30f;                    // a denormal-ish block member
  for (int j = 64; j < 96; ++j) x[j] = 1e6f * (j - 80);  // a block of large values
  std::vector<int8_t> q[2];
  std::vector<float> d[2], s[2];
  int i = 0;
  for (SimdLevel level : test::supported_levels()) {
    if (level > SimdLevel::avx2) continue;
    test::LevelGuard guard(level);
    q[i].resize(cols);
    d[i].resize(cols / 32);
    s[i].resize(cols / 32);
    quantize_act_q8(x.data(), cols, q[i].data(), d[i].data(), s[i].data());
    ++i;
  }
  for (int k = 1; k < i; ++k) {
    EXPECT_EQ(0, std::memcmp(q[0].data(), q[k].data(), cols)) << "int8 quants differ between SIMD levels";
    EXPECT_EQ(0, std::memcmp(d[0].data(), d[k].data(), d[0].size() * 4)) << "scales differ between SIMD levels";
    EXPECT_EQ(0, std::memcmp(s[0].data(), s[k].data(), s[0].size() * 4)) << "sums differ between SIMD levels";
  }
  for (int64_t b = 0; b < cols / 32; ++b) {
    float amax = 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    EXPECT_EQ(d[0][b], amax / 127.0f) << "block " << b;
    for (int j = 0; j < 32; ++j) {
      const int64_t c = b * 32 + j;
      ASSERT_GE(q[0][c], -127) << c;
      ASSERT_LE(q[0][c], 127) << c;
      EXPECT_LE(std::fabs(x[c] - d[0][b] * q[0][c]), 0.5001 * d[0][b]) << "element " << c;
      sum += q[0][c];
    }
    EXPECT_EQ(s[0][b], d[0][b] * static_cast<float>(sum)) << "block " << b;
  }
  EXPECT_EQ(d[0][0], 0.0f) << "the zero block";
}

TEST(QuantizeActQ8, NonFiniteBlockGetsNanScale) {
  for (SimdLevel level : test::supported_levels()) {
    test::LevelGuard guard(level);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = random_floats(96, 5);
      x[40] = bad;
      std::vector<int8_t> q(96);
      std::vector<float> d(3), s(3);
      quantize_act_q8(x.data(), 96, q.data(), d.data(), s.data());
      EXPECT_FALSE(std::isnan(d[0]));
      EXPECT_TRUE(std::isnan(d[1]) && std::isnan(s[1])) << test::level_name(level) << " value " << bad;
      EXPECT_FALSE(std::isnan(d[2]));
    }
  }
}

// The AVX2 tiles and the scalar reference quantize identically and sum the same exact
// integers; only the f32 accumulation of the per-block terms differs from the f64 one, so the
// matmul tests' bound (2e-5 of max(1, max|y|)) holds here too.
TEST(MatvecQ8Act, CpuMatchesQ8ReferenceOnAwkwardShapes) {
  for (DType dtype : k_types) {
    for (const Shape& s : k_shapes) {
      const std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 29 + static_cast<uint32_t>(s.rows));
      const WeightView w{dtype, blocks.data(), s.rows, s.cols};
      const std::vector<float> x = make_x(s.num_tokens * s.cols, 31);
      const std::vector<float> bias = random_floats(s.rows, 37);
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        std::vector<float> want(static_cast<size_t>(s.num_tokens * s.rows));
        matvec_q8act_ref(x.data(), w, b, want.data(), s.num_tokens);
        for (SimdLevel level : test::supported_levels()) {
          test::LevelGuard guard(level);
          std::vector<float> got(want.size(), -12345.0f);
          matvec_q8act_cpu(x.data(), w, b, got.data(), s.num_tokens);
          EXPECT_TRUE(all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 2e-5))
              << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " tokens " << s.num_tokens
              << (b ? " bias" : "") << " at " << test::level_name(level);
        }
      }
    }
  }
}

// Against the f32-activation reference (matmul_ref, f64): quantizing x moves each element by
// at most d_x/2, so |y_q8 − y_f32| ≤ Σ_b (d_x,b / 2)·Σ_j |w_bj|, plus the f32 summation slop.
// A wrong scale, a swapped nibble half or a lost m term breaks this by orders of magnitude.
TEST(MatvecQ8Act, WithinActivationQuantizationBoundOfF32Reference) {
  for (DType dtype : k_types) {
    double worst = 0.0;  // the largest error seen as a share of its bound
    for (const Shape& s : k_shapes) {
      const std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 41 + static_cast<uint32_t>(s.cols));
      const WeightView w{dtype, blocks.data(), s.rows, s.cols};
      const std::vector<float> x = make_x(s.num_tokens * s.cols, 43);
      std::vector<float> want(static_cast<size_t>(s.num_tokens * s.rows)), got(want.size());
      matmul_ref(x.data(), w, nullptr, want.data(), s.num_tokens);
      matvec_q8act_cpu(x.data(), w, nullptr, got.data(), s.num_tokens);
      const int64_t nb = s.cols / 32;
      std::vector<int8_t> q(s.cols);
      std::vector<float> dx(nb), sx(nb);
      for (int64_t t = 0; t < s.num_tokens; ++t) {
        quantize_act_q8(&x[t * s.cols], s.cols, q.data(), dx.data(), sx.data());
        for (int64_t r = 0; r < s.rows; ++r) {
          const uint8_t* row = blocks.data() + r * dtype_row_bytes(dtype, s.cols);
          double bound = 0.0;
          for (int64_t b = 0; b < nb; ++b) bound += 0.5 * dx[b] * block_abs_sum(dtype, row + b * dtype_block_bytes(dtype));
          const double err = std::fabs(double{got[t * s.rows + r]} - want[t * s.rows + r]);
          const double slop = 2e-5 * std::max(1.0, std::fabs(double{want[t * s.rows + r]}));
          ASSERT_LE(err, bound + slop) << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " token "
                                       << t << " row " << r << ": got " << got[t * s.rows + r] << " want "
                                       << want[t * s.rows + r];
          worst = std::max(worst, err / (bound + slop));
        }
      }
    }
    EXPECT_GT(worst, 0.0) << dtype_name(dtype) << ": q8act equal to f32 everywhere: is it really quantizing?";
    std::printf("%s: largest error %.3f of its bound\n", dtype_name(dtype), worst);
  }
}

TEST(MatvecQ8Act, RowResultIndependentOfBatchSize) {
  const ActGuard act(MatvecAct::q8);
  const int64_t rows = 83, cols = 576, tokens = 13;
  for (DType dtype : k_types) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 47);
    const WeightView w{dtype, blocks.data(), rows, cols};
    const std::vector<float> x = make_x(tokens * cols, 53), bias = random_floats(rows, 59);
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      std::vector<float> all(tokens * rows), one(rows);
      matmul_rowwise_cpu(x.data(), w, bias.data(), all.data(), tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        matmul_rowwise_cpu(&x[t * cols], w, bias.data(), one.data(), 1);
        EXPECT_EQ(0, std::memcmp(one.data(), &all[t * rows], rows * sizeof(float)))
            << dtype_name(dtype) << " at " << test::level_name(level) << ", token " << t;
      }
    }
  }
}

TEST(MatvecQ8Act, NanInXReachesEveryOutputOfItsTokenOnly) {
  const int64_t rows = 9, cols = 96, tokens = 3;
  for (DType dtype : k_types) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 61);
    const WeightView w{dtype, blocks.data(), rows, cols};
    std::vector<float> x = make_x(tokens * cols, 67);
    x[cols + 50] = std::numeric_limits<float>::quiet_NaN();
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      std::vector<float> y(tokens * rows);
      matvec_q8act_cpu(x.data(), w, nullptr, y.data(), tokens);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_FALSE(std::isnan(y[r])) << "token 0 row " << r;
        EXPECT_TRUE(std::isnan(y[rows + r])) << dtype_name(dtype) << " token 1 row " << r;
        EXPECT_FALSE(std::isnan(y[2 * rows + r])) << "token 2 row " << r;
      }
    }
  }
}

// matmul's SIMD matvec takes the q8act kernel exactly when asked to (and never at the scalar
// level, which stays the f32 reference path); the sgemm path is untouched.
TEST(MatvecQ8Act, MatvecDispatchFollowsTheChoice) {
  const int64_t rows = 83, cols = 576, tokens = 3;
  for (DType dtype : k_types) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 71);
    const WeightView w{dtype, blocks.data(), rows, cols};
    const std::vector<float> x = make_x(tokens * cols, 73);
    std::vector<float> q8(tokens * rows), f32(tokens * rows), got(tokens * rows);
    matvec_q8act_cpu(x.data(), w, nullptr, q8.data(), tokens);
    {
      const ActGuard act(MatvecAct::f32);
      matmul_matvec_cpu(x.data(), w, nullptr, f32.data(), tokens);
    }
    EXPECT_NE(0, std::memcmp(q8.data(), f32.data(), q8.size() * 4)) << dtype_name(dtype);
    {
      const ActGuard act(MatvecAct::q8);
      matmul_matvec_cpu(x.data(), w, nullptr, got.data(), tokens);
      EXPECT_EQ(0, std::memcmp(got.data(), q8.data(), q8.size() * 4)) << dtype_name(dtype) << " q8act";
      matmul_cpu(x.data(), w, nullptr, got.data(), tokens);
      EXPECT_EQ(0, std::memcmp(got.data(), q8.data(), q8.size() * 4)) << dtype_name(dtype) << " matmul_cpu";
      test::LevelGuard guard(SimdLevel::scalar);
      std::vector<float> want(tokens * rows);
      matmul_matvec_cpu(x.data(), w, nullptr, got.data(), tokens);
      matmul_ref(x.data(), w, nullptr, want.data(), tokens);
      EXPECT_TRUE(all_close(got.data(), want.data(), tokens * rows, 2e-5)) << "scalar level is f32act";
    }
  }
}

TEST(MatvecQ8Act, Names) {
  MatvecAct a = MatvecAct::f32;
  EXPECT_TRUE(matvec_act_from_name("q8act", &a));
  EXPECT_EQ(a, MatvecAct::q8);
  EXPECT_TRUE(matvec_act_from_name("f32act", &a));
  EXPECT_EQ(a, MatvecAct::f32);
  EXPECT_FALSE(matvec_act_from_name("q8", &a));
  EXPECT_STREQ(matvec_act_name(MatvecAct::q8), "q8act");
  EXPECT_STREQ(matvec_act_name(MatvecAct::f32), "f32act");
}

}  // namespace
}  // namespace snap::kernels
