// GeGLU (Gemma 3's MLP activation, kernels/cpu/geglu): the SIMD path at every level the
// machine has against the f64 reference over awkward lengths, pinned values of gelu_tanh
// computed independently (torch.nn.functional.gelu(approximate="tanh") in float64), and
// NaN propagation. Needs no model.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/geglu.h"
#include "kernels/cpu/simd.h"

namespace snap::kernels {
namespace {

std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> out = {SimdLevel::scalar};
  if (simd_level_supported() >= SimdLevel::avx2) out.push_back(SimdLevel::avx2);
  if (simd_level_supported() >= SimdLevel::avx512) out.push_back(SimdLevel::avx512);
  return out;
}

struct LevelGuard {
  ~LevelGuard() { simd_level_override(simd_level_supported()); }
};

TEST(Geglu, PinnedValuesOfGeluTanh) {
  // gelu_tanh(x) for up = 1, from torch (float64): x -> value.
  const std::vector<std::pair<float, double>> pinned = {
      {0.0f, 0.0},
      {1.0f, 0.8411919906082768},
      {-1.0f, -0.1588080093917233},
      {3.0f, 2.996362607918227},
      {-3.0f, -0.0036373920817729943},
      {0.5f, 0.34571400982514394},
      {-10.0f, -0.0},
      {10.0f, 10.0},
  };
  LevelGuard guard;
  for (SimdLevel lv : levels()) {
    simd_level_override(lv);
    std::vector<float> g, u, out(pinned.size() + 16), ref(pinned.size() + 16);
    for (auto& p : pinned) {
      g.push_back(p.first);
      u.push_back(1.0f);
    }
    // Pad to a full vector so the SIMD body (not only the scalar tail) sees the values.
    g.resize(pinned.size() + 16, 0.0f);
    u.resize(pinned.size() + 16, 1.0f);
    geglu_cpu(g.data(), u.data(), out.data(), static_cast<int64_t>(g.size()));
    geglu_ref(g.data(), u.data(), ref.data(), static_cast<int64_t>(g.size()));
    for (size_t i = 0; i < pinned.size(); ++i) {
      const double tol = 1e-6 * std::max(1.0, std::fabs(pinned[i].second)) + 1e-7;
      EXPECT_NEAR(out[i], pinned[i].second, tol) << "x = " << pinned[i].first << " level " << static_cast<int>(lv);
      EXPECT_NEAR(ref[i], pinned[i].second, tol) << "ref x = " << pinned[i].first;
    }
  }
}

TEST(Geglu, SimdMatchesReferenceOverAwkwardLengths) {
  LevelGuard guard;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int64_t n : {1, 7, 8, 15, 16, 17, 83, 769, 2048, 5125, 70001}) {
    std::vector<float> g(n), u(n), ref(n), out(n);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = dist(rng);
      u[i] = dist(rng);
    }
    geglu_ref(g.data(), u.data(), ref.data(), n);
    for (SimdLevel lv : levels()) {
      simd_level_override(lv);
      geglu_cpu(g.data(), u.data(), out.data(), n);
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double tol = 2e-6 * std::fabs(ref[i]) + 1e-6 * std::fabs(u[i]);
        if (!(std::fabs(out[i] - ref[i]) <= tol) && bad++ < 3) {
          ADD_FAILURE() << "n " << n << " level " << static_cast<int>(lv) << " i " << i << ": g " << g[i] << " u "
                        << u[i] << " got " << out[i] << " ref " << ref[i];
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(Geglu, NanPropagatesAndOutMayAliasGate) {
  LevelGuard guard;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (SimdLevel lv : levels()) {
    simd_level_override(lv);
    std::vector<float> g(40, 0.5f), u(40, 2.0f);
    g[3] = nan;   // in a vector body
    g[37] = nan;  // in the tail (AVX2) / a masked lane (AVX-512)
    u[20] = nan;
    geglu_cpu(g.data(), u.data(), g.data(), 40);  // in place
    EXPECT_TRUE(std::isnan(g[3])) << static_cast<int>(lv);
    EXPECT_TRUE(std::isnan(g[37])) << static_cast<int>(lv);
    EXPECT_TRUE(std::isnan(g[20])) << static_cast<int>(lv);
    EXPECT_NEAR(g[0], 2.0 * 0.34571400982514394, 2e-6);
  }
}

}  // namespace
}  // namespace snap::kernels
