// RMSNorm: y[t, :] = x[t, :] / sqrt(mean(x[t, :]²) + eps) · weight[:]; y may alias x.
// rms_norm_ref accumulates the sum of squares in f64; rms_norm_cpu in f32 SIMD lanes
// (16 or 8 partial sums, so the rounding error grows like sqrt(hidden_size/16)), tokens
// split across OpenMP threads when there are enough of them.
#include <cmath>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace snap::kernels {

namespace {

// One token of hidden 576 is ~100 ns of work: only a batch of tokens pays for a fork.
constexpr int64_t k_parallel_min_elems = 1 << 15;

void row_scalar(const float* x, const float* w, float* y, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

SNAP_TARGET_AVX2 void row_avx2(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum_avx2(acc);
  for (int64_t j = i; j < n; ++j) ss += x[j] * x[j];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const __m256 s = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = x[i] * inv * w[i];
}

SNAP_TARGET_AVX512 void row_avx512(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float inv = 1.0f / std::sqrt(hsum_avx512(acc) / static_cast<float>(n) + eps);
  const __m512 s = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
  }
}

}  // namespace

void rms_norm_ref(const float* x, const float* weight, float* y, int64_t num_tokens, int64_t hidden_size, float eps) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* xt = x + t * hidden_size;
    double ss = 0.0;
    for (int64_t i = 0; i < hidden_size; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(hidden_size) + eps);
    for (int64_t i = 0; i < hidden_size; ++i)
      y[t * hidden_size + i] = static_cast<float>(xt[i] * inv * weight[i]);
  }
}

void rms_norm_cpu(const float* x, const float* weight, float* y, int64_t num_tokens, int64_t hidden_size, float eps) {
  void (*row)(const float*, const float*, float*, int64_t, float) = row_scalar;
  switch (simd_level()) {
    case SimdLevel::avx512: row = row_avx512; break;
    case SimdLevel::avx2: row = row_avx2; break;
    case SimdLevel::scalar: break;
  }
#pragma omp parallel for schedule(static) if (num_tokens * hidden_size >= k_parallel_min_elems && num_tokens > 1)
  for (int64_t t = 0; t < num_tokens; ++t) row(x + t * hidden_size, weight, y + t * hidden_size, hidden_size, eps);
}

}  // namespace snap::kernels
