// The q16- and q16x2-activation matvecs (kernels/matvec_act.h, kernels/cpu/matvec_q16act.cpp):
// q8_0, q4_0, q4_1, q5_0, q5_1, and Q2_K to Q6_K by 32-weight sub-blocks:
// the int16 activation quantizer (SIMD equal to scalar bit for bit, |x − d·q| ≤ d/2, and with
// the residual plane ≤ d/65536; NaN/inf blocks poisoned), a hand-computed block, the AVX2 tiles
// against the scalar reference over a table of awkward shapes, the whole kernel against the f32
// reference within the bound its activation rounding allows (q16act far inside q8act's error,
// q16x2act far inside q16act's), batch invariance bitwise (alone vs batched, and fused in
// matmul_multi vs alone), NaN per token, and the matvec dispatch; every test runs both modes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matvec_q16act.h"
#include "kernels/kernels.h"
#include "kernels/matmul_multi.h"
#include "kernels/matvec_act.h"
#include "tests/kernels/block_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

using test::all_close;
using test::random_floats;
using test::make_blocks;
using test::block_value;
using test::ActGuard;

struct Shape {
  int64_t rows, cols, num_tokens;
};

// The two modes of matvec_q16act.cpp: split = the q16x2act residual plane.
struct Mode {
  const char* name;
  MatvecAct act;
  bool split;
  void ref(const float* x, const WeightView& w, const float* b, float* y, int64_t n) const {
    split ? matvec_q16x2act_ref(x, w, b, y, n) : matvec_q16act_ref(x, w, b, y, n);
  }
  void cpu(const float* x, const WeightView& w, const float* b, float* y, int64_t n) const {
    split ? matvec_q16x2act_cpu(x, w, b, y, n) : matvec_q16act_cpu(x, w, b, y, n);
  }
  // q2 may be null without split.
  void quantize(const float* x, int64_t cols, int16_t* q, int16_t* q2, float* d, float* s) const {
    split ? quantize_act_q16x2(x, cols, q, q2, d, s) : quantize_act_q16(x, cols, q, d, s);
  }
};
const Mode k_modes[] = {{"q16act", MatvecAct::q16, false}, {"q16x2act", MatvecAct::q16x2, true}};

// Every register-block tail (rows % 4 = 0..3, tokens 1..9 so every NT and a second group), one
// row, one block, cols that are not multiples of 64, and the SmolLM2 shapes (the LM head's
// 49152 rows are covered by 4099, which also leaves a row tail).
const std::vector<Shape> k_shapes = {
    {1, 32, 1},    {1, 576, 3},    {2, 96, 1},    {3, 32, 4},     {7, 32, 2},    {7, 64, 5},   {83, 576, 1},
    {83, 1536, 4}, {769, 64, 3},   {769, 576, 1}, {576, 576, 2},  {1536, 576, 1}, {576, 1536, 5},
    {5, 96, 9},    {4099, 576, 1}, {10, 160, 6},  {13, 224, 7},   {6, 32, 8},
};

const DType k_types[] = {DType::q8_0, DType::q4_0, DType::q4_1};
// Q2_K to Q6_K (256-weight blocks, read as 32-weight sub-blocks): shapes of whole blocks,
// every row and token tail, 1 to 6 blocks a row.
const std::vector<Shape> k_k_shapes = {
    {1, 256, 1}, {3, 256, 4}, {7, 512, 2}, {7, 768, 5}, {83, 1536, 1}, {83, 1536, 4}, {769, 256, 3},
    {256, 768, 9}, {10, 1280, 6}, {13, 512, 7}, {6, 256, 8},
};
struct TypeShapes {
  DType dtype;
  const std::vector<Shape>* shapes;
};
const std::vector<TypeShapes> k_all = {{DType::q8_0, &k_shapes}, {DType::q4_0, &k_shapes}, {DType::q4_1, &k_shapes},
                                      {DType::q5_0, &k_shapes}, {DType::q5_1, &k_shapes}, {DType::q4_k, &k_k_shapes}, {DType::q5_k, &k_k_shapes},
                                      {DType::q6_k, &k_k_shapes}, {DType::q3_k, &k_k_shapes}, {DType::q2_k, &k_k_shapes}};

// Row r's weights as f32, through matmul_ref (whose decoders are the gguf package's values bit for
// bit: tests/worker/test_dequant.cpp) with one-hot activations.
std::vector<float> row_values(DType dtype, const uint8_t* row, int64_t cols) {
  std::vector<float> eye(static_cast<size_t>(cols * cols), 0.0f), v(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) eye[c * cols + c] = 1.0f;
  matmul_ref(eye.data(), WeightView{dtype, row, 1, cols}, nullptr, v.data(), cols);
  return v;
}

// Activations like a transformer's: most blocks ~1, some with one large outlier, one zero block.
std::vector<float> make_x(int64_t n, uint32_t seed) {
  std::vector<float> x = random_floats(n, seed);
  for (int64_t i = 0; i < n; i += 97) x[i] *= 20.0f;
  for (int64_t i = 0; i < std::min<int64_t>(n, 32); ++i) x[i] = 0.0f;
  return x;
}

TEST(QuantizeActQ16, SimdEqualsScalarAndStaysWithinHalfAStep) {
  for (const Mode& mode : k_modes) {
  SCOPED_TRACE(mode.name);
  const int64_t cols = 32 * 41;
  std::vector<float> x = make_x(cols, 3);
  x[40] = 1e-30f;
  for (int j = 64; j < 96; ++j) x[j] = 1e6f * (j - 80);  // a block of large values
  for (int j = 96; j < 128; ++j) x[j] = (j % 2 ? 1.0f : -1.0f) * 3e-3f;  // ± amax alike: q = ±32767
  std::vector<int16_t> q[2], q2[2];
  std::vector<float> d[2], s[2];
  int i = 0;
  for (SimdLevel level : test::supported_levels()) {
    if (level > SimdLevel::avx2) continue;
    test::LevelGuard guard(level);
    q[i].resize(cols);
    q2[i].assign(cols, 0);
    d[i].resize(cols / 32);
    s[i].resize(cols / 32);
    mode.quantize(x.data(), cols, q[i].data(), mode.split ? q2[i].data() : nullptr, d[i].data(), s[i].data());
    ++i;
  }
  for (int k = 1; k < i; ++k) {
    EXPECT_EQ(0, std::memcmp(q[0].data(), q[k].data(), cols * 2)) << "int16 quants differ between SIMD levels";
    EXPECT_EQ(0, std::memcmp(q2[0].data(), q2[k].data(), cols * 2)) << "residuals differ between SIMD levels";
    EXPECT_EQ(0, std::memcmp(d[0].data(), d[k].data(), d[0].size() * 4)) << "scales differ between SIMD levels";
    EXPECT_EQ(0, std::memcmp(s[0].data(), s[k].data(), s[0].size() * 4)) << "sums differ between SIMD levels";
  }
  for (int64_t b = 0; b < cols / 32; ++b) {
    float amax = 0.0f;
    int sum = 0, sum2 = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    EXPECT_EQ(d[0][b], amax / 32767.0f) << "block " << b;
    for (int j = 0; j < 32; ++j) {
      const int64_t c = b * 32 + j;
      ASSERT_GE(q[0][c], -32767) << c;
      ASSERT_LE(q[0][c], 32767) << c;
      // Half a step, plus the rounding of id = 1/d and of x·id: up to ~2 ulp of |q| ≤ 32767,
      // i.e. 0.008 of a step (q8act's 127 makes that invisible there).
      const double r = double{x[c]} - double{d[0][b]} * q[0][c];
      EXPECT_LE(std::fabs(r), 0.508 * d[0][b]) << "element " << c;
      if (mode.split) {
        // The residual plane: half of its step d/32768, plus the rounding of r (≤ ulp of x)
        // and of r·id2 (~2 ulp of |q2| ≤ 16700, in q2 units).
        const double err2 = std::fabs(r - double{d[0][b]} * q2[0][c] / 32768.0);
        EXPECT_LE(err2, 0.505 * d[0][b] / 32768.0 + std::ldexp(std::fabs(x[c]), -23)) << "element " << c;
        ASSERT_LE(std::abs(int{q2[0][c]}), 16800) << c;
      }
      sum += q[0][c];
      sum2 += q2[0][c];
    }
    const float want_s = mode.split ? d[0][b] * (static_cast<float>(sum) + static_cast<float>(sum2) / 32768.0f)
                                    : d[0][b] * static_cast<float>(sum);
    EXPECT_EQ(s[0][b], want_s) << "block " << b;
  }
  EXPECT_EQ(d[0][0], 0.0f) << "the zero block";
  for (int j = 96; j < 128; ++j) EXPECT_EQ(q[0][j], j % 2 ? 32767 : -32767) << "element " << j;
  if (mode.split) {
    int nonzero = 0;
    for (int64_t c = 0; c < cols; ++c) nonzero += q2[0][c] != 0;
    EXPECT_GT(nonzero, cols / 2) << "the residual plane is mostly empty: is it computed?";
  }
  }
}

// The half-block sums that Q2_K's mins read (ActQ16::h): the AVX2 quantizer's equal the scalar
// one's bit for bit, and each is s's formula over its 16 elements (NaN for a non-finite block).
TEST(QuantizeActQ16, HalfSumsAreTheBlockSumOverEachHalf) {
  for (const Mode& mode : k_modes) {
    const int64_t tokens = 3, cols = 32 * 41;
    std::vector<float> x = make_x(tokens * cols, 7);
    for (int j = 64; j < 96; ++j) x[j] = 1e6f * (j - 80);
    x[cols + 300] = std::numeric_limits<float>::quiet_NaN();
    ActQ16 simd, scalar;
    simd.quantize(x.data(), tokens, cols, true, mode.split);
    scalar.quantize(x.data(), tokens, cols, false, mode.split);
    ASSERT_EQ(simd.h.size(), static_cast<size_t>(2 * tokens * cols / 32));
    EXPECT_EQ(0, std::memcmp(simd.h.data(), scalar.h.data(), simd.h.size() * 4)) << mode.name;
    int nan = 0;
    for (int64_t b = 0; b < tokens * cols / 32; ++b) {
      if (std::isnan(scalar.d[b])) {
        EXPECT_TRUE(std::isnan(scalar.h[2 * b]) && std::isnan(scalar.h[2 * b + 1])) << "block " << b;
        ++nan;
        continue;
      }
      for (int half = 0; half < 2; ++half) {
        int sum = 0, sum2 = 0;
        for (int j = 16 * half; j < 16 * half + 16; ++j) {
          sum += scalar.q[b * 32 + j];
          if (mode.split) sum2 += scalar.q2[b * 32 + j];
        }
        const float want = mode.split ? scalar.d[b] * (static_cast<float>(sum) + static_cast<float>(sum2) / 32768.0f)
                                      : scalar.d[b] * static_cast<float>(sum);
        EXPECT_EQ(scalar.h[2 * b + half], want) << mode.name << " block " << b << " half " << half;
      }
    }
    EXPECT_EQ(nan, 1);
  }
}

TEST(QuantizeActQ16, NonFiniteBlockGetsNanScale) {
  for (const Mode& mode : k_modes)
  for (SimdLevel level : test::supported_levels()) {
    test::LevelGuard guard(level);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = random_floats(96, 5);
      x[40] = bad;
      std::vector<int16_t> q(96), q2(96);
      std::vector<float> d(3), s(3);
      mode.quantize(x.data(), 96, q.data(), q2.data(), d.data(), s.data());
      EXPECT_FALSE(std::isnan(d[0]));
      EXPECT_TRUE(std::isnan(d[1]) && std::isnan(s[1])) << mode.name << " " << test::level_name(level) << " value " << bad;
      EXPECT_FALSE(std::isnan(d[2]));
    }
  }
}

// One q4_1 block worked by hand: d = 0.5, m = −1 (exact in f16), byte j holds nibbles j (low,
// element j) and 15 − j (high, element j + 16), so w_j = 0.5·n_j − 1. x_j = q_j·(2/32767) with
// integer q_j and max q_j = 32767, so x quantizes back to those q_j (to within an ulp of d) and
// the result must equal the f64 sum to ~1e-7: a swapped nibble half, a lost m term or a wrong
// scale moves it by far more.
TEST(MatvecQ16Act, HandComputedBlock) {
  std::vector<uint8_t> blk(20);
  const uint16_t d = f32_to_f16(0.5f), m = f32_to_f16(-1.0f);
  std::memcpy(&blk[0], &d, 2);
  std::memcpy(&blk[2], &m, 2);
  for (int j = 0; j < 16; ++j) blk[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));  // hi nibble 15 − j
  const float dx = 2.0f / 32767.0f;
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = (j == 5 ? 32767 : 16000 - 1000 * (j % 7)) * dx;
  // Σ w_j·x_j with w_j = 0.5·n_j − 1, n_j = j (j < 16), 31 − j (j ≥ 16), in f64.
  double want = 0.0;
  for (int j = 0; j < 32; ++j) want += (0.5 * (j < 16 ? j : 31 - j) - 1.0) * x[j];
  const WeightView w{DType::q4_1, blk.data(), 1, 32};
  for (const Mode& mode : k_modes) {
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      float got = 0.0f;
      mode.cpu(x.data(), w, nullptr, &got, 1);
      EXPECT_NEAR(got, want, 2e-6 * std::fabs(want)) << mode.name << " " << test::level_name(level);
    }
    float ref = 0.0f;
    mode.ref(x.data(), w, nullptr, &ref, 1);
    EXPECT_NEAR(ref, want, 2e-6 * std::fabs(want)) << mode.name;
  }
}

// The test's own decoder (block_value, for the bound below) reads Q5_0/Q5_1 as matmul_ref does.
TEST(MatvecQ16Act, Q5BlockValuesAreMatmulRefs) {
  for (DType dtype : {DType::q5_0, DType::q5_1}) {
    const int64_t cols = 256;
    const std::vector<uint8_t> blocks = make_blocks(dtype, 1, cols, 61);
    const std::vector<float> v = row_values(dtype, blocks.data(), cols);
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(static_cast<float>(block_value(dtype, blocks.data() + c / 32 * dtype_block_bytes(dtype), c % 32)), v[c])
          << dtype_name(dtype) << " column " << c;
  }
}

// The AVX2 tiles and the scalar reference quantize identically and sum the same exact
// integers; only the f32 accumulation of the per-block terms differs from the f64 one, so the
// matmul tests' bound (2e-5 of max(1, max|y|)) holds here too.
TEST(MatvecQ16Act, CpuMatchesQ16ReferenceOnAwkwardShapes) {
  for (const Mode& mode : k_modes)
  for (const auto& [dtype, shapes] : k_all) {
    for (const Shape& s : *shapes) {
      const std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 29 + static_cast<uint32_t>(s.rows));
      const WeightView w{dtype, blocks.data(), s.rows, s.cols};
      const std::vector<float> x = make_x(s.num_tokens * s.cols, 31);
      const std::vector<float> bias = random_floats(s.rows, 37);
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        std::vector<float> want(static_cast<size_t>(s.num_tokens * s.rows));
        mode.ref(x.data(), w, b, want.data(), s.num_tokens);
        for (SimdLevel level : test::supported_levels()) {
          test::LevelGuard guard(level);
          std::vector<float> got(want.size(), -12345.0f);
          mode.cpu(x.data(), w, b, got.data(), s.num_tokens);
          EXPECT_TRUE(all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 2e-5))
              << mode.name << " " << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " tokens " << s.num_tokens
              << (b ? " bias" : "") << " at " << test::level_name(level);
        }
      }
    }
  }
}

// Against the f32-activation reference (matmul_ref, f64): quantizing x moves each element by
// at most d_x/2 (q16x2act: d_x/65536 plus the rounding of the residual), so
// |y − y_f32| ≤ Σ_b step_b·Σ_j |w_bj| plus the f32 summation slop (q16act: 1e-6 of max(1, |y|),
// its bound being 258× tighter than q8act's; q16x2act: 2e-5, as f32act's). And the errors must be far
// below the coarser mode's on the same inputs (q16act vs q8act, q16x2act vs q16act): the point
// of each mode.
TEST(MatvecQ16Act, WithinActivationQuantizationBoundOfF32Reference) {
  for (const auto& [dtype, shapes] : k_all) {
    double worst[2] = {0.0, 0.0}, err[2] = {0.0, 0.0}, err8 = 0.0, err32 = 0.0;
    const bool k = dtype_block_elems(dtype) == 256;  // the K formats' values through matmul_ref
    const bool has_q8 = dtype_cpu_int_blocks(dtype);  // else no q8act kernel: compared with q16act alone
    for (const Shape& s : *shapes) {
      const std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 41 + static_cast<uint32_t>(s.cols));
      const WeightView w{dtype, blocks.data(), s.rows, s.cols};
      const std::vector<float> x = make_x(s.num_tokens * s.cols, 43);
      std::vector<float> want(static_cast<size_t>(s.num_tokens * s.rows)), q8(want.size()), f32(want.size()), got[2];
      matmul_ref(x.data(), w, nullptr, want.data(), s.num_tokens);
      if (has_q8) matvec_q8act_cpu(x.data(), w, nullptr, q8.data(), s.num_tokens);
      {
        const ActGuard act(MatvecAct::f32);
        matmul_matvec_cpu(x.data(), w, nullptr, f32.data(), s.num_tokens);
      }
      for (int m = 0; m < 2; ++m) {
        got[m].resize(want.size());
        k_modes[m].cpu(x.data(), w, nullptr, got[m].data(), s.num_tokens);
      }
      const int64_t nb = s.cols / 32;
      std::vector<int16_t> q(s.cols);
      std::vector<float> dx(nb), sx(nb);
      // The K formats' rows as f32, once per row rather than once per row and token.
      std::vector<std::vector<float>> values(k ? s.rows : 0);
      for (int64_t r = 0; r < static_cast<int64_t>(values.size()); ++r)
        values[r] = row_values(dtype, blocks.data() + r * dtype_row_bytes(dtype, s.cols), s.cols);
      for (int64_t t = 0; t < s.num_tokens; ++t) {
        quantize_act_q16(&x[t * s.cols], s.cols, q.data(), dx.data(), sx.data());
        for (int64_t r = 0; r < s.rows; ++r) {
          const uint8_t* row = blocks.data() + r * dtype_row_bytes(dtype, s.cols);
          const std::vector<float> empty;
          const std::vector<float>& wr = k ? values[r] : empty;
          double bound16 = 0.0, bound2 = 0.0;
          for (int64_t b = 0; b < nb; ++b) {
            double abs_sum = 0.0, abs_x = 0.0;
            for (int j = 0; j < 32; ++j) {
              const double wj = std::fabs(k ? wr[b * 32 + j] : block_value(dtype, row + b * dtype_block_bytes(dtype), j));
              abs_sum += wj;
              abs_x += wj * std::fabs(x[t * s.cols + b * 32 + j]);
            }
            bound16 += 0.5 * dx[b] * abs_sum;
            bound2 += 0.505 * dx[b] / 32768.0 * abs_sum + std::ldexp(abs_x, -23);
          }
          const int64_t i = t * s.rows + r;
          // q16x2act's activation error is below f32 summation noise, so it gets the f32 paths'
          // tolerance (test_matmul: 2e-5 of max(1, |y|)).
          const double scale = std::max(1.0, std::fabs(double{want[i]}));
          const double bound[2] = {bound16 + 1e-6 * scale, bound2 + 2e-5 * scale};
          for (int m = 0; m < 2; ++m) {
            const double e = std::fabs(double{got[m][i]} - want[i]);
            ASSERT_LE(e, bound[m]) << k_modes[m].name << " " << dtype_name(dtype) << " rows " << s.rows << " cols "
                                   << s.cols << " token " << t << " row " << r << ": got " << got[m][i] << " want "
                                   << want[i];
            worst[m] = std::max(worst[m], e / bound[m]);
            err[m] = std::max(err[m], e);
          }
          if (has_q8) err8 = std::max(err8, std::fabs(double{q8[i]} - want[i]));
          err32 = std::max(err32, std::fabs(double{f32[i]} - want[i]));
        }
      }
    }
    EXPECT_GT(worst[0], 0.0) << dtype_name(dtype) << ": q16act equal to f32 everywhere: is it really quantizing?";
    if (has_q8) {
      EXPECT_LT(err[0] * 30, err8) << dtype_name(dtype) << ": q16act max error " << err[0] << " vs q8act " << err8;
    }
    EXPECT_LT(err[1] * 50, err[0]) << dtype_name(dtype) << ": q16x2act max error " << err[1] << " vs q16act "
                                   << err[0];
    std::printf("%s: largest error %.3f / %.3f of its bound; max |err| q8act %.3g, q16act %.3g, q16x2act %.3g, "
                "f32act %.3g\n", dtype_name(dtype), worst[0], worst[1], err8, err[0], err[1], err32);
  }
}

TEST(MatvecQ16Act, RowResultIndependentOfBatchSize) {
  const int64_t rows = 83, tokens = 13;
  for (const Mode& mode : k_modes)
  for (const auto& [dtype, shapes] : k_all) {
    const int64_t cols = dtype_block_elems(dtype) == 256 ? 768 : 576;
    const ActGuard act(mode.act);
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 47);
    const WeightView w{dtype, blocks.data(), rows, cols};
    const std::vector<float> x = make_x(tokens * cols, 53), bias = random_floats(rows, 59);
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      std::vector<float> all(tokens * rows), one(rows), direct(tokens * rows);
      matmul_rowwise_cpu(x.data(), w, bias.data(), all.data(), tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        matmul_rowwise_cpu(&x[t * cols], w, bias.data(), one.data(), 1);
        EXPECT_EQ(0, std::memcmp(one.data(), &all[t * rows], rows * sizeof(float)))
            << mode.name << " " << dtype_name(dtype) << " at " << test::level_name(level) << ", token " << t;
      }
      if (level == SimdLevel::scalar) continue;  // the scalar level of matmul is the f32 reference
      mode.cpu(x.data(), w, bias.data(), direct.data(), tokens);
      EXPECT_EQ(0, std::memcmp(direct.data(), all.data(), all.size() * sizeof(float)))
          << mode.name << " " << dtype_name(dtype) << ": matmul's tiles differ from the kernel called alone";
    }
  }
}

// q/k/v-shaped matrices of different formats fused in one matmul_multi call give each output
// bitwise what the matrix gives alone, for every token count.
TEST(MatvecQ16Act, FusedEqualsAlone) {
  for (const Mode& mode : k_modes) {
  const ActGuard act(mode.act);
  const int64_t cols = 576;
  const std::vector<uint8_t> wq = make_blocks(DType::q4_1, 576, cols, 81), wk = make_blocks(DType::q8_0, 195, cols, 82),
                             wv = make_blocks(DType::q4_0, 192, cols, 83);
  const WeightView views[3] = {{DType::q4_1, wq.data(), 576, cols}, {DType::q8_0, wk.data(), 195, cols},
                               {DType::q4_0, wv.data(), 192, cols}};
  for (int64_t tokens : {1, 2, 5}) {
    const std::vector<float> x = make_x(tokens * cols, 85);
    std::vector<float> fused[3], alone[3];
    MatmulOut outs[3];
    for (int i = 0; i < 3; ++i) {
      fused[i].assign(tokens * views[i].rows, 0.0f);
      alone[i].assign(tokens * views[i].rows, 1.0f);
      outs[i] = {views[i], nullptr, fused[i].data()};
      matmul_rowwise_cpu(x.data(), views[i], nullptr, alone[i].data(), tokens);
    }
    matmul_multi_cpu(x.data(), outs, 3, tokens, true);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(0, std::memcmp(fused[i].data(), alone[i].data(), fused[i].size() * 4))
          << mode.name << " matrix " << i << " tokens " << tokens;
  }
  }
}

TEST(MatvecQ16Act, NanOrInfInXReachesEveryOutputOfItsTokenOnly) {
  const int64_t rows = 9, tokens = 3;
  for (const Mode& mode : k_modes)
  for (const auto& [dtype, shapes] : k_all) {
    const int64_t cols = dtype_block_elems(dtype) == 256 ? 256 : 96;
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 61);
    const WeightView w{dtype, blocks.data(), rows, cols};
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = make_x(tokens * cols, 67);
      x[cols + 50] = bad;
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        std::vector<float> y(tokens * rows);
        mode.cpu(x.data(), w, nullptr, y.data(), tokens);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_FALSE(std::isnan(y[r])) << "token 0 row " << r;
          EXPECT_TRUE(std::isnan(y[rows + r])) << mode.name << " " << dtype_name(dtype) << " token 1 row " << r << " value " << bad;
          EXPECT_FALSE(std::isnan(y[2 * rows + r])) << "token 2 row " << r;
        }
      }
    }
  }
}

// matmul's SIMD matvec takes each kernel exactly when asked to (never at the scalar level,
// which stays the f32 reference path); the sgemm path (8+ tokens) is untouched.
TEST(MatvecQ16Act, MatvecDispatchFollowsTheChoice) {
  const int64_t rows = 83, cols = 576, tokens = 3;
  for (DType dtype : k_types) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 71);
    const WeightView w{dtype, blocks.data(), rows, cols};
    const std::vector<float> x = make_x(tokens * cols, 73);
    std::vector<float> q16(tokens * rows), q16x2(tokens * rows), q8(tokens * rows), f32(tokens * rows),
        got(tokens * rows);
    matvec_q16act_cpu(x.data(), w, nullptr, q16.data(), tokens);
    matvec_q16x2act_cpu(x.data(), w, nullptr, q16x2.data(), tokens);
    matvec_q8act_cpu(x.data(), w, nullptr, q8.data(), tokens);
    {
      const ActGuard act(MatvecAct::f32);
      matmul_matvec_cpu(x.data(), w, nullptr, f32.data(), tokens);
    }
    EXPECT_NE(0, std::memcmp(q16.data(), f32.data(), q16.size() * 4)) << dtype_name(dtype);
    EXPECT_NE(0, std::memcmp(q16.data(), q8.data(), q16.size() * 4)) << dtype_name(dtype);
    EXPECT_NE(0, std::memcmp(q16.data(), q16x2.data(), q16.size() * 4)) << dtype_name(dtype);
    EXPECT_NE(0, std::memcmp(q16x2.data(), f32.data(), q16.size() * 4)) << dtype_name(dtype);
    for (const Mode& mode : k_modes) {
      const std::vector<float>& want = mode.split ? q16x2 : q16;
      const ActGuard act(mode.act);
      matmul_matvec_cpu(x.data(), w, nullptr, got.data(), tokens);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << dtype_name(dtype) << " " << mode.name;
      matmul_cpu(x.data(), w, nullptr, got.data(), tokens);
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << dtype_name(dtype) << " matmul_cpu";
      test::LevelGuard guard(SimdLevel::scalar);
      std::vector<float> ref(tokens * rows);
      matmul_matvec_cpu(x.data(), w, nullptr, got.data(), tokens);
      matmul_ref(x.data(), w, nullptr, ref.data(), tokens);
      EXPECT_TRUE(all_close(got.data(), ref.data(), tokens * rows, 2e-5)) << "scalar level is f32act";
    }
  }
}

// Q5_0, Q5_1 and Q2_K to Q6_K have q16act/q16x2act tiles only: the matvec runs q16act when asked,
// q16x2act under q16x2act and the other integer modes (q8act, q8x3act), f32act under f32act;
// matmul_cpu alike below the sgemm's token count.
TEST(MatvecQ16Act, KFormatsRunQ16x2UnderTheOtherIntegerModes) {
  const int64_t rows = 83, cols = 768, tokens = 3;
  for (DType dtype : {DType::q5_0, DType::q5_1, DType::q4_k, DType::q5_k, DType::q6_k, DType::q3_k, DType::q2_k}) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 71);
    const WeightView w{dtype, blocks.data(), rows, cols};
    const std::vector<float> x = make_x(tokens * cols, 73);
    std::vector<float> q16(tokens * rows), q16x2(tokens * rows), f32(tokens * rows), got(tokens * rows);
    matvec_q16act_cpu(x.data(), w, nullptr, q16.data(), tokens);
    matvec_q16x2act_cpu(x.data(), w, nullptr, q16x2.data(), tokens);
    matmul_matvec_f32act_cpu(x.data(), w, nullptr, f32.data(), tokens);
    EXPECT_NE(0, std::memcmp(q16.data(), q16x2.data(), q16.size() * 4)) << dtype_name(dtype);
    EXPECT_NE(0, std::memcmp(q16x2.data(), f32.data(), q16.size() * 4)) << dtype_name(dtype);
    const std::pair<MatvecAct, const std::vector<float>*> cases[] = {{MatvecAct::f32, &f32},
                                                                    {MatvecAct::q8, &q16x2},
                                                                    {MatvecAct::q16, &q16},
                                                                    {MatvecAct::q16x2, &q16x2},
                                                                    {MatvecAct::q8x3, &q16x2}};
    for (const auto& [act, want] : cases) {
      const ActGuard mode(act);
      matmul_matvec_cpu(x.data(), w, nullptr, got.data(), tokens);
      EXPECT_EQ(0, std::memcmp(got.data(), want->data(), got.size() * 4)) << dtype_name(dtype) << " " << matvec_act_name(act);
      matmul_cpu(x.data(), w, nullptr, got.data(), tokens);
      EXPECT_EQ(0, std::memcmp(got.data(), want->data(), got.size() * 4))
          << dtype_name(dtype) << " " << matvec_act_name(act) << " matmul_cpu";
    }
  }
}

TEST(MatvecQ16Act, NamesAndBadWeights) {
  MatvecAct a = MatvecAct::f32;
  EXPECT_TRUE(matvec_act_from_name("q16act", &a));
  EXPECT_EQ(a, MatvecAct::q16);
  EXPECT_STREQ(matvec_act_name(MatvecAct::q16), "q16act");
  EXPECT_TRUE(matvec_act_from_name("q16x2act", &a));
  EXPECT_EQ(a, MatvecAct::q16x2);
  EXPECT_STREQ(matvec_act_name(MatvecAct::q16x2), "q16x2act");
  EXPECT_TRUE(matvec_act_from_name("q16act", &a));
  EXPECT_FALSE(matvec_act_from_name("q16", &a));
  EXPECT_EQ(a, MatvecAct::q16);
  std::vector<float> f(64 * 2, 1.0f), x(64, 1.0f), y(2);
  const WeightView wf{DType::f32, f.data(), 2, 64};
  EXPECT_DEATH(matvec_q16act_cpu(x.data(), wf, nullptr, y.data(), 1), "q16act: f32 weights");
  EXPECT_DEATH(matvec_q16x2act_cpu(x.data(), wf, nullptr, y.data(), 1), "q16act: f32 weights");
  std::vector<uint16_t> h(64 * 2, 0);
  EXPECT_DEATH(matvec_q16x2act_cpu(x.data(), WeightView{DType::bf16, h.data(), 2, 64}, nullptr, y.data(), 1),
               "q16act: bf16 weights");
}

}  // namespace
}  // namespace snap::kernels
