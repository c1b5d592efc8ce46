// q8_0 KV rows (kernels/cpu/kv_q8.h): per group of 32 values, amax → f16 scale amax/127 and
// int8 values rounded to nearest even; non-finite groups become NaN. The AVX2 path finds
// amax with a sign-cleared max over 8 lanes and rounds with vcvtps2dq (MXCSR's default
// nearest even), so it equals the scalar std::nearbyint path bit for bit. Prefill writes every
// K/V row once (SmolLM2 at 8K: 92 M values), so the write path is vectorized too.
#include "kernels/cpu/kv_q8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "kernels/cpu/simd.h"

namespace snap::kernels {

namespace {

// The scale and the multiplier of one group from its max |x| (NaN when a value is not finite).
struct GroupScale {
  uint16_t d_bits = 0;
  float inv = 0.0f;  // 127 / amax, or 0 (amax 0 or non-finite)
};
GroupScale group_scale(float amax, bool finite) {
  GroupScale g;
  if (!finite) {
    g.d_bits = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
    return g;
  }
  g.d_bits = f32_to_f16(amax / 127.0f);
  g.inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  return g;
}

void store_scale(uint8_t* row, int64_t head_dim, int64_t group, uint16_t d_bits) {
  std::memcpy(row + head_dim + 2 * group, &d_bits, 2);
}

SNAP_TARGET_AVX2 float hmax_avx2(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace

void kv_q8_quantize_ref(const float* x, int64_t head_dim, void* row_out) {
  auto* row = static_cast<uint8_t*>(row_out);
  auto* q = reinterpret_cast<int8_t*>(row);
  for (int64_t g = 0; g * k_kv_q8_group < head_dim; ++g) {
    const int64_t lo = g * k_kv_q8_group, hi = std::min(head_dim, lo + k_kv_q8_group);
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = lo; i < hi; ++i) {
      finite = finite && std::isfinite(x[i]);
      amax = std::max(amax, std::fabs(x[i]));
    }
    const GroupScale s = group_scale(amax, finite);
    for (int64_t i = lo; i < hi; ++i) q[i] = static_cast<int8_t>(finite ? std::nearbyint(x[i] * s.inv) : 0.0f);
    store_scale(row, head_dim, g, s.d_bits);
  }
}

void kv_q8_dequantize_ref(const void* row, int64_t head_dim, float* out) {
  for (int64_t i = 0; i < head_dim; ++i) out[i] = kv_q8_value(row, head_dim, i);
}

SNAP_TARGET_AVX2 void kv_q8_quantize_avx2(const float* x, int64_t head_dim, void* row_out) {
  CHECK(head_dim % 8 == 0) << "kv_q8: AVX2 row of " << head_dim << " values";
  auto* row = static_cast<uint8_t*>(row_out);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  for (int64_t g = 0; g * k_kv_q8_group < head_dim; ++g) {
    const int64_t lo = g * k_kv_q8_group, hi = std::min(head_dim, lo + k_kv_q8_group);
    __m256 amax = _mm256_setzero_ps();
    __m256 bad = _mm256_setzero_ps();  // lanes with a NaN or ±inf
    for (int64_t i = lo; i < hi; i += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // a >= inf or NaN
      amax = _mm256_max_ps(amax, a);
    }
    const bool finite = _mm256_movemask_ps(bad) == 0;
    const GroupScale s = group_scale(hmax_avx2(amax), finite);
    if (!finite) {  // NaN · 0 would convert to INT_MIN: store the reference's zeros
      std::memset(row + lo, 0, static_cast<size_t>(hi - lo));
      store_scale(row, head_dim, g, s.d_bits);
      continue;
    }
    const __m256 inv = _mm256_set1_ps(s.inv);
    for (int64_t i = lo; i < hi; i += 8) {  // |x·inv| <= 127: rounds into int8
      const __m256i qi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
      const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(row + i), _mm_packs_epi16(w, w));
    }
    store_scale(row, head_dim, g, s.d_bits);
  }
}

SNAP_TARGET_AVX2 void kv_q8_dequantize_avx2(const void* row, int64_t head_dim, float* out) {
  CHECK(head_dim % 8 == 0) << "kv_q8: AVX2 row of " << head_dim << " values";
  const auto* q = static_cast<const uint8_t*>(row);
  for (int64_t i = 0; i < head_dim; i += 8) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(kv_q8_scale_bits(row, head_dim, i)));
    const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(w)));
  }
}

}  // namespace snap::kernels
