// The AVX-512 VNNI tiles of q16act / q16x2act (kernels/cpu/matvec_q16act_vnni.cpp). The
// dispatch checks run everywhere: unless enabled (SNAP_MATVEC_VNNI=1 / q16act_vnni_enable),
// below the avx512 level, or on a CPU without avx512vnni, the matvec takes the AVX2 tiles. The kernel checks (against the scalar reference over awkward
// shapes, batch invariance bitwise, NaN per token) need AVX-512 VNNI and are skipped, saying
// so, elsewhere: on the machine this was written on (AVX2 only) they have never run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/matvec_q16act.h"
#include "kernels/kernels.h"
#include "kernels/matvec_act.h"
#include "tests/kernels/block_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

using test::all_close;
using test::random_floats;
using test::make_blocks;

const DType k_types[] = {DType::q8_0, DType::q4_0, DType::q4_1};

std::vector<float> make_x(int64_t n, uint32_t seed) {
  std::vector<float> x = random_floats(n, seed);
  for (int64_t i = 0; i < n; i += 97) x[i] *= 20.0f;
  return x;
}

TEST(MatvecQ16ActVnni, DispatchTakesAvx2TilesUnlessEnabledOnAvx512Vnni) {
  const bool saved = q16act_vnni_enabled();
  for (bool on : {false, true})
  for (SimdLevel level : test::supported_levels()) {
    if (level == SimdLevel::scalar) continue;
    test::LevelGuard guard(level);
    q16act_vnni_enable(on);
    const bool vnni = on && level == SimdLevel::avx512 && q16act_vnni_supported();
    for (DType d : k_types)
      for (int nt = 1; nt <= 4; ++nt)
        for (bool split : {false, true}) {
          const Q16TileFn want = vnni ? q16act_tile_avx512vnni(d, nt, split) : q16act_tile_avx2(d, nt, split);
          EXPECT_EQ(q16act_tile(d, nt, split), want) << dtype_name(d) << " nt " << nt << " at "
                                                      << test::level_name(level);
        }
  }
  q16act_vnni_enable(saved);
  if (simd_level_supported() < SimdLevel::avx512) {
    EXPECT_FALSE(q16act_vnni_supported());
  }
}

class VnniKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!q16act_vnni_supported()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI: the VNNI tiles are not run here";
    saved_ = q16act_vnni_enabled();
    q16act_vnni_enable(true);
  }
  void TearDown() override { q16act_vnni_enable(saved_); }
  bool saved_ = false;
  test::LevelGuard guard_{SimdLevel::avx512};
};

TEST_F(VnniKernel, MatchesScalarReferenceOnAwkwardShapes) {
  const int64_t shapes[][3] = {{1, 32, 1}, {7, 64, 5}, {83, 576, 1}, {83, 1536, 4}, {769, 576, 3}, {13, 224, 9}};
  for (bool split : {false, true})
    for (DType dtype : k_types)
      for (const auto& s : shapes) {
        const std::vector<uint8_t> blocks = make_blocks(dtype, s[0], s[1], 29 + static_cast<uint32_t>(s[0]));
        const WeightView w{dtype, blocks.data(), s[0], s[1]};
        const std::vector<float> x = make_x(s[2] * s[1], 31), bias = random_floats(s[0], 37);
        std::vector<float> want(s[2] * s[0]), got(want.size(), -1.0f);
        (split ? matvec_q16x2act_ref : matvec_q16act_ref)(x.data(), w, bias.data(), want.data(), s[2]);
        (split ? matvec_q16x2act_cpu : matvec_q16act_cpu)(x.data(), w, bias.data(), got.data(), s[2]);
        EXPECT_TRUE(all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 2e-5))
            << (split ? "q16x2act " : "q16act ") << dtype_name(dtype) << " rows " << s[0] << " cols " << s[1]
            << " tokens " << s[2];
      }
}

TEST_F(VnniKernel, RowResultIndependentOfBatchSizeAndNanStaysInItsToken) {
  const int64_t rows = 83, cols = 576, tokens = 9;
  for (bool split : {false, true})
    for (DType dtype : k_types) {
      const std::vector<uint8_t> blocks = make_blocks(dtype, rows, cols, 47);
      const WeightView w{dtype, blocks.data(), rows, cols};
      std::vector<float> x = make_x(tokens * cols, 53);
      auto run = split ? matvec_q16x2act_cpu : matvec_q16act_cpu;
      std::vector<float> all(tokens * rows), one(rows);
      run(x.data(), w, nullptr, all.data(), tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        run(&x[t * cols], w, nullptr, one.data(), 1);
        EXPECT_EQ(0, std::memcmp(one.data(), &all[t * rows], rows * 4)) << dtype_name(dtype) << " token " << t;
      }
      x[cols + 5] = std::numeric_limits<float>::quiet_NaN();
      run(x.data(), w, nullptr, all.data(), 3);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_FALSE(std::isnan(all[r]));
        EXPECT_TRUE(std::isnan(all[rows + r])) << dtype_name(dtype) << " row " << r;
        EXPECT_FALSE(std::isnan(all[2 * rows + r]));
      }
    }
}

}  // namespace
}  // namespace snap::kernels
