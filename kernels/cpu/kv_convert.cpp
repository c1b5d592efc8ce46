// f32 <-> bf16/f16/q8_0 row conversion for the KV cache (kernels/kv_convert.h); q8_0 rows
// are kernels/cpu/kv_q8.cpp's. The scalar path
// uses common/dtype.h; the fast path converts 16 (AVX-512) or 8 (AVX2 + F16C) at a time:
// f16 with vcvtps2ph/vcvtph2ps (round to nearest even), bf16 with integer rounding
// u + 0x7fff + ((u >> 16) & 1) on the bit pattern, NaNs made quiet like the scalar code.
// Prefill writes every K/V row once (8K tokens × 30 layers × 3 heads × 2 × 64 = 92 M
// elements for SmolLM2): scalar f16 rounding is ~2 ns an element, the vector path ~0.1 ns.
#include "kernels/kv_convert.h"

#include <cstring>

#include "common/check.h"
#include "kernels/cpu/kv_q8.h"
#include "kernels/cpu/simd.h"

namespace snap::kernels {

namespace {

void check_dtype(DType dtype) {
  CHECK(kv_dtype_supported(dtype)) << "kv_convert: KV element type " << dtype_name(dtype) << " (f32, bf16, f16 or q8_0)";
}

// q8_0 on the AVX2 path when the row allows it (AVX-512 machines use it too: one row is at
// most a few 32-value groups, so wider vectors would buy little).
bool q8_simd(int64_t n) { return simd_level() != SimdLevel::scalar && n % 8 == 0; }

// --- AVX-512 ---------------------------------------------------------------------------
SNAP_TARGET_AVX512 __m256i bf16_round_avx512(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

SNAP_TARGET_AVX512 int64_t convert_avx512(const float* src, DType dtype, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    const __m256i h = dtype == DType::f16 ? _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                          : bf16_round_avx512(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  return i;
}

SNAP_TARGET_AVX512 int64_t to_f32_avx512(const uint16_t* src, DType dtype, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512 x = dtype == DType::f16 ? _mm512_cvtph_ps(h)
                                         : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    _mm512_storeu_ps(dst + i, x);
  }
  return i;
}

// --- AVX2 (+F16C) ----------------------------------------------------------------------
SNAP_TARGET_AVX2 __m128i bf16_round_avx2(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, quiet, nan);
  // 8 × u32 (each < 2^16) → 8 × u16: packus works within 128-bit lanes, then join the halves.
  const __m256i packed = _mm256_packus_epi32(r, r);  // lane 0: r0..3 r0..3, lane 1: r4..7 r4..7
  return _mm_unpacklo_epi64(_mm256_castsi256_si128(packed), _mm256_extracti128_si256(packed, 1));
}

SNAP_TARGET_AVX2 int64_t convert_avx2(const float* src, DType dtype, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    const __m128i h = dtype == DType::f16 ? _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                          : bf16_round_avx2(x);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}

SNAP_TARGET_AVX2 int64_t to_f32_avx2(const uint16_t* src, DType dtype, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 x = dtype == DType::f16 ? _mm256_cvtph_ps(h)
                                         : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    _mm256_storeu_ps(dst + i, x);
  }
  return i;
}

void convert_scalar(const float* src, DType dtype, uint16_t* dst, int64_t from, int64_t n) {
  for (int64_t i = from; i < n; ++i) dst[i] = dtype == DType::f16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
}

void to_f32_scalar(const uint16_t* src, DType dtype, float* dst, int64_t from, int64_t n) {
  for (int64_t i = from; i < n; ++i) dst[i] = dtype == DType::f16 ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
}

}  // namespace

bool kv_dtype_supported(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::q8_0;
}

int64_t kv_row_bytes(DType dtype, int64_t head_dim) {
  check_dtype(dtype);
  return dtype == DType::q8_0 ? kv_q8_row_bytes(head_dim) : head_dim * dtype_size(dtype);
}

void kv_convert_ref(const float* src, DType dtype, void* dst, int64_t n) {
  check_dtype(dtype);
  if (dtype == DType::q8_0) {
    kv_q8_quantize_ref(src, n, dst);
    return;
  }
  if (dtype == DType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  convert_scalar(src, dtype, static_cast<uint16_t*>(dst), 0, n);
}

void kv_convert_cpu(const float* src, DType dtype, void* dst, int64_t n) {
  check_dtype(dtype);
  if (dtype == DType::q8_0) {
    q8_simd(n) ? kv_q8_quantize_avx2(src, n, dst) : kv_q8_quantize_ref(src, n, dst);
    return;
  }
  if (dtype == DType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  const SimdLevel level = simd_level();
  const int64_t done = level == SimdLevel::avx512 ? convert_avx512(src, dtype, d, n)
                       : level == SimdLevel::avx2 ? convert_avx2(src, dtype, d, n)
                                                  : 0;
  convert_scalar(src, dtype, d, done, n);
}

void kv_to_f32_ref(const void* src, DType dtype, float* dst, int64_t n) {
  check_dtype(dtype);
  if (dtype == DType::q8_0) {
    kv_q8_dequantize_ref(src, n, dst);
    return;
  }
  if (dtype == DType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  to_f32_scalar(static_cast<const uint16_t*>(src), dtype, dst, 0, n);
}

void kv_to_f32_cpu(const void* src, DType dtype, float* dst, int64_t n) {
  check_dtype(dtype);
  if (dtype == DType::q8_0) {
    q8_simd(n) ? kv_q8_dequantize_avx2(src, n, dst) : kv_q8_dequantize_ref(src, n, dst);
    return;
  }
  if (dtype == DType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  const SimdLevel level = simd_level();
  const int64_t done = level == SimdLevel::avx512 ? to_f32_avx512(s, dtype, dst, n)
                       : level == SimdLevel::avx2 ? to_f32_avx2(s, dtype, dst, n)
                                                  : 0;
  to_f32_scalar(s, dtype, dst, done, n);
}

}  // namespace snap::kernels
