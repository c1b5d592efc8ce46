// The attention block primitives (kernels/cpu/attention_ops.h): scalar, AVX2 and AVX-512,
// each over f32, bf16, f16 and q8_0 K/V rows.
#include "kernels/cpu/attention_ops.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <cmath>

#include "common/check.h"
#include "kernels/cpu/kv_q8.h"
#include "kernels/cpu/simd.h"

namespace snap::kernels {
namespace {

// --- element loaders -------------------------------------------------------------------
// One loader per KV element type, over a row (head_dim values, row_bytes(hd) bytes; rows of
// a run are consecutive): get (scalar), load8 (AVX2), load16 (AVX-512) of the values at
// index i, each returning f32. bf16 → f32 is a 16-bit shift; f16 → f32 is vcvtph2ps (F16C /
// AVX-512F); q8_0 (kernels/cpu/kv_q8.h; scalar and AVX2 only) sign-extends 8 int8 and
// multiplies by the group's scale, the same product kv_to_f32 forms. i is a multiple of 8, so
// a load never spans two q8_0 groups of 32.
template <typename E>
struct LoadElems {
  static int64_t row_bytes(int hd) { return int64_t{hd} * static_cast<int64_t>(sizeof(E)); }
  static const E* at(const uint8_t* row, int i) { return reinterpret_cast<const E*>(row) + i; }
};
struct LoadF32 : LoadElems<float> {
  static float get(const uint8_t* r, int i, int) { return *at(r, i); }
  SNAP_TARGET_AVX2 static __m256 load8(const uint8_t* r, int i, int) { return _mm256_loadu_ps(at(r, i)); }
  SNAP_TARGET_AVX512 static __m512 load16(const uint8_t* r, int i, int) { return _mm512_loadu_ps(at(r, i)); }
};
struct LoadBf16 : LoadElems<uint16_t> {
  static float get(const uint8_t* r, int i, int) { return bf16_to_f32(*at(r, i)); }
  SNAP_TARGET_AVX2 static __m256 load8(const uint8_t* r, int i, int) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at(r, i))));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  SNAP_TARGET_AVX512 static __m512 load16(const uint8_t* r, int i, int) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(r, i))));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
};
struct LoadF16 : LoadElems<uint16_t> {
  static float get(const uint8_t* r, int i, int) { return f16_to_f32(*at(r, i)); }
  SNAP_TARGET_AVX2 static __m256 load8(const uint8_t* r, int i, int) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at(r, i))));
  }
  SNAP_TARGET_AVX512 static __m512 load16(const uint8_t* r, int i, int) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(r, i))));
  }
};
struct LoadQ8 {
  static int64_t row_bytes(int hd) { return kv_q8_row_bytes(hd); }
  static float get(const uint8_t* r, int i, int hd) { return kv_q8_value(r, hd, i); }
  SNAP_TARGET_AVX2 static __m256 load8(const uint8_t* r, int i, int hd) {
    const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + i)));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(kv_q8_scale_bits(r, hd, i))), _mm256_cvtepi32_ps(w));
  }
};

// --- scalar ----------------------------------------------------------------------------
template <class L>
void scores_scalar(const float* q, const void* kp, int64_t n, int hd, float* s) {
  const auto* k = static_cast<const uint8_t*>(kp);
  const int64_t rb = L::row_bytes(hd);
  for (int64_t j = 0; j < n; ++j) {
    float d = 0.0f;
    for (int i = 0; i < hd; ++i) d += q[i] * L::get(k + j * rb, i, hd);
    s[j] = d;
  }
}
float exp_sum_scalar(float* s, int64_t n, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  return sum;
}
template <class L>
void accumulate_scalar(float* acc, const float* p, const void* vp, int64_t n, int hd) {
  const auto* v = static_cast<const uint8_t*>(vp);
  const int64_t rb = L::row_bytes(hd);
  for (int64_t j = 0; j < n; ++j)
    for (int i = 0; i < hd; ++i) acc[i] += p[j] * L::get(v + j * rb, i, hd);
}
void scale_scalar(float* acc, int hd, float f) {
  for (int i = 0; i < hd; ++i) acc[i] *= f;
}

// --- AVX2 ------------------------------------------------------------------------------
// AVX2 needs hd % 8 == 0, AVX-512 hd % 16 == 0 (every Llama-family head_dim is 64 or 128).
template <class L>
SNAP_TARGET_AVX2 void scores_avx2(const float* q, const void* kp, int64_t n, int hd, float* s) {
  const auto* k = static_cast<const uint8_t*>(kp);
  const int64_t rb = L::row_bytes(hd);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* kj = k + j * rb;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= hd; i += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), L::load8(kj, i, hd), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), L::load8(kj, i + 8, hd), a1);
    }
    if (i < hd) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), L::load8(kj, i, hd), a0);
    s[j] = hsum_avx2(_mm256_add_ps(a0, a1));
  }
}
SNAP_TARGET_AVX2 float exp_sum_avx2(float* s, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum_avx2(acc);
  for (; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  return sum;
}
// acc stays in registers across the run: 8 dims per register, 4 registers per pass.
template <class L>
SNAP_TARGET_AVX2 void accumulate_avx2(float* acc, const float* p, const void* vp, int64_t n, int hd) {
  const auto* v = static_cast<const uint8_t*>(vp);
  const int64_t rb = L::row_bytes(hd);
  int i = 0;
  for (; i + 32 <= hd; i += 32) {
    __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8);
    __m256 a2 = _mm256_loadu_ps(acc + i + 16), a3 = _mm256_loadu_ps(acc + i + 24);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const uint8_t* vj = v + j * rb;
      a0 = _mm256_fmadd_ps(pj, L::load8(vj, i, hd), a0);
      a1 = _mm256_fmadd_ps(pj, L::load8(vj, i + 8, hd), a1);
      a2 = _mm256_fmadd_ps(pj, L::load8(vj, i + 16, hd), a2);
      a3 = _mm256_fmadd_ps(pj, L::load8(vj, i + 24, hd), a3);
    }
    _mm256_storeu_ps(acc + i, a0);
    _mm256_storeu_ps(acc + i + 8, a1);
    _mm256_storeu_ps(acc + i + 16, a2);
    _mm256_storeu_ps(acc + i + 24, a3);
  }
  for (; i < hd; i += 8) {
    __m256 a = _mm256_loadu_ps(acc + i);
    for (int64_t j = 0; j < n; ++j) a = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), L::load8(v + j * rb, i, hd), a);
    _mm256_storeu_ps(acc + i, a);
  }
}
SNAP_TARGET_AVX2 void scale_avx2(float* acc, int hd, float f) {
  const __m256 fv = _mm256_set1_ps(f);
  for (int i = 0; i < hd; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), fv));
}

// --- AVX2, 2-4 query rows at a time (prefill; decode's GQA group) -------------------------
// The same arithmetic as scores_avx2 / accumulate_avx2 for each row — same FMA chains, same
// horizontal sum, every acc element updated in key order — so a row's bits do not depend on
// whether it ran in a tile (prefill) or alone (decode, tails). What the tile saves: each
// K/V register is loaded (and for 16-bit/q8_0 KV converted) once for N rows instead of once
// per row, which is most of the non-FMA work of the row kernels.
template <class L, int N>
SNAP_TARGET_AVX2 void scores_rows_avx2(const float* const* q, const void* kp, int64_t n, int hd, float* const* s) {
  const auto* k = static_cast<const uint8_t*>(kp);
  const int64_t rb = L::row_bytes(hd);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* kj = k + j * rb;
    __m256 a0[N], a1[N];
    for (int r = 0; r < N; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= hd; i += 16) {
      const __m256 kl = L::load8(kj, i, hd), kh = L::load8(kj, i + 8, hd);
      for (int r = 0; r < N; ++r) {
        a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), kl, a0[r]);
        a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i + 8), kh, a1[r]);
      }
    }
    if (i < hd) {
      const __m256 kl = L::load8(kj, i, hd);
      for (int r = 0; r < N; ++r) a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), kl, a0[r]);
    }
    for (int r = 0; r < N; ++r) s[r][j] = hsum_avx2(_mm256_add_ps(a0[r], a1[r]));
  }
}
// 16 dims of N rows in 2N registers per pass (accumulate_avx2 holds 32 dims of one row; the
// width does not change any element's chain of FMAs).
template <class L, int N>
SNAP_TARGET_AVX2 void accumulate_rows_avx2(float* const* acc, const float* const* p, const void* vp, int64_t n,
                                           int hd) {
  const auto* v = static_cast<const uint8_t*>(vp);
  const int64_t rb = L::row_bytes(hd);
  int i = 0;
  for (; i + 16 <= hd; i += 16) {
    __m256 a0[N], a1[N];
    for (int r = 0; r < N; ++r) {
      a0[r] = _mm256_loadu_ps(acc[r] + i);
      a1[r] = _mm256_loadu_ps(acc[r] + i + 8);
    }
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* vj = v + j * rb;
      const __m256 vl = L::load8(vj, i, hd), vh = L::load8(vj, i + 8, hd);
      for (int r = 0; r < N; ++r) {
        const __m256 pr = _mm256_set1_ps(p[r][j]);
        a0[r] = _mm256_fmadd_ps(pr, vl, a0[r]);
        a1[r] = _mm256_fmadd_ps(pr, vh, a1[r]);
      }
    }
    for (int r = 0; r < N; ++r) {
      _mm256_storeu_ps(acc[r] + i, a0[r]);
      _mm256_storeu_ps(acc[r] + i + 8, a1[r]);
    }
  }
  for (; i < hd; i += 8) {
    __m256 a[N];
    for (int r = 0; r < N; ++r) a[r] = _mm256_loadu_ps(acc[r] + i);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 vv = L::load8(v + j * rb, i, hd);
      for (int r = 0; r < N; ++r) a[r] = _mm256_fmadd_ps(_mm256_set1_ps(p[r][j]), vv, a[r]);
    }
    for (int r = 0; r < N; ++r) _mm256_storeu_ps(acc[r] + i, a[r]);
  }
}
template <class L>
void scores_tile_avx2(const float* const* q, const void* k, int64_t n, int hd, float* const* s, int rows) {
  switch (rows) {
    case 2: return scores_rows_avx2<L, 2>(q, k, n, hd, s);
    case 3: return scores_rows_avx2<L, 3>(q, k, n, hd, s);
    default: return scores_rows_avx2<L, 4>(q, k, n, hd, s);
  }
}
template <class L>
void accumulate_tile_avx2(float* const* acc, const float* const* p, const void* v, int64_t n, int hd, int rows) {
  switch (rows) {
    case 2: return accumulate_rows_avx2<L, 2>(acc, p, v, n, hd);
    case 3: return accumulate_rows_avx2<L, 3>(acc, p, v, n, hd);
    default: return accumulate_rows_avx2<L, 4>(acc, p, v, n, hd);
  }
}

// --- AVX-512 ---------------------------------------------------------------------------
template <class L>
SNAP_TARGET_AVX512 void scores_avx512(const float* q, const void* kp, int64_t n, int hd, float* s) {
  const auto* k = static_cast<const uint8_t*>(kp);
  const int64_t rb = L::row_bytes(hd);
  if (hd == 64) {  // the common case: q in 4 registers for the whole run
    const __m512 q0 = _mm512_loadu_ps(q), q1 = _mm512_loadu_ps(q + 16);
    const __m512 q2 = _mm512_loadu_ps(q + 32), q3 = _mm512_loadu_ps(q + 48);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* kj = k + j * rb;
      __m512 a = _mm512_mul_ps(q0, L::load16(kj, 0, hd));
      __m512 b = _mm512_mul_ps(q1, L::load16(kj, 16, hd));
      a = _mm512_fmadd_ps(q2, L::load16(kj, 32, hd), a);
      b = _mm512_fmadd_ps(q3, L::load16(kj, 48, hd), b);
      s[j] = hsum_avx512(_mm512_add_ps(a, b));
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* kj = k + j * rb;
    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= hd; i += 32) {
      a = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), L::load16(kj, i, hd), a);
      b = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), L::load16(kj, i + 16, hd), b);
    }
    if (i < hd) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), L::load16(kj, i, hd), a);
    s[j] = hsum_avx512(_mm512_add_ps(a, b));
  }
}
SNAP_TARGET_AVX512 float exp_sum_avx512(float* s, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 msk = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(msk, s + j), mv));
    _mm512_mask_storeu_ps(s + j, msk, e);
    acc = _mm512_mask_add_ps(acc, msk, acc, e);
  }
  return hsum_avx512(acc);
}
template <class L>
SNAP_TARGET_AVX512 void accumulate_avx512(float* acc, const float* p, const void* vp, int64_t n, int hd) {
  const auto* v = static_cast<const uint8_t*>(vp);
  const int64_t rb = L::row_bytes(hd);
  int i = 0;
  for (; i + 64 <= hd; i += 64) {
    __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + 16);
    __m512 a2 = _mm512_loadu_ps(acc + i + 32), a3 = _mm512_loadu_ps(acc + i + 48);
    for (int64_t j = 0; j < n; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const uint8_t* vj = v + j * rb;
      a0 = _mm512_fmadd_ps(pj, L::load16(vj, i, hd), a0);
      a1 = _mm512_fmadd_ps(pj, L::load16(vj, i + 16, hd), a1);
      a2 = _mm512_fmadd_ps(pj, L::load16(vj, i + 32, hd), a2);
      a3 = _mm512_fmadd_ps(pj, L::load16(vj, i + 48, hd), a3);
    }
    _mm512_storeu_ps(acc + i, a0);
    _mm512_storeu_ps(acc + i + 16, a1);
    _mm512_storeu_ps(acc + i + 32, a2);
    _mm512_storeu_ps(acc + i + 48, a3);
  }
  for (; i < hd; i += 16) {
    __m512 a = _mm512_loadu_ps(acc + i);
    for (int64_t j = 0; j < n; ++j) a = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), L::load16(v + j * rb, i, hd), a);
    _mm512_storeu_ps(acc + i, a);
  }
}
SNAP_TARGET_AVX512 void scale_avx512(float* acc, int hd, float f) {
  const __m512 fv = _mm512_set1_ps(f);
  for (int i = 0; i < hd; i += 16) _mm512_storeu_ps(acc + i, _mm512_mul_ps(_mm512_loadu_ps(acc + i), fv));
}

// --- AVX-512, 2-4 query rows at a time (prefill; decode's GQA group) ----------------------
// As the AVX2 pair above: per row the arithmetic of scores_avx512 / accumulate_avx512 (the same
// mul/FMA chains and horizontal sums, every acc element summed in key order), so a row's bits do
// not depend on whether it ran in a tile; each K/V register is loaded (and converted) once for
// the N rows. Without these the AVX-512 set ran prefill attention a row at a time.
template <class L, int N>
SNAP_TARGET_AVX512 void scores_rows_avx512(const float* const* q, const void* kp, int64_t n, int hd,
                                           float* const* s) {
  const auto* k = static_cast<const uint8_t*>(kp);
  const int64_t rb = L::row_bytes(hd);
  if (hd == 64) {  // 4N registers of q for the whole run, 4 of K
    __m512 qr[N][4];
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < 4; ++c) qr[r][c] = _mm512_loadu_ps(q[r] + 16 * c);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* kj = k + j * rb;
      const __m512 k0 = L::load16(kj, 0, hd), k1 = L::load16(kj, 16, hd);
      const __m512 k2 = L::load16(kj, 32, hd), k3 = L::load16(kj, 48, hd);
      for (int r = 0; r < N; ++r) {
        __m512 a = _mm512_mul_ps(qr[r][0], k0);
        __m512 b = _mm512_mul_ps(qr[r][1], k1);
        a = _mm512_fmadd_ps(qr[r][2], k2, a);
        b = _mm512_fmadd_ps(qr[r][3], k3, b);
        s[r][j] = hsum_avx512(_mm512_add_ps(a, b));
      }
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* kj = k + j * rb;
    __m512 a[N], b[N];
    for (int r = 0; r < N; ++r) a[r] = b[r] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= hd; i += 32) {
      const __m512 kl = L::load16(kj, i, hd), kh = L::load16(kj, i + 16, hd);
      for (int r = 0; r < N; ++r) {
        a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q[r] + i), kl, a[r]);
        b[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q[r] + i + 16), kh, b[r]);
      }
    }
    if (i < hd) {
      const __m512 kl = L::load16(kj, i, hd);
      for (int r = 0; r < N; ++r) a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q[r] + i), kl, a[r]);
    }
    for (int r = 0; r < N; ++r) s[r][j] = hsum_avx512(_mm512_add_ps(a[r], b[r]));
  }
}
// 64 dims of N rows in 4N registers per pass, then 16-dim passes (accumulate_avx512's widths:
// the width does not change any element's chain of FMAs).
template <class L, int N>
SNAP_TARGET_AVX512 void accumulate_rows_avx512(float* const* acc, const float* const* p, const void* vp, int64_t n,
                                               int hd) {
  const auto* v = static_cast<const uint8_t*>(vp);
  const int64_t rb = L::row_bytes(hd);
  int i = 0;
  for (; i + 64 <= hd; i += 64) {
    __m512 a[N][4];
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < 4; ++c) a[r][c] = _mm512_loadu_ps(acc[r] + i + 16 * c);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* vj = v + j * rb;
      const __m512 v0 = L::load16(vj, i, hd), v1 = L::load16(vj, i + 16, hd);
      const __m512 v2 = L::load16(vj, i + 32, hd), v3 = L::load16(vj, i + 48, hd);
      for (int r = 0; r < N; ++r) {
        const __m512 pr = _mm512_set1_ps(p[r][j]);
        a[r][0] = _mm512_fmadd_ps(pr, v0, a[r][0]);
        a[r][1] = _mm512_fmadd_ps(pr, v1, a[r][1]);
        a[r][2] = _mm512_fmadd_ps(pr, v2, a[r][2]);
        a[r][3] = _mm512_fmadd_ps(pr, v3, a[r][3]);
      }
    }
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc[r] + i + 16 * c, a[r][c]);
  }
  for (; i < hd; i += 16) {
    __m512 a[N];
    for (int r = 0; r < N; ++r) a[r] = _mm512_loadu_ps(acc[r] + i);
    for (int64_t j = 0; j < n; ++j) {
      const __m512 vv = L::load16(v + j * rb, i, hd);
      for (int r = 0; r < N; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[r][j]), vv, a[r]);
    }
    for (int r = 0; r < N; ++r) _mm512_storeu_ps(acc[r] + i, a[r]);
  }
}
template <class L>
void scores_tile_avx512(const float* const* q, const void* k, int64_t n, int hd, float* const* s, int rows) {
  switch (rows) {
    case 2: return scores_rows_avx512<L, 2>(q, k, n, hd, s);
    case 3: return scores_rows_avx512<L, 3>(q, k, n, hd, s);
    default: return scores_rows_avx512<L, 4>(q, k, n, hd, s);
  }
}
template <class L>
void accumulate_tile_avx512(float* const* acc, const float* const* p, const void* v, int64_t n, int hd, int rows) {
  switch (rows) {
    case 2: return accumulate_rows_avx512<L, 2>(acc, p, v, n, hd);
    case 3: return accumulate_rows_avx512<L, 3>(acc, p, v, n, hd);
    default: return accumulate_rows_avx512<L, 4>(acc, p, v, n, hd);
  }
}

template <class L>
BlockOps block_ops_for(int head_dim) {
  const SimdLevel level = simd_level();
  if (level == SimdLevel::avx512 && head_dim % 16 == 0)
    return {scores_avx512<L>, exp_sum_avx512, accumulate_avx512<L>, scale_avx512, scores_tile_avx512<L>,
            accumulate_tile_avx512<L>};
  if (level != SimdLevel::scalar && head_dim % 8 == 0)
    return {scores_avx2<L>, exp_sum_avx2, accumulate_avx2<L>, scale_avx2, scores_tile_avx2<L>, accumulate_tile_avx2<L>};
  return {scores_scalar<L>, exp_sum_scalar, accumulate_scalar<L>, scale_scalar};
}

}  // namespace

namespace {
// SNAP_ATTENTION_TILES=0 starts with the tiles off (benchmarks compare both in one binary).
bool tiles_from_env() {
  const char* e = std::getenv("SNAP_ATTENTION_TILES");
  return e == nullptr || std::string(e) != "0";
}
std::atomic<bool> g_tiles{tiles_from_env()};
}  // namespace

void attention_tiles_override(bool on) { g_tiles.store(on); }
bool attention_tiles_enabled() { return g_tiles.load(std::memory_order_relaxed); }

BlockOps attention_block_ops(int head_dim, DType kv_dtype) {
  switch (kv_dtype) {
    case DType::f32: return block_ops_for<LoadF32>(head_dim);
    case DType::bf16: return block_ops_for<LoadBf16>(head_dim);
    case DType::f16: return block_ops_for<LoadF16>(head_dim);
    case DType::q8_0:
      // At most AVX2, also on AVX-512 machines: the machines this was written on have no
      // AVX-512 to test a q8_0 AVX-512 path with (no untested kernels).
      if (simd_level() != SimdLevel::scalar && head_dim % 8 == 0)
        return {scores_avx2<LoadQ8>, exp_sum_avx2,               accumulate_avx2<LoadQ8>,
                scale_avx2,          scores_tile_avx2<LoadQ8>,   accumulate_tile_avx2<LoadQ8>};
      return {scores_scalar<LoadQ8>, exp_sum_scalar, accumulate_scalar<LoadQ8>, scale_scalar};
    default: break;
  }
  CHECK(false) << "attention: KV element type " << dtype_name(kv_dtype) << " (f32, bf16, f16 or q8_0)";
  return {};
}

int64_t attention_kv_splits(int64_t num_tokens, int num_kv_heads, int64_t kv_len) {
  constexpr int64_t k_min_split_keys = 256;
  const int64_t num_tiles = (num_tokens + k_attention_query_tile - 1) / k_attention_query_tile;
  const int64_t base_items = num_tiles * num_kv_heads;
  const int threads = omp_get_max_threads();
  if (base_items >= 4 * threads) return 1;
  const int64_t splits = std::min<int64_t>((4 * threads + base_items - 1) / base_items, kv_len / k_min_split_keys);
  return std::max<int64_t>(splits, 1);
}

void attention_write_row(const RowState& st, const float* acc, int hd, float* o) {
  const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
  for (int i = 0; i < hd; ++i) o[i] = acc[i] * inv;
  if (std::isnan(st.l)) std::fill(o, o + hd, st.l);
}

SplitRows::SplitRows(int64_t splits, int64_t num_tokens, int num_heads, int head_dim)
    : splits_(splits), num_tokens_(num_tokens), num_heads_(num_heads), hd_(head_dim) {
  if (splits > 1) {
    state_.resize(static_cast<size_t>(splits * num_tokens * num_heads));
    acc_.resize(static_cast<size_t>(splits * num_tokens * num_heads * head_dim));
  }
}

void SplitRows::store(int64_t split, int64_t t, int h, const RowState& st, const float* acc, float* out) {
  if (splits_ == 1) {
    attention_write_row(st, acc, hd_, out + (t * num_heads_ + h) * hd_);
    return;
  }
  const int64_t idx = (split * num_tokens_ + t) * num_heads_ + h;
  state_[idx] = st;
  std::copy(acc, acc + hd_, acc_.data() + idx * hd_);
}

void SplitRows::merge(float* out) const {
  if (splits_ == 1) return;
#pragma omp parallel for collapse(2) if (num_tokens_ * num_heads_ >= 64)
  for (int64_t t = 0; t < num_tokens_; ++t) {
    for (int h = 0; h < num_heads_; ++h) {
      float* o = out + (t * num_heads_ + h) * hd_;
      float big_m = -std::numeric_limits<float>::infinity();
      for (int64_t sp = 0; sp < splits_; ++sp) big_m = std::max(big_m, state_[(sp * num_tokens_ + t) * num_heads_ + h].m);
      std::fill(o, o + hd_, 0.0f);
      RowState merged;
      merged.l = 0.0f;
      for (int64_t sp = 0; sp < splits_; ++sp) {
        const int64_t idx = (sp * num_tokens_ + t) * num_heads_ + h;
        const RowState& st = state_[idx];
        if (st.l == 0.0f) continue;  // no visible key in this split
        const float f = std::exp(st.m - big_m);
        merged.l += st.l * f;
        const float* a = acc_.data() + idx * hd_;
        for (int i = 0; i < hd_; ++i) o[i] += a[i] * f;
      }
      attention_write_row(merged, o, hd_, o);
    }
  }
}

}  // namespace snap::kernels
