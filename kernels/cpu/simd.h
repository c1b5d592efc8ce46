// Internal to kernels/cpu: run-time SIMD dispatch and the vector helpers the ops share.
// The library is compiled without -march, so every vector function carries its own
// __attribute__((target(...))) and callers pick one with simd_level() at run time.
// Levels: avx512 = AVX-512 F+BW (+VL), avx2 = AVX2+FMA+F16C, scalar = plain C++.
#pragma once

#include <immintrin.h>

// g++ 12 warns "'__Y' is used uninitialized" inside its own AVX-512 headers when the
// intrinsics are inlined into target("avx512f") functions (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <cstdint>

namespace snap::kernels {

enum class SimdLevel : uint8_t { scalar, avx2, avx512 };

// The best level this CPU supports, lowered by env SNAP_SIMD=avx2|scalar (read once).
SimdLevel simd_level();
// Tests force each path in turn; a level above what the CPU supports is clamped.
void simd_level_override(SimdLevel level);
// The level the CPU supports, ignoring overrides.
SimdLevel simd_level_supported();

#define SNAP_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SNAP_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

// --- horizontal sums --------------------------------------------------------
SNAP_TARGET_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
SNAP_TARGET_AVX2 inline int hsum_epi32_avx2(__m256i v) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  return _mm_cvtsi128_si32(s4);
}

SNAP_TARGET_AVX512 inline float hsum_avx512(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xb1));
  __m128 s = _mm512_castps512_ps128(v);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// --- exp --------------------------------------------------------------------
// e^x as 2^n · p(r), n = round(x·log2 e), r = x − n·ln 2 (two-part ln 2), p the degree-7
// Taylor polynomial (|r| ≤ 0.35: truncation 5e-9): max relative error ≈ 2 ulp on [−87, 88]. Inputs are clamped
// to that range (so −inf → ~1e−38, not 0, harmless for softmax and silu); the clamp keeps
// NaN because max/min return their second operand when either is NaN.
namespace exp_detail {
constexpr float k_log2e = 1.44269504088896341f;
constexpr float k_ln2_hi = 0.693359375f;
constexpr float k_ln2_lo = -2.12194440e-4f;
constexpr float k_c2 = 0.5f;
constexpr float k_c3 = 1.0f / 6.0f;
constexpr float k_c4 = 1.0f / 24.0f;
constexpr float k_c5 = 1.0f / 120.0f;
constexpr float k_c6 = 1.0f / 720.0f;
constexpr float k_c7 = 1.0f / 5040.0f;
}  // namespace exp_detail

SNAP_TARGET_AVX512 inline __m512 exp_avx512(__m512 x) {
  using namespace exp_detail;
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(k_log2e)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(k_ln2_hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(k_ln2_lo), r);
  __m512 p = _mm512_set1_ps(k_c7);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k_c6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k_c5));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k_c4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k_c3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k_c2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);  // p · 2^n, NaN in p stays NaN
}

SNAP_TARGET_AVX2 inline __m256 exp_avx2(__m256 x) {
  using namespace exp_detail;
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(k_log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(k_ln2_hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(k_ln2_lo), r);
  __m256 p = _mm256_set1_ps(k_c7);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k_c6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k_c5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k_c4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k_c3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k_c2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^n built in the exponent field; n ∈ [−126, 127] after the clamp, so it never overflows.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace snap::kernels
