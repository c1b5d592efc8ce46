// The 4-row tile layout of block-format weights (kernels/weight_tiles.h): pack/unpack round
// trips over awkward shapes (row tails 0..3, last groups of 1..3 blocks), the documented byte
// positions pinned by hand, and every CPU matmul path on a tiles4 matrix bit-identical to the same
// path on the row-major matrix: the q8x3act VNNI tiles that read tiles4 (where the CPU has them),
// every other matvec mode and SIMD level (which unpack rows), fused matvecs mixing both layouts,
// the prefill GEMM path and the reference. Batch invariance holds on tiles4 as on rows.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
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

using test::ActGuard;
using test::make_blocks;
using test::random_floats;

const DType k_types[] = {DType::q8_0, DType::q4_0, DType::q4_1};

struct Shape {
  int64_t rows, cols;
};
// Row tails 0..3 and last groups of 1..4 blocks (cols/32 mod 4), SmolLM2's 576 = 4·4 + 2 blocks.
const std::vector<Shape> k_shapes = {{1, 32},   {3, 64},   {4, 32},   {4, 96},   {5, 128},  {7, 160},
                                     {8, 576},  {83, 576}, {13, 224}, {16, 512}, {66, 1536}, {769, 64}};

struct Tiled {
  std::vector<uint8_t> rows, tiles;
  WeightView row_view, tile_view;
};

Tiled make_tiled(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  Tiled t;
  t.rows = make_blocks(dtype, rows, cols, seed);
  t.tiles = t.rows;
  weight_tiles4_pack(dtype, t.tiles.data(), rows, cols);
  t.row_view = {dtype, t.rows.data(), rows, cols, WeightLayout::rows};
  t.tile_view = {dtype, t.tiles.data(), rows, cols, WeightLayout::tiles4};
  return t;
}

::testing::AssertionResult bitwise_equal(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  int bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      if (bad < 5) first << "\n  [" << i << "] got " << got[i] << " want " << want[i];
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ; first:" << first.str();
}

TEST(WeightTiles, PackThenUnpackGivesTheRowsBack) {
  for (DType dtype : k_types) {
    for (const Shape& s : k_shapes) {
      const Tiled t = make_tiled(dtype, s.rows, s.cols, 7 + static_cast<uint32_t>(s.rows));
      const int64_t row_bytes = dtype_row_bytes(dtype, s.cols);
      const int64_t tiled_bytes = s.rows / 4 * 4 * row_bytes;
      // Something moved in every whole tile; the row-major tail did not.
      if (tiled_bytes > 0) {
        EXPECT_NE(std::memcmp(t.tiles.data(), t.rows.data(), tiled_bytes), 0) << dtype_name(dtype);
      }
      EXPECT_EQ(std::memcmp(t.tiles.data() + tiled_bytes, t.rows.data() + tiled_bytes,
                            t.rows.size() - static_cast<size_t>(tiled_bytes)),
                0);
      std::vector<uint8_t> back(t.rows.size());
      weight_tiles4_unpack_rows(t.tile_view, 0, s.rows, back.data());
      EXPECT_EQ(back, t.rows) << dtype_name(dtype) << " " << s.rows << "x" << s.cols;
      // Any row range, starting and ending inside tiles.
      for (int64_t r0 : {int64_t{0}, int64_t{1}, int64_t{3}, s.rows / 2}) {
        for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{5}, s.rows}) {
          if (r0 + n > s.rows) continue;
          std::vector<uint8_t> part(static_cast<size_t>(n * row_bytes));
          weight_tiles4_unpack_rows(t.tile_view, r0, n, part.data());
          EXPECT_EQ(std::memcmp(part.data(), t.rows.data() + r0 * row_bytes, part.size()), 0)
              << dtype_name(dtype) << " " << s.rows << "x" << s.cols << " rows " << r0 << "+" << n;
        }
      }
    }
  }
}

// The byte positions of kernels/weight_tiles.h, by hand: 4 rows × 6 blocks (a full group, then
// a group of 2), block (row k, block b) at k·row_bytes + b·bb in the row-major matrix.
TEST(WeightTiles, LayoutIsTheDocumentedOne) {
  const int64_t rows = 4, cols = 6 * 32;
  for (DType dtype : k_types) {
    const int64_t bb = dtype_block_bytes(dtype), row_bytes = 6 * bb;
    std::vector<uint8_t> m(static_cast<size_t>(rows * row_bytes));
    for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<uint8_t>(i * 7 + 3);
    std::vector<uint8_t> p = m;
    weight_tiles4_pack(dtype, p.data(), rows, cols);
    auto src = [&](int k, int b, int byte) { return m[static_cast<size_t>(k * row_bytes + b * bb + byte)]; };
    const int hb = dtype == DType::q4_1 ? 4 : 2, qb = dtype == DType::q8_0 ? 32 : 16;
    // Group 0 (blocks 0..3, nblk 4) at 0; group 1 (blocks 4..5, nblk 2) at 16·bb.
    for (int g = 0; g < 2; ++g) {
      const int nblk = g == 0 ? 4 : 2;
      const int64_t group = g * 16 * bb;
      for (int k = 0; k < 4; ++k) {
        for (int j = 0; j < nblk; ++j) {
          const int b = 4 * g + j;
          const int64_t lane = 4 * j + k;
          EXPECT_EQ(p[group + lane * 2], src(k, b, 0)) << dtype_name(dtype) << " d of row " << k << " block " << b;
          EXPECT_EQ(p[group + lane * 2 + 1], src(k, b, 1));
          if (dtype == DType::q4_1) {
            EXPECT_EQ(p[group + 8 * nblk + lane * 2], src(k, b, 2)) << "m of row " << k << " block " << b;
            EXPECT_EQ(p[group + 8 * nblk + lane * 2 + 1], src(k, b, 3));
          }
          const int64_t quants = group + 4 * nblk * hb + k * nblk * qb;
          for (int e = 0; e < 16; ++e) {
            EXPECT_EQ(p[quants + 16 * j + e], src(k, b, hb + e)) << dtype_name(dtype) << " row " << k << " block " << b;
            if (qb == 32) {
              EXPECT_EQ(p[quants + 16 * nblk + 16 * j + e], src(k, b, hb + 16 + e));
            }
          }
        }
      }
    }
  }
}

// Every matvec mode at every SIMD level, 1..9 tokens: tiles4 gives the row-major result bit for bit.
TEST(WeightTiles, EveryMatvecPathEqualsRowMajorBitwise) {
  std::printf("q8x3act VNNI tiles read tiles4 here: %s\n", q8x3act_vnni_supported() ? "yes" : "no (rows unpacked)");
  const MatvecAct acts[] = {MatvecAct::f32, MatvecAct::q8, MatvecAct::q16, MatvecAct::q16x2, MatvecAct::q8x3};
  for (DType dtype : k_types) {
    for (const Shape& s : k_shapes) {
      const Tiled t = make_tiled(dtype, s.rows, s.cols, 11 + static_cast<uint32_t>(s.cols));
      const std::vector<float> bias = random_floats(s.rows, 5);
      for (int64_t n : {1, 2, 4, 5, 9}) {
        const std::vector<float> x = random_floats(n * s.cols, 3 + static_cast<uint32_t>(n));
        for (MatvecAct act : acts) {
          ActGuard guard(act);
          for (SimdLevel level : test::supported_levels()) {
            test::LevelGuard lg(level);
            std::vector<float> want(static_cast<size_t>(n * s.rows)), got(want.size());
            matmul_rowwise_cpu(x.data(), t.row_view, bias.data(), want.data(), n);
            matmul_rowwise_cpu(x.data(), t.tile_view, bias.data(), got.data(), n);
            EXPECT_TRUE(bitwise_equal(got, want)) << dtype_name(dtype) << " " << s.rows << "x" << s.cols << " tokens "
                                                  << n << " " << matvec_act_name(act) << " "
                                                  << test::level_name(level);
          }
        }
      }
    }
  }
}

// The q8x3act kernel called directly (its tests' and the benchmark's entry), and its reference.
TEST(WeightTiles, Q8x3ActKernelAndReferenceReadTiles) {
  for (DType dtype : k_types) {
    for (const Shape& s : k_shapes) {
      const Tiled t = make_tiled(dtype, s.rows, s.cols, 13);
      const int64_t n = 3;
      const std::vector<float> x = random_floats(n * s.cols, 17);
      std::vector<float> want(static_cast<size_t>(n * s.rows)), got(want.size());
      matvec_q8x3act_cpu(x.data(), t.row_view, nullptr, want.data(), n);
      matvec_q8x3act_cpu(x.data(), t.tile_view, nullptr, got.data(), n);
      EXPECT_TRUE(bitwise_equal(got, want)) << dtype_name(dtype) << " " << s.rows << "x" << s.cols;
      matvec_q8x3act_ref(x.data(), t.row_view, nullptr, want.data(), n);
      matvec_q8x3act_ref(x.data(), t.tile_view, nullptr, got.data(), n);
      EXPECT_TRUE(bitwise_equal(got, want)) << "ref " << dtype_name(dtype) << " " << s.rows << "x" << s.cols;
    }
  }
}

// A fused call (q, k, v in one region) whose parts mix layouts and row tails.
TEST(WeightTiles, FusedMatvecMixingLayoutsEqualsSingleCalls) {
  for (DType dtype : k_types) {
    const Tiled q = make_tiled(dtype, 83, 576, 1), k = make_tiled(dtype, 12, 576, 2), v = make_tiled(dtype, 9, 576, 3);
    for (int64_t n : {1, 6}) {
      const std::vector<float> x = random_floats(n * 576, 23);
      std::vector<float> yq(static_cast<size_t>(n * 83)), yk(static_cast<size_t>(n * 12)), yv(static_cast<size_t>(n * 9));
      const MatmulOut outs[3] = {{q.tile_view, nullptr, yq.data()}, {k.row_view, nullptr, yk.data()},
                                 {v.tile_view, nullptr, yv.data()}};
      matmul_multi_cpu(x.data(), outs, 3, n, true);
      std::vector<float> wq(yq.size()), wk(yk.size()), wv(yv.size());
      matmul_rowwise_cpu(x.data(), q.row_view, nullptr, wq.data(), n);
      matmul_rowwise_cpu(x.data(), k.row_view, nullptr, wk.data(), n);
      matmul_rowwise_cpu(x.data(), v.row_view, nullptr, wv.data(), n);
      EXPECT_TRUE(bitwise_equal(yq, wq)) << dtype_name(dtype);
      EXPECT_TRUE(bitwise_equal(yk, wk)) << dtype_name(dtype);
      EXPECT_TRUE(bitwise_equal(yv, wv)) << dtype_name(dtype);
    }
  }
}

// Prefill: matmul_cpu at GEMM sizes converts the same f32 rows from either layout; and the
// reference reads tiles4 too.
TEST(WeightTiles, GemmPathAndReferenceEqualRowMajor) {
  for (DType dtype : k_types) {
    for (const Shape& s : {Shape{83, 576}, Shape{66, 1536}, Shape{7, 160}}) {
      const Tiled t = make_tiled(dtype, s.rows, s.cols, 31);
      const int64_t n = 70;
      const std::vector<float> x = random_floats(n * s.cols, 37);
      std::vector<float> want(static_cast<size_t>(n * s.rows)), got(want.size());
      matmul_gemm_cpu(x.data(), t.row_view, nullptr, want.data(), n);
      matmul_gemm_cpu(x.data(), t.tile_view, nullptr, got.data(), n);
      EXPECT_TRUE(bitwise_equal(got, want)) << "gemm " << dtype_name(dtype) << " " << s.rows << "x" << s.cols;
      const int64_t m = 2;
      std::vector<float> rw(static_cast<size_t>(m * s.rows)), rg(rw.size());
      matmul_ref(x.data(), t.row_view, nullptr, rw.data(), m);
      matmul_ref(x.data(), t.tile_view, nullptr, rg.data(), m);
      EXPECT_TRUE(bitwise_equal(rg, rw)) << "ref " << dtype_name(dtype);
    }
  }
}

// A token's result does not depend on what else is in the call (tiles of 1..4 tokens).
TEST(WeightTiles, BatchInvariantOnTiles) {
  ActGuard guard(MatvecAct::q8x3);
  for (DType dtype : k_types) {
    const Tiled t = make_tiled(dtype, 83, 576, 41);
    const int64_t n = 7;
    const std::vector<float> x = random_floats(n * 576, 43);
    std::vector<float> batch(static_cast<size_t>(n * 83));
    matmul_rowwise_cpu(x.data(), t.tile_view, nullptr, batch.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> alone(83);
      matmul_rowwise_cpu(x.data() + i * 576, t.tile_view, nullptr, alone.data(), 1);
      const std::vector<float> row(batch.begin() + i * 83, batch.begin() + (i + 1) * 83);
      EXPECT_TRUE(bitwise_equal(alone, row)) << dtype_name(dtype) << " token " << i;
    }
  }
}

TEST(WeightTilesDeathTest, KernelsThatReadRowsRefuseTiles) {
  const Tiled t = make_tiled(DType::q4_1, 8, 64, 1);
  const std::vector<float> x = random_floats(64, 1);
  std::vector<float> y(8);
  EXPECT_DEATH(matvec_q16act_cpu(x.data(), t.tile_view, nullptr, y.data(), 1), "tiles4");
  EXPECT_DEATH(matvec_q8act_cpu(x.data(), t.tile_view, nullptr, y.data(), 1), "tiles4");
}

}  // namespace
}  // namespace snap::kernels
