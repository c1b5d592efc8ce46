// Rotary position embedding: rope_inv_freq (HF semantics for none / linear / llama3
// scaling) and the in-place rotation in the rotate_half (NeoX) layout: for i < d/2,
// (x[i], x[i + d/2]) ← (x[i]·cos − x[i+d/2]·sin, x[i+d/2]·cos + x[i]·sin), angle = pos·inv_freq[i].
// Angles are formed in f64 in both paths (pos·inv_freq at pos 8K is ~1e4 rad, where an f32
// product would be off by 5e-4); rope_cpu computes cos/sin once per (token, i) for all heads.
#include <cmath>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace snap::kernels {

namespace {

// Prefill of 512 tokens × 9 heads × 64 dims is ~300K elements; decode is 576.
constexpr int64_t k_parallel_min_elems = 1 << 15;

void rotate_scalar(float* x, const float* c, const float* s, int half) {
  for (int i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * c[i] - b * s[i];
    x[i + half] = b * c[i] + a * s[i];
  }
}

SNAP_TARGET_AVX512 void rotate_avx512(float* x, const float* c, const float* s, int half) {
  for (int i = 0; i < half; i += 16) {
    const __mmask16 m = half - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (half - i)) - 1);
    const __m512 a = _mm512_maskz_loadu_ps(m, x + i), b = _mm512_maskz_loadu_ps(m, x + i + half);
    const __m512 cv = _mm512_maskz_loadu_ps(m, c + i), sv = _mm512_maskz_loadu_ps(m, s + i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv)));
    _mm512_mask_storeu_ps(x + i + half, m, _mm512_fmadd_ps(b, cv, _mm512_mul_ps(a, sv)));
  }
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv[i] = static_cast<float>(1.0 / std::pow(static_cast<double>(cfg.theta), 2.0 * i / cfg.head_dim));
  if (cfg.scaling == RopeScaling::linear) {
    for (float& f : inv) f /= cfg.factor;
  } else if (cfg.scaling == RopeScaling::llama3) {
    const double k_pi = 3.14159265358979323846;
    const double low_wavelen = cfg.original_max_position / static_cast<double>(cfg.low_freq_factor);
    const double high_wavelen = cfg.original_max_position / static_cast<double>(cfg.high_freq_factor);
    for (float& f : inv) {
      const double wavelen = 2.0 * k_pi / f;
      if (wavelen < high_wavelen) continue;  // high frequency: unchanged
      if (wavelen > low_wavelen) {           // low frequency: fully scaled
        f = static_cast<float>(f / cfg.factor);
        continue;
      }
      const double smooth = (cfg.original_max_position / wavelen - cfg.low_freq_factor) /
                            (cfg.high_freq_factor - cfg.low_freq_factor);
      f = static_cast<float>((1.0 - smooth) * f / cfg.factor + smooth * f);
    }
  }
  return inv;
}

void rope_ref(float* x, const int32_t* positions, int64_t num_tokens, int num_heads, int head_dim,
              const float* inv_freq) {
  const int half = head_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(positions[t]) * inv_freq[i];
        const double c = std::cos(angle), s = std::sin(angle);
        const double a = v[i], b = v[i + half];
        v[i] = static_cast<float>(a * c - b * s);
        v[i + half] = static_cast<float>(b * c + a * s);
      }
    }
  }
}

void rope_cpu(float* x, const int32_t* positions, int64_t num_tokens, int num_heads, int head_dim,
              const float* inv_freq) {
  const int half = head_dim / 2;
  const bool avx512 = simd_level() == SimdLevel::avx512;
#pragma omp parallel if (num_tokens * num_heads * head_dim >= k_parallel_min_elems && num_tokens > 1)
  {
    std::vector<float> cs(static_cast<size_t>(2 * half));  // cos[half], sin[half] of one token
    float* c = cs.data();
    float* s = cs.data() + half;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(positions[t]) * inv_freq[i];
        c[i] = static_cast<float>(std::cos(angle));
        s[i] = static_cast<float>(std::sin(angle));
      }
      for (int h = 0; h < num_heads; ++h) {
        float* v = x + (t * num_heads + h) * head_dim;
        if (avx512) {
          rotate_avx512(v, c, s, half);
        } else {
          rotate_scalar(v, c, s, half);  // 32 pairs: g++ -O3 vectorizes this to SSE, enough for avx2
        }
      }
    }
  }
}

}  // namespace snap::kernels
