// GeGLU (gelu tanh approximation, Gemma 3's MLP activation): the f64 reference and the
// AVX2/AVX-512 paths. tanh(u) is computed as 1 - 2 / (1 + e^(2u)), with e^(2u) from the
// vector exp of simd.h (≈2 ulp; its argument clamp makes large |u| saturate to ±1 exactly
// as tanh does in f32). Chunks of 4096 elements go to OpenMP threads for prompt batches.
#include "kernels/cpu/geglu.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/simd.h"

namespace snap::kernels {

namespace {

// 2048 elements (one Gemma 3 270M token) take ~1 µs: fork only for batches.
constexpr int64_t k_parallel_min_elems = 1 << 16;
constexpr int64_t k_chunk = 4096;
constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
constexpr float k_cubic = 0.044715f;

void chunk_scalar(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i];
    const float inner = k_sqrt_2_over_pi * (x + k_cubic * x * x * x);
    o[i] = 0.5f * x * (1.0f + std::tanh(inner)) * u[i];
  }
}

SNAP_TARGET_AVX2 void chunk_avx2(const float* g, const float* u, float* o, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 two = _mm256_set1_ps(2.0f);
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 c0 = _mm256_set1_ps(k_sqrt_2_over_pi);
  const __m256 c1 = _mm256_set1_ps(k_cubic);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 inner = _mm256_mul_ps(c0, _mm256_fmadd_ps(c1, x3, x));
    const __m256 e = exp_avx2(_mm256_mul_ps(two, inner));
    const __m256 th = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(one, e)));
    const __m256 gelu = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, th));
    // exp_avx2 clamps its argument, so a NaN gate would come out finite: keep it NaN.
    const __m256 nan_mask = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 r = _mm256_blendv_ps(gelu, x, nan_mask);
    _mm256_storeu_ps(o + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
  }
  chunk_scalar(g + i, u + i, o + i, n - i);
}

SNAP_TARGET_AVX512 void chunk_avx512(const float* g, const float* u, float* o, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 two = _mm512_set1_ps(2.0f);
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 c0 = _mm512_set1_ps(k_sqrt_2_over_pi);
  const __m512 c1 = _mm512_set1_ps(k_cubic);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 inner = _mm512_mul_ps(c0, _mm512_fmadd_ps(c1, x3, x));
    const __m512 e = exp_avx512(_mm512_mul_ps(two, inner));
    const __m512 th = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(one, e)));
    __m512 gelu = _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, th));
    gelu = _mm512_mask_mov_ps(gelu, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
    _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(gelu, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace

void geglu_ref(const float* gate, const float* up, float* out, int64_t n) {
  const double c0 = std::sqrt(2.0 / 3.14159265358979323846);
  for (int64_t i = 0; i < n; ++i) {
    const double x = gate[i];
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(c0 * (x + 0.044715 * x * x * x))) * up[i]);
  }
}

void geglu_cpu(const float* gate, const float* up, float* out, int64_t n) {
  void (*chunk)(const float*, const float*, float*, int64_t) = chunk_scalar;
  switch (simd_level()) {
    case SimdLevel::avx512: chunk = chunk_avx512; break;
    case SimdLevel::avx2: chunk = chunk_avx2; break;
    case SimdLevel::scalar: break;
  }
  const int64_t num_chunks = (n + k_chunk - 1) / k_chunk;
#pragma omp parallel for schedule(static) if (n >= k_parallel_min_elems)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t i = c * k_chunk;
    chunk(gate + i, up + i, out + i, std::min(k_chunk, n - i));
  }
}

}  // namespace snap::kernels
