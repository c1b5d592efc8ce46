// SwiGLU: out[i] = silu(gate[i]) · up[i], silu(g) = g / (1 + e^−g); out may alias gate.
// swiglu_ref uses std::exp in f64; swiglu_cpu the vector exp of simd.h (≈2 ulp), so the
// two agree to ~1e-6 relative. NaN in gate or up propagates to out.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace snap::kernels {

namespace {

// 1536 elements (one SmolLM2 token) take ~0.3 µs: fork only for batches.
constexpr int64_t k_parallel_min_elems = 1 << 16;
constexpr int64_t k_chunk = 4096;

void chunk_scalar(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

SNAP_TARGET_AVX2 void chunk_avx2(const float* g, const float* u, float* o, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp_avx2(_mm256_xor_ps(gv, sign));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  chunk_scalar(g + i, u + i, o + i, n - i);
}

SNAP_TARGET_AVX512 void chunk_avx512(const float* g, const float* u, float* o, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace

void swiglu_ref(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void swiglu_cpu(const float* gate, const float* up, float* out, int64_t n) {
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
