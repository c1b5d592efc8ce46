// Shared helpers for the kernel tests: seeded random data, the normalized comparison
// (max |got − want| / max(1, max |want|) ≤ tol, NaN never passes, first mismatches
// printed with their index) and the list of SIMD levels this CPU can run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <vector>

#include "kernels/cpu/simd.h"

namespace snap::kernels::test {

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

inline ::testing::AssertionResult all_close(const float* got, const float* want, int64_t n, double tol) {
  double max_ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(want[i])) return ::testing::AssertionFailure() << "reference has NaN at index " << i;
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  const double norm = std::max(1.0, max_ref);
  double max_err = 0.0;
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]) / norm;
    if (std::isnan(got[i]) || !(err <= tol)) {
      if (bad < 5) first << "\n  [" << i << "] got " << got[i] << " want " << want[i];
      ++bad;
    }
    if (!std::isnan(err)) max_err = std::max(max_err, err);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " mismatch (normalized max err " << max_err
                                       << ", tol " << tol << "); first:" << first.str();
}

inline std::vector<SimdLevel> supported_levels() {
  std::vector<SimdLevel> v{SimdLevel::scalar};
  if (simd_level_supported() >= SimdLevel::avx2) v.push_back(SimdLevel::avx2);
  if (simd_level_supported() >= SimdLevel::avx512) v.push_back(SimdLevel::avx512);
  return v;
}

inline const char* level_name(SimdLevel l) {
  return l == SimdLevel::avx512 ? "avx512" : l == SimdLevel::avx2 ? "avx2" : "scalar";
}

// Forces each supported level for the scope; restores the best level after.
struct LevelGuard {
  explicit LevelGuard(SimdLevel l) { simd_level_override(l); }
  ~LevelGuard() { simd_level_override(simd_level_supported()); }
};

}  // namespace snap::kernels::test
