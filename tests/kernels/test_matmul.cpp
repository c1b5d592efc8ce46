// matmul: both fast paths (SIMD matvec at every SIMD level, sgemm) and the dispatcher
// against the f64 reference, for f32/f16/bf16 and every block format's weights over awkward
// shapes, with and without bias; the reference decodes hand-built blocks as the ggml
// layout says; NaN in x must reach every output of that token.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matvec_q16act.h"
#include "kernels/kernels.h"
#include "tests/kernels/block_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

using test::all_close;
using test::random_floats;
using test::make_blocks;

// Error bound: f32 accumulation over cols terms of |x·w| ≤ 1 in unordered SIMD lanes (or
// OpenBLAS blocking) has error ≲ cols·2^-24·mean|x·w| ≈ 5125·6e-8·0.25 ≈ 8e-5 absolute in the
// worst case, ~sqrt(cols)·6e-8 typical; outputs are ~sqrt(cols)/3 ≈ 24 at cols 5125. Normalized
// by max(1, max|ref|) that gives ≲ 3e-6; 2e-5 leaves room without hiding a wrong element
// (one missing term changes an output by ~0.25, i.e. 1e-2 normalized).
constexpr double k_tol = 2e-5;

// Weight storage in the given dtype, plus the values it really holds as f32.
struct TestWeight {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  WeightView view;
};

TestWeight make_weight(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  TestWeight w;
  w.f32 = random_floats(rows * cols, seed);
  if (dtype != DType::f32) {
    w.half.resize(w.f32.size());
    for (size_t i = 0; i < w.f32.size(); ++i)
      w.half[i] = dtype == DType::f16 ? f32_to_f16(w.f32[i]) : f32_to_bf16(w.f32[i]);
  }
  w.view = WeightView{dtype, dtype == DType::f32 ? static_cast<const void*>(w.f32.data()) : w.half.data(), rows, cols};
  return w;
}

using MatmulFn = void (*)(const float*, const WeightView&, const float*, float*, int64_t);

struct Shape {
  int64_t rows, cols, num_tokens;
};

void check_shapes(DType dtype, const std::vector<Shape>& shapes) {
  for (const Shape& s : shapes) {
    const TestWeight w = make_weight(dtype, s.rows, s.cols, 7 + static_cast<uint32_t>(s.rows));
    const std::vector<float> x = random_floats(s.num_tokens * s.cols, 11);
    const std::vector<float> bias = random_floats(s.rows, 13);
    for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
      std::vector<float> want(static_cast<size_t>(s.num_tokens * s.rows));
      matmul_ref(x.data(), w.view, b, want.data(), s.num_tokens);
      const auto run = [&](MatmulFn fn, const char* name) {
        std::vector<float> got(want.size(), -12345.0f);
        fn(x.data(), w.view, b, got.data(), s.num_tokens);
        EXPECT_TRUE(all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), k_tol))
            << name << " " << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " tokens "
            << s.num_tokens << (b ? " bias" : "");
      };
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        SCOPED_TRACE(test::level_name(level));
        run(matmul_matvec_cpu, "matvec");
        run(matmul_gemm_cpu, "gemm");
      }
      run(matmul_cpu, "matmul_cpu");
    }
  }
}

const std::vector<Shape> k_shapes = {
    {7, 7, 1},     {7, 83, 3},     {83, 7, 17},    {83, 769, 1},   {769, 83, 3},   {769, 769, 4},
    {7, 5125, 1},  {83, 5125, 5},  {5125, 83, 2},  {83, 769, 17},  {769, 83, 128}, {576, 576, 1},
    {1, 576, 1},   {576, 1536, 9}, {13, 16, 1},    {16, 31, 7},
};

TEST(Matmul, F32MatchesReferenceOnAwkwardShapes) { check_shapes(DType::f32, k_shapes); }
TEST(Matmul, F16MatchesReferenceOnAwkwardShapes) { check_shapes(DType::f16, k_shapes); }
TEST(Matmul, Bf16MatchesReferenceOnAwkwardShapes) { check_shapes(DType::bf16, k_shapes); }

// --- block formats ------------------------------------------------------------------

// Shapes the brief asks for: every rows × cols (cols whole 32-blocks: 1, 2, 18, 48 blocks),
// token counts cycling through 1..5 (each register-block tail), 17 and 128 (sgemm).
// The K formats (256-weight blocks): 1, 2, 3 and 6 blocks.
std::vector<Shape> quant_shapes(DType dtype) {
  const int64_t tokens[] = {1, 2, 3, 4, 5, 17, 128};
  const std::vector<int64_t> widths =
      dtype_block_elems(dtype) == 256 ? std::vector<int64_t>{256, 512, 768, 1536} : std::vector<int64_t>{32, 64, 576, 1536};
  std::vector<Shape> v;
  int i = 0;
  for (int64_t rows : {7, 83, 769}) {
    for (int64_t cols : widths) {
      for (int k = 0; k < 3; ++k) v.push_back({rows, cols, tokens[(i++) % 7]});
    }
  }
  return v;
}

// Same bound as k_tol: weights and x are ≲ 1 in magnitude and both sides see the same
// (exactly dequantized) weights, so only the f32 summation order differs from the f64
// reference; q4_1's one-sided offsets make outputs larger, which the normalization absorbs.
void check_quant_shapes(DType dtype) {
  for (const Shape& s : quant_shapes(dtype)) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 17 + static_cast<uint32_t>(s.cols));
    const WeightView w{dtype, blocks.data(), s.rows, s.cols};
    const std::vector<float> x = random_floats(s.num_tokens * s.cols, 19);
    const std::vector<float> bias = random_floats(s.rows, 23);
    for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
      std::vector<float> want(static_cast<size_t>(s.num_tokens * s.rows));
      matmul_ref(x.data(), w, b, want.data(), s.num_tokens);
      const auto run = [&](MatmulFn fn, const char* name) {
        std::vector<float> got(want.size(), -12345.0f);
        fn(x.data(), w, b, got.data(), s.num_tokens);
        EXPECT_TRUE(all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), k_tol))
            << name << " " << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " tokens "
            << s.num_tokens << (b ? " bias" : "");
      };
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        SCOPED_TRACE(test::level_name(level));
        run(matmul_matvec_cpu, "matvec");
        run(matmul_gemm_cpu, "gemm");
        run(matmul_cpu, "matmul_cpu");
      }
    }
  }
}

TEST(Matmul, Q8_0MatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q8_0); }
TEST(Matmul, Q4_0MatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q4_0); }
TEST(Matmul, Q4_1MatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q4_1); }
TEST(Matmul, Q5_0MatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q5_0); }
TEST(Matmul, Q5_1MatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q5_1); }
TEST(Matmul, Q4_KMatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q4_k); }
TEST(Matmul, Q6_KMatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q6_k); }
TEST(Matmul, Q5_KMatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q5_k); }
TEST(Matmul, Q3_KMatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q3_k); }
TEST(Matmul, Q2_KMatchesReferenceOnAwkwardShapes) { check_quant_shapes(DType::q2_k); }

// Under f32act, Q5_0/Q5_1 and the K formats Q2_K to Q6_K (the other integer modes run their
// q16act/q16x2act tiles, tests/kernels/test_matvec_q16act.cpp) have SIMD tiles that walk a row
// 32 columns at a time in the f32 tile's order:
// on the same values, the matvec over the blocks and the one over their f32 values agree bit for
// bit, at the AVX2 and AVX-512 levels and in every mode. (The values themselves: tests/worker/test_dequant.cpp
// checks them against the gguf package.)
TEST(Matmul, F32ActBlockMatvecIsTheF32MatvecOnItsValues) {
  for (DType dtype : {DType::q5_0, DType::q5_1, DType::q4_k, DType::q6_k, DType::q5_k, DType::q3_k, DType::q2_k}) {
    for (const Shape& s : {Shape{83, 1536, 1}, Shape{7, 512, 5}, Shape{130, 768, 4}}) {
      const std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 29);
      const WeightView w{dtype, blocks.data(), s.rows, s.cols};
      std::vector<float> values(static_cast<size_t>(s.rows * s.cols));
      std::vector<float> onehot(static_cast<size_t>(s.cols * s.cols), 0.0f);
      for (int64_t c = 0; c < s.cols; ++c) onehot[c * s.cols + c] = 1.0f;
      std::vector<float> yt(values.size());
      matmul_ref(onehot.data(), w, nullptr, yt.data(), s.cols);  // yt[c][r] = w[r][c]
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t c = 0; c < s.cols; ++c) values[r * s.cols + c] = yt[c * s.rows + r];
      const WeightView wf{DType::f32, values.data(), s.rows, s.cols};
      const std::vector<float> x = random_floats(s.num_tokens * s.cols, 31);
      const std::vector<float> bias = random_floats(s.rows, 37);
      for (SimdLevel level : test::supported_levels()) {
        if (level == SimdLevel::scalar) continue;  // the scalar block loop sums per block, the f32 one per row
        test::LevelGuard guard(level);
        for (MatvecAct act : {MatvecAct::f32, MatvecAct::q8, MatvecAct::q16x2, MatvecAct::q8x3}) {
          // Q5_0, Q5_1 and Q2_K to Q6_K run their q16act/q16x2act tiles under the integer modes
          // (test_matvec_q16act).
          if (q16act_reads(dtype) && act != MatvecAct::f32) continue;
          test::ActGuard mode(act);
          std::vector<float> got(static_cast<size_t>(s.num_tokens * s.rows)), want(got.size());
          matmul_matvec_cpu(x.data(), w, bias.data(), got.data(), s.num_tokens);
          matmul_matvec_cpu(x.data(), wf, bias.data(), want.data(), s.num_tokens);
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " tokens " << s.num_tokens << " at "
              << test::level_name(level) << " " << matvec_act_name(act);
        }
      }
    }
  }
}

// One hand-built block per format, read back column by column through unit vectors x = e_c:
// pins the reference (and so every fast path) to the ggml layout in common/dtype.h.
TEST(Matmul, ReferenceDecodesBlockLayouts) {
  const uint16_t d = f32_to_f16(0.5f), m = f32_to_f16(-1.0f);
  uint8_t q8[34], q40[18], q41[20];
  std::memcpy(q8, &d, 2);
  std::memcpy(q40, &d, 2);
  std::memcpy(q41, &d, 2);
  std::memcpy(q41 + 2, &m, 2);
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 20));
  for (int j = 0; j < 16; ++j) {
    const uint8_t packed = static_cast<uint8_t>(j | ((15 - j) << 4));  // element j: j, element j+16: 15-j
    q40[2 + j] = packed;
    q41[4 + j] = packed;
  }
  for (int c = 0; c < 32; ++c) {
    std::vector<float> x(32, 0.0f);
    x[static_cast<size_t>(c)] = 1.0f;
    const int nib = c < 16 ? c : 15 - (c - 16);
    float y = 0.0f;
    matmul_ref(x.data(), WeightView{DType::q8_0, q8, 1, 32}, nullptr, &y, 1);
    EXPECT_EQ(y, 0.5f * static_cast<float>(c - 20)) << "q8_0 col " << c;
    matmul_ref(x.data(), WeightView{DType::q4_0, q40, 1, 32}, nullptr, &y, 1);
    EXPECT_EQ(y, 0.5f * static_cast<float>(nib - 8)) << "q4_0 col " << c;
    matmul_ref(x.data(), WeightView{DType::q4_1, q41, 1, 32}, nullptr, &y, 1);
    EXPECT_EQ(y, 0.5f * static_cast<float>(nib) - 1.0f) << "q4_1 col " << c;
  }
}

TEST(Matmul, BlockFormatSizes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP threads are already running
  EXPECT_EQ(dtype_row_bytes(DType::q8_0, 576), 18 * 34);
  EXPECT_EQ(dtype_row_bytes(DType::q4_0, 576), 18 * 18);
  EXPECT_EQ(dtype_row_bytes(DType::q4_1, 1536), 48 * 20);
  EXPECT_EQ(dtype_row_bytes(DType::bf16, 7), 14);
  EXPECT_EQ(dtype_size(DType::f32), 4);
  EXPECT_DEATH(dtype_size(DType::q4_1), "block format");
  EXPECT_DEATH(dtype_row_bytes(DType::q8_0, 48), "whole 32-element blocks");
}

TEST(Matmul, NanInInputPropagatesToItsTokenForBlockFormats) {
  for (DType dtype : {DType::q8_0, DType::q4_0, DType::q4_1}) {
    const int64_t rows = 37, cols = 96;
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 5);
    const WeightView w{dtype, blocks.data(), rows, cols};
    for (int64_t num_tokens : {int64_t{1}, int64_t{3}, int64_t{20}}) {
      std::vector<float> x = random_floats(num_tokens * cols, 3);
      x[(num_tokens - 1) * cols + 40] = NAN;  // last token only
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        std::vector<float> y(static_cast<size_t>(num_tokens * rows));
        matmul_cpu(x.data(), w, nullptr, y.data(), num_tokens);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_TRUE(std::isnan(y[(num_tokens - 1) * rows + r])) << dtype_name(dtype) << " row " << r;
          if (num_tokens > 1) {
            EXPECT_FALSE(std::isnan(y[r])) << dtype_name(dtype) << " token 0 row " << r;
          }
        }
      }
    }
  }
}

TEST(Matmul, ReferenceIsADotProduct) {
  // 2×3 weight, 1 token: hand-checkable.
  const float w[6] = {1, 2, 3, -1, 0.5f, 4};
  const float x[3] = {2, -1, 0.25f};
  const float bias[2] = {10, 20};
  float y[2];
  matmul_ref(x, WeightView{DType::f32, w, 2, 3}, bias, y, 1);
  EXPECT_FLOAT_EQ(y[0], 2 - 2 + 0.75f + 10);
  EXPECT_FLOAT_EQ(y[1], -2 - 0.5f + 1 + 20);
}

TEST(Matmul, NanInInputPropagatesToItsToken) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const int64_t rows = 37, cols = 83;
    const TestWeight w = make_weight(dtype, rows, cols, 5);
    for (int64_t num_tokens : {int64_t{1}, int64_t{3}, int64_t{20}}) {
      std::vector<float> x = random_floats(num_tokens * cols, 3);
      x[(num_tokens - 1) * cols + 40] = NAN;  // last token only
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        std::vector<float> y(static_cast<size_t>(num_tokens * rows));
        matmul_cpu(x.data(), w.view, nullptr, y.data(), num_tokens);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_TRUE(std::isnan(y[(num_tokens - 1) * rows + r])) << dtype_name(dtype) << " row " << r;
          if (num_tokens > 1) {
            EXPECT_FALSE(std::isnan(y[r])) << "token 0 row " << r;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace snap::kernels
