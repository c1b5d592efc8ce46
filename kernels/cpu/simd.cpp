// Run-time SIMD level: detected once from cpuid, optionally lowered by env SNAP_SIMD
// (avx2|scalar) or by simd_level_override() in tests. simd_level_name() reports it.
#include "kernels/cpu/simd.h"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/kernels.h"

namespace snap::kernels {

namespace {

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

SimdLevel detect() {
  __builtin_cpu_init();
  const bool f16c = has_f16c();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && f16c)
    return SimdLevel::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) return SimdLevel::avx2;
  return SimdLevel::scalar;
}

SimdLevel clamp(SimdLevel want) {
  const SimdLevel have = simd_level_supported();
  return static_cast<uint8_t>(want) < static_cast<uint8_t>(have) ? want : have;
}

SimdLevel from_env() {
  const char* e = std::getenv("SNAP_SIMD");
  if (e == nullptr) return simd_level_supported();
  if (std::strcmp(e, "scalar") == 0) return SimdLevel::scalar;
  if (std::strcmp(e, "avx2") == 0) return clamp(SimdLevel::avx2);
  return simd_level_supported();
}

std::atomic<int> g_override{-1};

}  // namespace

SimdLevel simd_level_supported() {
  static const SimdLevel level = detect();
  return level;
}

SimdLevel simd_level() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return static_cast<SimdLevel>(o);
  static const SimdLevel level = from_env();
  return level;
}

void simd_level_override(SimdLevel level) { g_override.store(static_cast<int>(clamp(level)), std::memory_order_relaxed); }

const char* simd_level_name() {
  switch (simd_level()) {
    case SimdLevel::avx512: return "avx512";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::scalar: return "scalar";
  }
  return "scalar";
}

}  // namespace snap::kernels
