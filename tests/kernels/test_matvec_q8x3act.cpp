// The q8x3-activation matvec (kernels/matvec_act.h, kernels/cpu/matvec_q8x3act.cpp): the 22-bit
// activation quantizer (its three digit planes equal between the AVX-512 and scalar quantizers
// byte for byte, V = a·2^14 + b·2^7 + c rebuilt from them, |x − d·V| ≤ 3d/4, NaN/inf blocks
// poisoned), hand-computed q4_1 and q8_0 blocks (q8_0's sign flip with −128 and 127 quants),
// the tiles (AVX-512 VNNI where the CPU has it, the scalar tile at the lower levels) against
// the scalar reference over awkward shapes, the whole kernel against the f32 reference within
// its activation rounding (and far inside q16act's error), batch invariance bitwise (alone vs
// batched, fused vs alone), NaN per token, and the matvec dispatch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matvec_q8x3act.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/matmul_multi.h"
#include "kernels/matvec_act.h"
#include "kernels/weight_tiles.h"
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

// Row tails 0..3, tokens 1..9, and cols giving 1, 2 and 3 blocks in the last group of 4 (32, 64,
// 96, 160, 224, 576 = 4·4 + 2 blocks) as well as full groups (128, 512, 1536).
const std::vector<Shape> k_shapes = {
    {1, 32, 1},    {1, 576, 3},   {2, 96, 1},     {3, 32, 4},    {7, 32, 2},     {7, 64, 5},   {83, 576, 1},
    {83, 1536, 4}, {769, 64, 3},  {769, 576, 1},  {576, 576, 2}, {1536, 576, 1}, {576, 1536, 5},
    {5, 96, 9},    {4099, 576, 1}, {10, 160, 6},  {13, 224, 7},  {6, 128, 8},    {9, 512, 3},
};

const DType k_types[] = {DType::q8_0, DType::q4_0, DType::q4_1};

std::vector<float> make_x(int64_t n, uint32_t seed) {
  std::vector<float> x = random_floats(n, seed);
  for (int64_t i = 0; i < n; i += 97) x[i] *= 20.0f;
  for (int64_t i = 0; i < std::min<int64_t>(n, 32); ++i) x[i] = 0.0f;
  return x;
}

int64_t plane_pos(int64_t bi, int e) { return (bi / 4) * 128 + (e < 16 ? 0 : 64) + (bi % 4) * 16 + (e & 15); }

// Every byte and scale of two quantizations of the same x.
void expect_same_planes(const ActQ8x3& scalar, const ActQ8x3& simd, const char* at) {
  EXPECT_EQ(scalar.qa, simd.qa) << at;
  EXPECT_EQ(scalar.qb, simd.qb) << at;
  EXPECT_EQ(scalar.qc, simd.qc) << at;
  EXPECT_EQ(0, std::memcmp(scalar.xd.data(), simd.xd.data(), scalar.xd.size() * 4)) << at;
  EXPECT_EQ(0, std::memcmp(scalar.xs.data(), simd.xs.data(), scalar.xs.size() * 4)) << at;
  EXPECT_EQ(scalar.ca, simd.ca) << at;
  EXPECT_EQ(scalar.cbc, simd.cbc) << at;
}

TEST(QuantizeActQ8x3, PlanesRebuildVAndSimdEqualsScalar) {
  const int64_t cols = 32 * 41, tokens = 2;  // 41 blocks: the last group holds one
  std::vector<float> x = make_x(tokens * cols, 3);
  x[40] = 1e-30f;
  for (int j = 64; j < 96; ++j) x[j] = 1e6f * (j - 80);
  for (int j = 96; j < 128; ++j) x[j] = (j % 2 ? 1.0f : -1.0f) * 3e-3f;  // ± amax alike: V = ±127·2^14
  std::vector<int32_t> v(cols);
  std::vector<float> d(cols / 32), s(cols / 32);
  quantize_act_q8x3(x.data(), cols, v.data(), d.data(), s.data());
  ActQ8x3 scalar, simd;
  scalar.quantize(x.data(), tokens, cols, false);
  EXPECT_EQ(scalar.ng, 11);
  for (int64_t b = 0; b < cols / 32; ++b) {
    float amax = 0.0f;
    int64_t sum = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    EXPECT_EQ(d[b], amax / (127.0f * 16384.0f)) << "block " << b;
    int32_t sa = 0, sb = 0, sc = 0;
    for (int j = 0; j < 32; ++j) {
      const int64_t c = b * 32 + j;
      ASSERT_LE(std::abs(v[c]), 127 * 16384 + 8191) << c;
      // Half a step, plus the f32 rounding of 1/d and of x·(1/d) at |V| < 2^21 (ulp 1/4, so up
      // to 1/8 + 1/8 of a step): 3/4 of a step.
      EXPECT_LE(std::fabs(double{x[c]} - double{d[b]} * v[c]), 0.7501 * d[b] + 1e-45) << "element " << c;
      const int64_t p = plane_pos(b, j);
      const int a = scalar.qa[p], bb = scalar.qb[p], cc = scalar.qc[p];
      ASSERT_TRUE(a >= -127 && a <= 127 && bb >= -64 && bb <= 64 && cc >= -64 && cc <= 64) << c;
      EXPECT_EQ(a * 16384 + bb * 128 + cc, v[c]) << "element " << c;
      sum += v[c];
      sa += a;
      sb += bb;
      sc += cc;
    }
    EXPECT_EQ(s[b], d[b] * static_cast<float>(sum)) << "block " << b;
    for (int k = 0; k < 4; ++k) {
      const int64_t lane = (b / 4) * 16 + (b % 4) * 4 + k;
      EXPECT_EQ(scalar.xd[lane], d[b]);
      EXPECT_EQ(scalar.xs[lane], s[b]);
      EXPECT_EQ(scalar.ca[lane], 128 * sa);
      EXPECT_EQ(scalar.cbc[lane], 128 * (128 * sb + sc));
    }
  }
  for (int j = 96; j < 128; ++j) EXPECT_EQ(v[j], (j % 2 ? 1 : -1) * 127 * 16384) << "element " << j;
  // The last group's three missing blocks: zero digits and zero scales.
  for (int64_t p = 10 * 128; p < 11 * 128; ++p)
    if (p % 64 >= 16) {
      EXPECT_EQ(scalar.qa[p] | scalar.qb[p] | scalar.qc[p], 0) << p;
    }
  for (int64_t lane = 10 * 16 + 4; lane < 11 * 16; ++lane) EXPECT_EQ(scalar.xd[lane], 0.0f) << lane;
  if (simd_level_supported() < SimdLevel::avx2) GTEST_SKIP() << "no AVX2 here: the SIMD quantizers are not run";
  for (SimdLevel level : test::supported_levels()) {
    if (level == SimdLevel::scalar) continue;
    test::LevelGuard guard(level);
    simd.quantize(x.data(), tokens, cols, true);
    expect_same_planes(scalar, simd, test::level_name(level));
  }
}

// Random blocks of every magnitude (and ties at x·(1/d) = k + 1/2) through each vector quantizer.
TEST(QuantizeActQ8x3, VectorQuantizersEqualScalarOnManyBlocks) {
  const int64_t cols = 32 * 203, tokens = 3;
  std::vector<float> x = make_x(tokens * cols, 11);
  std::mt19937 rng(5);
  for (int64_t b = 0; b < tokens * cols / 32; ++b) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
    for (int j = 0; j < 32; ++j) x[b * 32 + j] *= scale;
    if (b % 7 == 0) {  // exact halves: V + 1/2 steps with d = 1/(127·2^14)·max
      x[b * 32] = 127.0f * 16384.0f;
      for (int j = 1; j < 32; ++j) x[b * 32 + j] = static_cast<float>(static_cast<int>(rng() % 4001) - 2000) + 0.5f;
    }
  }
  ActQ8x3 scalar;
  scalar.quantize(x.data(), tokens, cols, false);
  for (SimdLevel level : test::supported_levels()) {
    if (level == SimdLevel::scalar) continue;
    test::LevelGuard guard(level);
    ActQ8x3 simd;
    simd.quantize(x.data(), tokens, cols, true);
    expect_same_planes(scalar, simd, test::level_name(level));
  }
}

TEST(QuantizeActQ8x3, NonFiniteBlockGetsNanScale) {
  for (SimdLevel level : test::supported_levels()) {
    test::LevelGuard guard(level);
    const bool simd = level != SimdLevel::scalar;
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = random_floats(96, 5);
      x[40] = bad;
      ActQ8x3 a;
      a.quantize(x.data(), 1, 96, simd);
      EXPECT_FALSE(std::isnan(a.xd[0]));
      EXPECT_TRUE(std::isnan(a.xd[4]) && std::isnan(a.xs[4])) << test::level_name(level) << " " << bad;
      EXPECT_FALSE(std::isnan(a.xd[8]));
      for (int e = 0; e < 32; ++e) EXPECT_EQ(a.qa[plane_pos(1, e)], 0) << e;
    }
  }
}

// x_j = V_j·d with integer V_j and max |V| = 127·2^14, so x quantizes back to those V (to within
// an ulp of d) and the result must equal the f64 sum to ~1e-7: a swapped half, a lost m term, a
// wrong digit weight or q8_0's sign flip left in moves it by far more.
TEST(MatvecQ8x3Act, HandComputedBlocks) {
  const float dx = 1.0f / (127.0f * 16384.0f);
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j == 5 ? 127 * 16384 : 1000003 - 77777 * (j % 9)) * dx;
  for (DType dtype : {DType::q4_1, DType::q8_0}) {
    std::vector<uint8_t> blk(dtype_block_bytes(dtype));
    const uint16_t d = f32_to_f16(0.5f), m = f32_to_f16(-1.0f);
    std::memcpy(&blk[0], &d, 2);
    if (dtype == DType::q4_1) {
      std::memcpy(&blk[2], &m, 2);
      for (int j = 0; j < 16; ++j) blk[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    } else {
      for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>(j == 3 ? -128 : j == 7 ? 127 : 37 * j - 600);
    }
    double want = 0.0;
    for (int j = 0; j < 32; ++j) want += block_value(dtype, blk.data(), j) * x[j];
    const WeightView w{dtype, blk.data(), 1, 32};
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      float got = 0.0f;
      matvec_q8x3act_cpu(x.data(), w, nullptr, &got, 1);
      EXPECT_NEAR(got, want, 2e-6 * std::fabs(want)) << dtype_name(dtype) << " " << test::level_name(level);
    }
    float ref = 0.0f;
    matvec_q8x3act_ref(x.data(), w, nullptr, &ref, 1);
    EXPECT_NEAR(ref, want, 2e-6 * std::fabs(want)) << dtype_name(dtype);
  }
}

// The tiles and the reference sum the same exact integers; only the f32 accumulation differs
// from the f64 one, so the matmul tests' bound (2e-5 of max(1, |y|)) holds.
TEST(MatvecQ8x3Act, CpuMatchesReferenceOnAwkwardShapes) {
  if (!q8x3act_vnni_supported()) std::printf("no AVX-512 VNNI here: the AVX2 and scalar tiles run\n");
  for (DType dtype : k_types) {
    for (const Shape& s : k_shapes) {
      const std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 29 + static_cast<uint32_t>(s.rows));
      const WeightView w{dtype, blocks.data(), s.rows, s.cols};
      const std::vector<float> x = make_x(s.num_tokens * s.cols, 31);
      const std::vector<float> bias = random_floats(s.rows, 37);
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        std::vector<float> want(static_cast<size_t>(s.num_tokens * s.rows));
        matvec_q8x3act_ref(x.data(), w, b, want.data(), s.num_tokens);
        for (SimdLevel level : test::supported_levels()) {
          test::LevelGuard guard(level);
          std::vector<float> got(want.size(), -12345.0f);
          matvec_q8x3act_cpu(x.data(), w, b, got.data(), s.num_tokens);
          EXPECT_TRUE(all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 2e-5))
              << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " tokens " << s.num_tokens
              << (b ? " bias" : "") << " at " << test::level_name(level);
        }
      }
    }
  }
}

// Against the f32-activation reference (matmul_ref, f64): quantizing moves each element by at
// most 3/4·d_x (see the quantizer's test), so |y − y_f32| ≤ Σ_b (3/4·d_b)·Σ_j |w_bj| plus the f32 summation slop (2e-5 of
// max(1, |y|), the f32 paths' tolerance). And the error must be far below q16act's (a step
// 2^-22 of max|x| against 2^-16).
TEST(MatvecQ8x3Act, WithinActivationQuantizationBoundOfF32Reference) {
  for (DType dtype : k_types) {
    double worst = 0.0, err = 0.0, err16 = 0.0;
    for (const Shape& s : k_shapes) {
      const std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 41 + static_cast<uint32_t>(s.cols));
      const WeightView w{dtype, blocks.data(), s.rows, s.cols};
      const std::vector<float> x = make_x(s.num_tokens * s.cols, 43);
      std::vector<float> want(static_cast<size_t>(s.num_tokens * s.rows)), got(want.size()), q16(want.size());
      matmul_ref(x.data(), w, nullptr, want.data(), s.num_tokens);
      matvec_q8x3act_cpu(x.data(), w, nullptr, got.data(), s.num_tokens);
      matvec_q16act_cpu(x.data(), w, nullptr, q16.data(), s.num_tokens);
      const int64_t nb = s.cols / 32;
      std::vector<int32_t> v(s.cols);
      std::vector<float> dx(nb), sx(nb);
      for (int64_t t = 0; t < s.num_tokens; ++t) {
        quantize_act_q8x3(&x[t * s.cols], s.cols, v.data(), dx.data(), sx.data());
        for (int64_t r = 0; r < s.rows; ++r) {
          const uint8_t* row = blocks.data() + r * dtype_row_bytes(dtype, s.cols);
          double bound = 0.0;
          for (int64_t b = 0; b < nb; ++b) {
            double abs_sum = 0.0;
            for (int j = 0; j < 32; ++j) abs_sum += std::fabs(block_value(dtype, row + b * dtype_block_bytes(dtype), j));
            bound += 0.7501 * dx[b] * abs_sum;
          }
          const int64_t i = t * s.rows + r;
          bound += 2e-5 * std::max(1.0, std::fabs(double{want[i]}));
          const double e = std::fabs(double{got[i]} - want[i]);
          ASSERT_LE(e, bound) << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " token " << t
                              << " row " << r << ": got " << got[i] << " want " << want[i];
          worst = std::max(worst, e / bound);
          err = std::max(err, e);
          err16 = std::max(err16, std::fabs(double{q16[i]} - want[i]));
        }
      }
    }
    EXPECT_GT(err, 0.0) << dtype_name(dtype) << ": equal to f32 everywhere: is it really quantizing?";
    EXPECT_LT(err * 20, err16) << dtype_name(dtype) << ": q8x3act max error " << err << " vs q16act " << err16;
    std::printf("%s: largest error %.3f of its bound; max |err| q8x3act %.3g, q16act %.3g\n", dtype_name(dtype), worst,
                err, err16);
  }
}

TEST(MatvecQ8x3Act, RowResultIndependentOfBatchSizeAndFusedEqualsAlone) {
  const ActGuard act(MatvecAct::q8x3);
  const int64_t rows = 83, cols = 576, tokens = 13;
  for (DType dtype : k_types) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 47);
    const WeightView w{dtype, blocks.data(), rows, cols};
    const std::vector<float> x = make_x(tokens * cols, 53), bias = random_floats(rows, 59);
    for (SimdLevel level : test::supported_levels()) {
      if (level == SimdLevel::scalar) continue;  // the scalar level of matmul is the f32 reference
      test::LevelGuard guard(level);
      std::vector<float> all(tokens * rows), one(rows), direct(tokens * rows);
      matmul_rowwise_cpu(x.data(), w, bias.data(), all.data(), tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        matmul_rowwise_cpu(&x[t * cols], w, bias.data(), one.data(), 1);
        EXPECT_EQ(0, std::memcmp(one.data(), &all[t * rows], rows * sizeof(float)))
            << dtype_name(dtype) << " at " << test::level_name(level) << ", token " << t;
      }
      matvec_q8x3act_cpu(x.data(), w, bias.data(), direct.data(), tokens);
      EXPECT_EQ(0, std::memcmp(direct.data(), all.data(), all.size() * sizeof(float)))
          << dtype_name(dtype) << ": matmul's tiles differ from the kernel called alone";
    }
  }
  const std::vector<uint8_t> wq = make_blocks(DType::q4_1, 576, cols, 81), wk = make_blocks(DType::q8_0, 195, cols, 82),
                             wv = make_blocks(DType::q4_0, 192, cols, 83);
  const WeightView views[3] = {{DType::q4_1, wq.data(), 576, cols}, {DType::q8_0, wk.data(), 195, cols},
                               {DType::q4_0, wv.data(), 192, cols}};
  for (int64_t n : {1, 2, 5}) {
    const std::vector<float> x = make_x(n * cols, 85);
    std::vector<float> fused[3], alone[3];
    MatmulOut outs[3];
    for (int i = 0; i < 3; ++i) {
      fused[i].assign(n * views[i].rows, 0.0f);
      alone[i].assign(n * views[i].rows, 1.0f);
      outs[i] = {views[i], nullptr, fused[i].data()};
      matmul_rowwise_cpu(x.data(), views[i], nullptr, alone[i].data(), n);
    }
    matmul_multi_cpu(x.data(), outs, 3, n, true);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(0, std::memcmp(fused[i].data(), alone[i].data(), fused[i].size() * 4)) << "matrix " << i << " tokens " << n;
  }
}

TEST(MatvecQ8x3Act, NanOrInfInXReachesEveryOutputOfItsTokenOnly) {
  const int64_t rows = 9, cols = 96, tokens = 3;
  for (DType dtype : k_types) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 61);
    const WeightView w{dtype, blocks.data(), rows, cols};
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = make_x(tokens * cols, 67);
      x[cols + 50] = bad;
      for (SimdLevel level : test::supported_levels()) {
        test::LevelGuard guard(level);
        std::vector<float> y(tokens * rows);
        matvec_q8x3act_cpu(x.data(), w, nullptr, y.data(), tokens);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_FALSE(std::isnan(y[r])) << "token 0 row " << r;
          EXPECT_TRUE(std::isnan(y[rows + r])) << dtype_name(dtype) << " " << test::level_name(level) << " row " << r;
          EXPECT_FALSE(std::isnan(y[2 * rows + r])) << "token 2 row " << r;
        }
      }
    }
  }
}

// The AVX2 tiles (with AVX-VNNI and with vpmaddubsw) do per lane what the AVX-512 VNNI tiles do,
// so the three give the same bits, row-major and tiles4 alike; where the CPU lacks AVX-512 VNNI or
// AVX-VNNI, the tiles it has are compared with each other (and with the reference above).
TEST(MatvecQ8x3Act, Avx2TilesEqualAvx512TilesBitForBit) {
  if (simd_level_supported() < SimdLevel::avx2) GTEST_SKIP() << "no AVX2 here";
  const bool have512 = q8x3act_vnni_supported();
  test::LevelGuard avx2(SimdLevel::avx2);
  const bool have_avxvnni = q8x3act_avxvnni_supported();
  std::printf("AVX-512 VNNI here: %s; AVX-VNNI here: %s\n", have512 ? "yes" : "no", have_avxvnni ? "yes" : "no");
  struct Restore {
    ~Restore() { q8x3act_avxvnni_enable(true); }
  } restore;
  int compared = 0;
  for (DType dtype : k_types) {
    for (const Shape& s : k_shapes) {
      std::vector<uint8_t> blocks = make_blocks(dtype, s.rows, s.cols, 91 + static_cast<uint32_t>(s.rows));
      if (dtype == DType::q8_0) {  // the extremes of the sign trick: −128 and 127 quants
        for (size_t i = 2; i < blocks.size(); i += 34 * 3 + 5) blocks[i] = 0x80;
        for (size_t i = 7; i < blocks.size(); i += 34 * 5 + 3) blocks[i] = 0x7f;
      }
      std::vector<uint8_t> tiled = blocks;
      const bool packable = s.rows >= 4;
      if (packable) weight_tiles4_pack(dtype, tiled.data(), s.rows, s.cols);
      WeightView row_view{dtype, blocks.data(), s.rows, s.cols};
      WeightView tile_view{dtype, tiled.data(), s.rows, s.cols};
      if (packable) tile_view.layout = WeightLayout::tiles4;
      const std::vector<float> x = make_x(s.num_tokens * s.cols, 97);
      const std::vector<float> bias = random_floats(s.rows, 99);
      const size_t n = static_cast<size_t>(s.num_tokens * s.rows);
      std::vector<std::vector<float>> outs;
      std::vector<std::string> names;
      const auto run = [&](const WeightView& w, const std::string& name) {
        outs.emplace_back(n, -1.0f);
        matvec_q8x3act_cpu(x.data(), w, bias.data(), outs.back().data(), s.num_tokens);
        names.push_back(name);
      };
      simd_level_override(SimdLevel::avx2);
      for (bool vnni : {true, false}) {
        if (vnni && !have_avxvnni) continue;
        q8x3act_avxvnni_enable(vnni);
        run(row_view, vnni ? "avx2+avxvnni rows" : "avx2 rows");
        run(tile_view, vnni ? "avx2+avxvnni tiles4" : "avx2 tiles4");
      }
      q8x3act_avxvnni_enable(true);
      if (have512) {
        simd_level_override(SimdLevel::avx512);
        run(row_view, "avx512 vnni rows");
        run(tile_view, "avx512 vnni tiles4");
      }
      for (size_t i = 1; i < outs.size(); ++i) {
        EXPECT_EQ(0, std::memcmp(outs[i].data(), outs[0].data(), n * 4))
            << dtype_name(dtype) << " rows " << s.rows << " cols " << s.cols << " tokens " << s.num_tokens << ": "
            << names[i] << " vs " << names[0];
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0);
}

TEST(MatvecQ8x3Act, DispatchAndNames) {
  const int64_t rows = 83, cols = 576, tokens = 3;
  for (DType dtype : k_types) {
    const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 71);
    const WeightView w{dtype, blocks.data(), rows, cols};
    const std::vector<float> x = make_x(tokens * cols, 73);
    std::vector<float> want(tokens * rows), got(tokens * rows), q16x2(tokens * rows);
    matvec_q8x3act_cpu(x.data(), w, nullptr, want.data(), tokens);
    matvec_q16x2act_cpu(x.data(), w, nullptr, q16x2.data(), tokens);
    EXPECT_NE(0, std::memcmp(want.data(), q16x2.data(), want.size() * 4)) << dtype_name(dtype);
    const ActGuard act(MatvecAct::q8x3);
    matmul_matvec_cpu(x.data(), w, nullptr, got.data(), tokens);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << dtype_name(dtype);
  }
  MatvecAct a = MatvecAct::f32;
  EXPECT_TRUE(matvec_act_from_name("q8x3act", &a));
  EXPECT_EQ(a, MatvecAct::q8x3);
  EXPECT_STREQ(matvec_act_name(MatvecAct::q8x3), "q8x3act");
  std::vector<uint8_t> f32w(4 * 32 * 4);
  const WeightView bad{DType::f32, f32w.data(), 4, 32};
  std::vector<float> x(32), y(4);
  EXPECT_DEATH(matvec_q8x3act_cpu(x.data(), bad, nullptr, y.data(), 1), "q8x3act");
}

}  // namespace
}  // namespace snap::kernels
