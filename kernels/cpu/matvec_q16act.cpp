// The q16-activation matvec for block-format weights (kernels/matvec_act.h): activations are
// quantized once per call to int16 blocks of 32 (d = max|x|/32767, an f32 scale), weight quants
// are widened to int16 in registers, and each block's dot product is an exact integer sum
// (AVX2 vpmaddwd) scaled once: y = Σ_b d_w·d_x·Σ q_w·q_x (+ m_w·d_x·Σ q_x for q4_1; q4_0 is
// q4_1 with m = −8·d_w, q8_0 has no m term). The activation rounding error is 127/32767 (1/258)
// of q8act's. q16x2act adds a second int16 plane, the rounding residual at scale d/32768
// (x ≈ d·(q + q2/32768), |error| ≤ d/65536, about 2^-31 of max|x|: as exact as f32 activations
// for these sums) and two more vpmaddwd per block. Q5_0 and Q5_1 are q4_0 and q4_1 with a fifth
// bit above each nibble (q ∈ [0, 31]; Q5_0's m = −16·d_w). *_ref is the plain scalar version (f64
// sums); *_cpu the AVX2 tiles (4 rows × up to 4 tokens), or on AVX-512 VNNI CPUs the tiles of
// matvec_q16act_vnni.cpp (q16act_tile picks them when enabled; off by default).
// Q4_K and Q5_K run here too, as 32-weight sub-blocks in q4_1's form: w = d_j·q + m_j with
// d_j = d·sc_j and m_j = −dmin·m_j (both exact: an f16 times 6 bits), q the nibble (Q5_K: and
// bit j of qh above it); a sub-block's activation block is the 32-column block it covers.
// Q6_K runs in q8_0's form (no offset term): a 32-weight sub-block has two int8 scales, one per
// 16 weights, so its quants are widened as q − 32 and multiplied by their scale in int16
// (|(q − 32)·sc| ≤ 32·128 = 4096), w = d·((q − 32)·sc) with the block's f16 d.
// Q3_K runs in the same form: its 2-bit quants less 4 where the hmask bit is clear (q ∈ [−4, 3])
// times their 16-weight group's 6-bit scale less 32, in int16 (|q·sc| ≤ 4·32 = 128), w = d·(q·sc).
// Q2_K's quants (q ∈ [0, 3]) are widened as q·(sc & 15) the same way, w = d·(q·sc) − dmin·m with
// each 16-weight group's own 4-bit min m = sc >> 4: the offset is (−dmin·m)·h per half, h the
// activations' sum over those 16 (ActQ16::h, kept by the quantizer as it keeps s per block).
#include "kernels/cpu/matvec_q16act.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/k_blocks.h"
#include "kernels/cpu/matvec_tiles.h"
#include "kernels/cpu/simd.h"
#include "kernels/matvec_act.h"

namespace snap::kernels {

namespace {

constexpr int64_t k_qk = 32;  // elements per block, weights and activations alike
constexpr int k_q16_max = 32767;
constexpr float k_lo_scale = 1.0f / 32768.0f;  // the residual plane's step, in units of d
using tiles::k_block_rows;
// Software prefetch ahead of each row stream. bench_matvec (q4_1 stack / q8_0 stack, 2 threads,
// AVX-512 Xeon, 2026-12-02, 3 alternating runs): 1 KiB 10.1-10.9 / 12.3-13.2 ms, 4 KiB 7.5-10.0 /
// 9.6-9.8 ms (an earlier AVX2 machine had measured 1 KiB best for matmul.cpp's q8_0 LM head).
constexpr int64_t k_prefetch_bytes = 4096;

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// --- activation quantization ------------------------------------------------------------
// Scalar and AVX2 give bit-identical q, d, s: the same IEEE operations in the same order
// (|x| max is exact, d = amax/32767, id = 1/d, q = round-to-nearest-even(x·id)). Σq ≤ 32·32767
// < 2^24, so s = d·Σq is one rounding in both. With q2 (split): r = x − d·q in one rounding
// (an FMA in both), q2 = round(r·32768/d) (|r| ≤ d/2 up to rounding, so |q2| ≤ ~16400), and
// s = d·(Σq + Σq2/32768) (both sums exact in f32, one rounding for their sum, one for d·).
// h (when not null): the same as s over elements 0..15 (h[0]) and 16..31 (h[1]), for Q2_K's mins.
void quantize_block_scalar(const float* x, int16_t* q, int16_t* q2, float* d, float* s, float* h) {
  float amax = 0.0f;
  bool finite = true;
  for (int j = 0; j < k_qk; ++j) {
    finite = finite && std::isfinite(x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  if (!finite) {
    std::memset(q, 0, k_qk * sizeof(int16_t));
    if (q2) std::memset(q2, 0, k_qk * sizeof(int16_t));
    *d = *s = std::numeric_limits<float>::quiet_NaN();
    if (h) h[0] = h[1] = *s;
    return;
  }
  const float dd = amax / static_cast<float>(k_q16_max);
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  const float id2 = id * 32768.0f;  // exact: a power of two
  int sum = 0, sum2 = 0, half[2] = {0, 0}, half2[2] = {0, 0};
  for (int j = 0; j < k_qk; ++j) {
    const int v = static_cast<int>(std::nearbyint(x[j] * id));
    q[j] = static_cast<int16_t>(std::clamp(v, -k_q16_max, k_q16_max));
    sum += q[j];
    half[j / 16] += q[j];
    if (q2) {
      const float r = std::fma(-dd, static_cast<float>(q[j]), x[j]);
      const int v2 = static_cast<int>(std::nearbyint(r * id2));
      q2[j] = static_cast<int16_t>(std::clamp(v2, -k_q16_max, k_q16_max));
      sum2 += q2[j];
      half2[j / 16] += q2[j];
    }
  }
  *d = dd;
  const auto scaled = [&](int a, int a2) {
    return q2 ? dd * (static_cast<float>(a) + static_cast<float>(a2) * k_lo_scale) : dd * static_cast<float>(a);
  };
  *s = scaled(sum, sum2);
  if (h) {
    h[0] = scaled(half[0], half2[0]);
    h[1] = scaled(half[1], half2[1]);
  }
}

// Four int32 vectors (elements 0..31 in order) → 32 int16 at q, saturating (never reached).
SNAP_TARGET_AVX2 inline void store_i16_avx2(const __m256i i[4], int16_t* q) {
  // packs interleaves the 128-bit lanes (a0-3 b0-3 | a4-7 b4-7); permute4x64 puts them in order.
  const __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xd8);
  const __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xd8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p01);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), p23);
}

SNAP_TARGET_AVX2 void quantize_row_avx2(const float* x, int64_t cols, int16_t* q, int16_t* q2, float* d, float* s,
                                        float* h) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  for (int64_t b = 0; b < cols / k_qk; ++b) {
    const float* xb = x + b * k_qk;
    __m256 v[4], amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      const __m256 a = _mm256_andnot_ps(sign, v[j]);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // NaN or ±inf
      amax = _mm256_max_ps(amax, a);
    }
    if (_mm256_movemask_ps(bad) != 0) {
      quantize_block_scalar(xb, q + b * k_qk, q2 ? q2 + b * k_qk : nullptr, d + b, s + b, h ? h + 2 * b : nullptr);
      continue;
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float dd = _mm_cvtss_f32(m) / static_cast<float>(k_q16_max);
    const __m256 id = _mm256_set1_ps(dd != 0.0f ? 1.0f / dd : 0.0f);
    __m256i i[4];
    for (int j = 0; j < 4; ++j)
      i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // |x·id| ≤ amax·(1/dd) rounds to ≤ 32767 (at most a few ulp above it), so the saturating
    // pack changes nothing and equals the scalar clamp.
    const int lo = hsum_epi32_avx2(_mm256_add_epi32(i[0], i[1])), hi = hsum_epi32_avx2(_mm256_add_epi32(i[2], i[3]));
    const int sum = lo + hi;
    store_i16_avx2(i, q + b * k_qk);
    d[b] = dd;
    if (q2 == nullptr) {
      s[b] = dd * static_cast<float>(sum);
      if (h) {
        h[2 * b] = dd * static_cast<float>(lo);
        h[2 * b + 1] = dd * static_cast<float>(hi);
      }
      continue;
    }
    // The residual plane, as the scalar code: r = fma(−d, q, x), q2 = round(r·id·32768).
    const __m256 dv = _mm256_set1_ps(dd), id2 = _mm256_mul_ps(id, _mm256_set1_ps(32768.0f));
    __m256i i2[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 r = _mm256_fnmadd_ps(dv, _mm256_cvtepi32_ps(i[j]), v[j]);
      i2[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(r, id2), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const int lo2 = hsum_epi32_avx2(_mm256_add_epi32(i2[0], i2[1])), hi2 = hsum_epi32_avx2(_mm256_add_epi32(i2[2], i2[3]));
    const int sum2 = lo2 + hi2;
    store_i16_avx2(i2, q2 + b * k_qk);
    s[b] = dd * (static_cast<float>(sum) + static_cast<float>(sum2) * k_lo_scale);
    if (h) {
      h[2 * b] = dd * (static_cast<float>(lo) + static_cast<float>(lo2) * k_lo_scale);
      h[2 * b + 1] = dd * (static_cast<float>(hi) + static_cast<float>(hi2) * k_lo_scale);
    }
  }
}

// --- weight blocks: scale, offset and the 32 quants in element order ------------------
// q8_0: d, q ∈ [-128, 127]; q4_0: d, nibbles n ∈ [0, 15] with w = d·n − 8d (m = −8d);
// q4_1: d, m, w = d·n + m. Byte j of the 16 nibble bytes holds element j (low) and j+16 (high).
// q5_0 / q5_1: q4_0 / q4_1 with bit j of the 32-bit qh (after d, or d and m) above element j's
// nibble: q ∈ [0, 31], q5_0's m = −16d.
constexpr bool k_q5(DType d) { return d == DType::q5_0 || d == DType::q5_1; }
constexpr bool k_has_m(DType d) { return d == DType::q4_1 || d == DType::q5_1; }  // m stored after d
// Where the nibbles start in a 32-weight block (after d, m and qh as the format has them).
constexpr int k_qs_at(DType d) { return 2 + (k_has_m(d) ? 2 : 0) + (k_q5(d) ? 4 : 0); }
// The offset m of a block without a stored one: −8d (q4_0), −16d (q5_0); exact (a power of two).
constexpr float k_zero_point(DType d) { return d == DType::q5_0 ? -16.0f : -8.0f; }

template <DType D>
inline void block_scalar(const uint8_t* b, float* d, float* m, int* q) {
  *d = load_f16(b);
  if constexpr (D == DType::q8_0) {
    *m = 0.0f;
    for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(b[2 + j]);
  } else {
    constexpr int k_qs = k_qs_at(D);
    *m = k_has_m(D) ? load_f16(b + 2) : k_zero_point(D) * *d;
    for (int j = 0; j < 16; ++j) {
      q[j] = b[k_qs + j] & 0x0f;
      q[j + 16] = b[k_qs + j] >> 4;
    }
    if constexpr (k_q5(D)) {
      uint32_t qh;
      std::memcpy(&qh, b + k_qs - 4, 4);
      for (int j = 0; j < 32; ++j) q[j] |= static_cast<int>((qh >> j) & 1u) << 4;
    }
  }
}

// Q4_K / Q5_K: f16 d, f16 dmin, scales[12], (Q5_K: qh[32],) qs[128]. Sub-block j (columns
// 32j .. 32j + 31 of the 256): q = nibble j&1 of qs[32·(j/2) + l] (Q5_K: | bit j of qh[l] << 4).
constexpr bool k_super(DType d) { return d == DType::q4_k || d == DType::q5_k; }
// Q3_K and Q2_K: 2-bit quants, a scale (Q2_K: and a min) per 16 weights.
constexpr bool k_small(DType d) { return d == DType::q3_k || d == DType::q2_k; }
// The 256-weight formats, read as eight 32-column sub-blocks a block.
constexpr bool k_256(DType d) { return k_super(d) || d == DType::q6_k || k_small(d); }
// The formats with an offset term m·Σx over a whole 32-weight (sub-)block, from the activation
// block's sum s (q8_0, Q6_K and Q3_K have none; Q2_K's mins are per 16 weights: k_min16).
constexpr bool k_offset(DType d) { return d != DType::q8_0 && d != DType::q6_k && !k_small(d); }
// Q2_K: −dmin·m·Σx with a min m per 16 weights, from the activations' half-block sums h.
constexpr bool k_min16(DType d) { return d == DType::q2_k; }

// Q3_K: hmask[32], qs[64], scales[12], f16 d (byte 108); Q2_K: scales[16], qs[64], f16 d (byte 80),
// f16 dmin (82). Sub-block j (half g = j/4, s = j%4): q = (qs[32g + l] >> 2s) & 3 (Q3_K: less 4
// where bit j of hmask[l] is clear), weights l < 16 scaled by scale 2j, l ≥ 16 by 2j + 1 (Q3_K:
// scale_k3; Q2_K: scales[k] & 15, its min scales[k] >> 4): matmul.cpp's decoder.
constexpr int k_q3_qs = 32, k_q3_scales = 96, k_q3_d = 108;
constexpr int k_q2_qs = 16, k_q2_d = 80, k_q2_dmin = 82;

// Q6_K: ql[128], qh[64], int8 scales[16], f16 d (byte 208). Sub-block j (half g = j/4, quarter
// s = j%4): q = (nibble s/2 of ql[64g + 32(s&1) + l]) | ((qh[32g + l] >> 2s) & 3) << 4, weights
// l < 16 scaled by scales[8g + 2s], l ≥ 16 by scales[8g + 2s + 1] (matmul.cpp's decoder).
constexpr int k_q6_qh = 128, k_q6_scales = 192, k_q6_d = 208;
struct Q6Sub {
  const uint8_t* ql;  // the sub-block's 32 low-nibble bytes (nibble sub/2)
  const uint8_t* qh;  // its 32 high-bit bytes (bits 2·sub, 2·sub + 1)
  const int8_t* sc;   // its two scales
  int sub;
};
inline Q6Sub q6_sub(const uint8_t* blk, int j) {
  const int g = j / 4, sub = j % 4;
  return {blk + 64 * g + 32 * (sub & 1), blk + k_q6_qh + 32 * g,
          reinterpret_cast<const int8_t*>(blk + k_q6_scales) + 8 * g + 2 * sub, sub};
}

template <DType D>
inline void k_sub_scales(const uint8_t* blk, int j, float dd, float dmin, float* d, float* m) {
  int sc, mn;
  scale_min_k4(blk + 4, j, &sc, &mn);
  *d = dd * static_cast<float>(sc);
  *m = -(dmin * static_cast<float>(mn));
}

// Columns 32b .. 32b + 31 of a row: a 32-weight block, or a K format's sub-block b % 8. Q2_K
// (k_min16): m is −dmin and mq[l] weight l's min (q is then q·sc); mq is untouched otherwise.
template <DType D>
inline void sub_block_scalar(const uint8_t* row, int64_t b, float* d, float* m, int* q, int* mq) {
  if constexpr (k_small(D)) {
    const uint8_t* blk = row + b / 8 * dtype_block_bytes(D);
    const int j = static_cast<int>(b % 8);
    const uint8_t* qs = blk + (D == DType::q3_k ? k_q3_qs : k_q2_qs) + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    for (int l = 0; l < 32; ++l) {
      const int v = (qs[l] >> shift) & 3;
      if constexpr (D == DType::q3_k) {
        q[l] = (v - ((((blk[l] >> j) & 1) ^ 1) << 2)) * scale_k3(blk + k_q3_scales, 2 * j + l / 16);
      } else {
        const int sc = blk[2 * j + l / 16];
        q[l] = v * (sc & 0x0f);
        mq[l] = sc >> 4;
      }
    }
    *d = load_f16(blk + (D == DType::q3_k ? k_q3_d : k_q2_d));
    *m = D == DType::q2_k ? -load_f16(blk + k_q2_dmin) : 0.0f;
  } else if constexpr (k_super(D)) {
    const uint8_t* blk = row + b / 8 * dtype_block_bytes(D);
    const int j = static_cast<int>(b % 8);
    k_sub_scales<D>(blk, j, load_f16(blk), load_f16(blk + 2), d, m);
    const uint8_t* qs = blk + (D == DType::q4_k ? 16 : 48) + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) {
      q[l] = (qs[l] >> (4 * (j & 1))) & 0x0f;
      if constexpr (D == DType::q5_k) q[l] |= ((blk[16 + l] >> j) & 1) << 4;
    }
  } else if constexpr (D == DType::q6_k) {
    const uint8_t* blk = row + b / 8 * dtype_block_bytes(D);
    const Q6Sub s = q6_sub(blk, static_cast<int>(b % 8));
    *d = load_f16(blk + k_q6_d);
    *m = 0.0f;
    for (int l = 0; l < 32; ++l) {
      const int v = ((s.ql[l] >> (4 * (s.sub >> 1))) & 0x0f) | (((s.qh[l] >> (2 * s.sub)) & 3) << 4);
      q[l] = (v - 32) * s.sc[l / 16];
    }
  } else {
    block_scalar<D>(row + b * dtype_block_bytes(D), d, m, q);
  }
}

// --- reference ----------------------------------------------------------------------------
template <DType D>
void ref_typed(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens, bool split) {
  ActQ16 a;
  a.quantize(x, num_tokens, w.cols, false, split);
  for (int64_t r = 0; r < w.rows; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + r * dtype_row_bytes(D, w.cols);
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = bias ? bias[r] : 0.0;
      for (int64_t b = 0; b < a.nb; ++b) {
        float dw, mw;
        int qw[32], mq[32];
        sub_block_scalar<D>(row, b, &dw, &mw, qw, mq);
        int64_t sumi = 0, sumi2 = 0;
        for (int j = 0; j < 32; ++j) sumi += int64_t{qw[j]} * a.q[t * w.cols + b * k_qk + j];
        if (split)
          for (int j = 0; j < 32; ++j) sumi2 += int64_t{qw[j]} * a.q2[t * w.cols + b * k_qk + j];
        acc += double{dw} * a.d[t * a.nb + b] * (static_cast<double>(sumi) + static_cast<double>(sumi2) / 32768.0);
        if constexpr (k_offset(D)) acc += double{mw} * a.s[t * a.nb + b];
        if constexpr (k_min16(D))
          acc += double{mw} * (mq[0] * double{a.h[2 * (t * a.nb + b)]} + mq[16] * double{a.h[2 * (t * a.nb + b) + 1]});
      }
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

// --- AVX2 ----------------------------------------------------------------------------------
SNAP_TARGET_AVX2 inline float load_f16_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A Q4_K/Q5_K block's eight sub-block scales d·sc_j and offsets −dmin·m_j at once (k_sub_scales'
// values: the 6-bit fields cut from the 12 bytes as three 32-bit words, byte-masked).
SNAP_TARGET_AVX2 inline void k_scales8_avx2(const uint8_t* blk, float* d, float* m) {
  uint32_t w[3];
  std::memcpy(w, blk + 4, 12);
  const uint64_t sc = (w[0] & 0x3f3f3f3fu) | uint64_t{(w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u)} << 32;
  const uint64_t mn = (w[1] & 0x3f3f3f3fu) | uint64_t{((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u)} << 32;
  const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
  const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn))));
  _mm256_storeu_ps(d, _mm256_mul_ps(_mm256_set1_ps(load_f16_f16c(blk)), scf));
  _mm256_storeu_ps(m, _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(load_f16_f16c(blk + 2)), mnf), _mm256_set1_ps(-0.0f)));
}

// Q6_K: sub-block s's 32 weights as (q − 32)·sc in int16, decoded as bytes at once: the nibble
// s.sub/2 of its 32 ql bytes, bits 2·s.sub .. +1 of its 32 qh bytes above it (shifted within the
// byte: ≤ 3 << 4), less 32 as a signed byte, widened, each half times its scale.
SNAP_TARGET_AVX2 inline void q6_sub_avx2(const Q6Sub& s, __m256i* lo, __m256i* hi) {
  const __m256i l4 = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.ql)),
                                                       _mm_cvtsi32_si128(4 * (s.sub >> 1))),
                                      _mm256_set1_epi8(0x0f));
  const __m256i h2 = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.qh)),
                                                       _mm_cvtsi32_si128(2 * s.sub)),
                                      _mm256_set1_epi8(3));
  const __m256i q = _mm256_sub_epi8(_mm256_or_si256(l4, _mm256_slli_epi16(h2, 4)), _mm256_set1_epi8(32));
  *lo = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)), _mm256_set1_epi16(s.sc[0]));
  *hi = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)), _mm256_set1_epi16(s.sc[1]));
}

// Q5_0/Q5_1: 16 bits of qh as int16 lanes, lane j = 16 where bit j is set, else 0.
SNAP_TARGET_AVX2 inline __m256i q5_fifth_avx2(uint32_t half) {
  const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                        static_cast<int16_t>(0x8000));
  const __m256i h = _mm256_and_si256(_mm256_set1_epi16(static_cast<int16_t>(half)), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi16(h, bit), _mm256_set1_epi16(16));
}

// Q3_K / Q2_K: a block's 16 scales as int16 at ks[0..15] (Q3_K: the 6-bit values less 32; Q2_K:
// scales[k] & 15) and Q2_K's 16 mins at ks[16..31] (scales[k] >> 4). Q3_K's 6-bit fields are cut
// from the 12 bytes as four 32-bit words, a byte a scale: scale k's low nibble (byte k % 8, nibble
// k / 8) and its two high bits (byte 8 + k % 4, bits 2·(k/4)), scale_k3's values.
template <DType D>
SNAP_TARGET_AVX2 inline void small_scales_avx2(const uint8_t* blk, int16_t* ks) {
  if constexpr (D == DType::q3_k) {
    uint32_t w[3];
    std::memcpy(w, blk + k_q3_scales, 12);
    constexpr uint32_t lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    const uint32_t v[4] = {(w[0] & lo4) | ((w[2] & lo2) << 4), (w[1] & lo4) | (((w[2] >> 2) & lo2) << 4),
                           ((w[0] >> 4) & lo4) | (((w[2] >> 4) & lo2) << 4),
                           ((w[1] >> 4) & lo4) | (((w[2] >> 6) & lo2) << 4)};
    const __m256i sc = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ks), _mm256_sub_epi16(sc, _mm256_set1_epi16(32)));
  } else {
    const __m256i sc = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ks), _mm256_and_si256(sc, _mm256_set1_epi16(0x0f)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ks + 16), _mm256_srli_epi16(sc, 4));
  }
}

// Q3_K / Q2_K: sub-block j's 32 quants, decoded as bytes at once (Q3_K: q + 4·hbit − 4 ∈ [−4, 3];
// Q2_K: q ∈ [0, 3]), widened to int16 and times their half's scale from ks (small_scales_avx2).
template <DType D>
SNAP_TARGET_AVX2 inline void small_sub_avx2(const uint8_t* blk, int j, const int16_t* ks, __m256i* lo, __m256i* hi) {
  const uint8_t* qs = blk + (D == DType::q3_k ? k_q3_qs : k_q2_qs) + 32 * (j / 4);
  __m256i q = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)),
                                                _mm_cvtsi32_si128(2 * (j % 4))),
                               _mm256_set1_epi8(3));
  if constexpr (D == DType::q3_k) {
    const __m256i hm = _mm256_and_si256(
        _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)), _mm_cvtsi32_si128(j)),
        _mm256_set1_epi8(1));
    // hm ≤ 1, so its shift stays in its byte; q + 4·hm − 4 ∈ [−4, 3] as a signed byte.
    q = _mm256_sub_epi8(_mm256_or_si256(q, _mm256_slli_epi16(hm, 2)), _mm256_set1_epi8(4));
    *lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
    *hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
  } else {
    *lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q));
    *hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1));
  }
  *lo = _mm256_mullo_epi16(*lo, _mm256_set1_epi16(ks[2 * j]));
  *hi = _mm256_mullo_epi16(*hi, _mm256_set1_epi16(ks[2 * j + 1]));
}

// One weight block's 32 quants as int16: lo = elements 0..15, hi = 16..31 (a K format: sub-block
// j of the block at blk). Q3_K/Q2_K: ks holds the block's scales (small_scales_avx2).
template <DType D>
SNAP_TARGET_AVX2 inline void widen_block_avx2(const uint8_t* blk, int j, const int16_t* ks, __m256i* lo, __m256i* hi) {
  if constexpr (k_small(D)) {
    small_sub_avx2<D>(blk, j, ks, lo, hi);
  } else if constexpr (k_super(D)) {
    const uint8_t* qs = blk + (D == DType::q4_k ? 16 : 48) + 32 * (j / 2);
    const __m128i shift = _mm_cvtsi32_si128(4 * (j & 1));
    const __m256i nib = _mm256_set1_epi16(0x0f);
    *lo = _mm256_and_si256(_mm256_srl_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))), shift), nib);
    *hi = _mm256_and_si256(
        _mm256_srl_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))), shift), nib);
    if constexpr (D == DType::q5_k) {  // bit j of qh[l], above the nibble
      const __m128i hs = _mm_cvtsi32_si128(j);
      const __m256i one = _mm256_set1_epi16(1);
      const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16))), hs), one);
      const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32))), hs), one);
      *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(h0, 4));
      *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(h1, 4));
    }
  } else if constexpr (D == DType::q6_k) {
    q6_sub_avx2(q6_sub(blk, j), lo, hi);
  } else if constexpr (D == DType::q8_0) {
    *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
  } else {
    constexpr int k_qs = k_qs_at(D);
    // Byte j → int16 lane j: its low nibble is element j, its high nibble element j + 16.
    const __m256i w16 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + k_qs)));
    const __m256i nib = _mm256_set1_epi16(0x0f);
    *lo = _mm256_and_si256(w16, nib);
    *hi = _mm256_srli_epi16(w16, 4);  // the byte was zero-extended: nothing above the nibble
    if constexpr (k_q5(D)) {  // lane j: bit j of qh's low half (lo), of its high half (hi), as 16
      uint32_t qh;
      std::memcpy(&qh, blk + k_qs - 4, 4);
      *lo = _mm256_or_si256(*lo, q5_fifth_avx2(qh & 0xffffu));
      *hi = _mm256_or_si256(*hi, q5_fifth_avx2(qh >> 16));
    }
  }
}

// 4 rows × NT tokens. Per block and row: two vpmaddwd (int16 pairs → int32, exact: the 4
// products a lane gathers are at most 4·128·32767 < 2^24, so even the f32 conversion is exact),
// their sum converted to f32 and FMA'd with d_w·d_x into the row's accumulator; q4's m_w·s_x goes to a scalar sum.
// Q5_0/Q5_1's quants (≤ 31) are as exact: 4·31·32767 < 2^22.
// Split (q16x2act): the residual plane's two vpmaddwd give p2 (exact, < 2^24 too), and the
// block's value is fma(p2, 2^-15, p1) before the same scaling FMA.
// Q6_K's scaled quants (|w| ≤ 4096) reach 4·4096·32767 < 2^29 a lane: exact in int32, one f32
// rounding (2^-24 relative) at the conversion, as f32act's own sums round. Q3_K's (|w| ≤ 128)
// reach 4·128·32767 < 2^24 and Q2_K's (≤ 45) less: exact in f32 too. Q2_K's mins go to the
// scalar offset sum as the other formats' m·s does, one FMA per half: (−dmin·m)·h (exact product).
// Every token's order of operations is the same whatever NT is, so rows stay batch-invariant.
template <DType D, int NT, bool Split>
SNAP_TARGET_AVX2 void tile_avx2(const ActQ16& a, int64_t t0, const void* w, int64_t rows, const float* bias, float* y,
                                int64_t r) {
  constexpr int64_t bb = dtype_block_bytes(D);
  const int64_t nb = a.nb, cols = a.cols, row_bytes = dtype_row_bytes(D, cols);
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  const uint8_t* row[k_block_rows];  // rows past the end repeat the last one; results dropped
  for (int k = 0; k < k_block_rows; ++k) row[k] = static_cast<const uint8_t*>(w) + std::min(r + k, rows - 1) * row_bytes;
  const int16_t* xq = a.q.data() + t0 * cols;
  const int16_t* xq2 = Split ? a.q2.data() + t0 * cols : nullptr;
  const float* xd = a.d.data() + t0 * nb;
  const float* xs = a.s.data() + t0 * nb;
  const float* xh = a.h.data() + 2 * t0 * nb;
  __m256 acc[k_block_rows][NT];
  float macc[k_block_rows][NT];
  float kd[k_block_rows][8], km[k_block_rows][8];  // K formats: the current block's sub-block scales
  alignas(32) int16_t ks[k_block_rows][32];         // Q3_K/Q2_K: its 16 scales (and Q2_K's mins)
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) {
      acc[k][t] = _mm256_setzero_ps();
      macc[k][t] = 0.0f;
    }
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (k_super(D)) {
      if (b % 8 == 0)
        for (int k = 0; k < k_block_rows; ++k) k_scales8_avx2(row[k] + b / 8 * bb, kd[k], km[k]);
    }
    if constexpr (k_small(D)) {
      if (b % 8 == 0)
        for (int k = 0; k < k_block_rows; ++k) small_scales_avx2<D>(row[k] + b / 8 * bb, ks[k]);
    }
    for (int k = 0; k < k_block_rows; ++k) {
      const uint8_t* blk = row[k] + (k_256(D) ? b / 8 : b) * bb;
      const int j = static_cast<int>(b % 8);
      _mm_prefetch(reinterpret_cast<const char*>(blk + k_prefetch_bytes), _MM_HINT_T0);
      float dw, kmw = 0.0f;
      if constexpr (k_super(D)) {
        dw = kd[k][j];
        kmw = km[k][j];
      } else if constexpr (D == DType::q6_k) {
        dw = load_f16_f16c(blk + k_q6_d);
      } else if constexpr (D == DType::q3_k) {
        dw = load_f16_f16c(blk + k_q3_d);
      } else if constexpr (D == DType::q2_k) {
        dw = load_f16_f16c(blk + k_q2_d);
        kmw = -load_f16_f16c(blk + k_q2_dmin);
      } else {
        dw = load_f16_f16c(blk);
      }
      __m256i wl, wh;
      widen_block_avx2<D>(blk, j, ks[k], &wl, &wh);
      for (int t = 0; t < NT; ++t) {
        const auto* xb = reinterpret_cast<const __m256i*>(xq + t * cols + b * k_qk);
        const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(wl, _mm256_loadu_si256(xb)),
                                           _mm256_madd_epi16(wh, _mm256_loadu_si256(xb + 1)));
        __m256 v = _mm256_cvtepi32_ps(p);
        if constexpr (Split) {
          const auto* xb2 = reinterpret_cast<const __m256i*>(xq2 + t * cols + b * k_qk);
          const __m256i p2 = _mm256_add_epi32(_mm256_madd_epi16(wl, _mm256_loadu_si256(xb2)),
                                              _mm256_madd_epi16(wh, _mm256_loadu_si256(xb2 + 1)));
          v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p2), _mm256_set1_ps(k_lo_scale), v);
        }
        acc[k][t] = _mm256_fmadd_ps(v, _mm256_set1_ps(dw * xd[t * nb + b]), acc[k][t]);
      }
      if constexpr (k_min16(D)) {  // −dmin·m of each half times the activations' half sums
        const float m0 = kmw * static_cast<float>(ks[k][16 + 2 * j]), m1 = kmw * static_cast<float>(ks[k][17 + 2 * j]);
        for (int t = 0; t < NT; ++t) {
          macc[k][t] = std::fma(m0, xh[2 * (t * nb + b)], macc[k][t]);
          macc[k][t] = std::fma(m1, xh[2 * (t * nb + b) + 1], macc[k][t]);
        }
      }
      if constexpr (k_offset(D)) {
        const float mw = k_super(D) ? kmw : k_has_m(D) ? load_f16_f16c(blk + 2) : k_zero_point(D) * dw;
        // An explicit FMA, as in matvec_q8act.cpp: left to -ffp-contract, NT instantiations
        // could differ and a token's result would depend on its batch.
        for (int t = 0; t < NT; ++t) macc[k][t] = std::fma(mw, xs[t * nb + b], macc[k][t]);
      }
    }
  }
  for (int k = 0; k < nr; ++k)
    for (int t = 0; t < NT; ++t)
      y[t * rows + r + k] = hsum_avx2(acc[k][t]) + macc[k][t] + (bias ? bias[r + k] : 0.0f);
}

template <DType D, bool Split>
Q16TileFn pick(int nt) {
  switch (nt) {
    case 1: return tile_avx2<D, 1, Split>;
    case 2: return tile_avx2<D, 2, Split>;
    case 3: return tile_avx2<D, 3, Split>;
    default: return tile_avx2<D, 4, Split>;
  }
}

template <DType D>
Q16TileFn pick(int nt, bool split) {
  return split ? pick<D, true>(nt) : pick<D, false>(nt);
}

template <DType D>
void cpu_typed(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens, bool split) {
  thread_local ActQ16 a;  // the caller's thread only: filled before the parallel region
  a.quantize(x, num_tokens, w.cols, true, split);
  tiles::run(a, [split](int nt) { return q16act_tile(D, nt, split); }, w.data, w.rows, w.cols, bias, y, num_tokens);
}

void check_weight(const WeightView& w) {
  CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0) << "matvec q16act: empty weight";
  CHECK(q16act_reads(w.dtype)) << "matvec q16act: " << dtype_name(w.dtype)
                               << " weights (needs q8_0/q4_0/q4_1/q5_0/q5_1/q2_k/q3_k/q4_k/q5_k/q6_k)";
  CHECK(w.layout == WeightLayout::rows) << "matvec q16act: tiles4 weights (this kernel reads row-major blocks; "
                                           "matmul_cpu unpacks tiles4)";
  CHECK(w.cols % dtype_block_elems(w.dtype) == 0) << "matvec q16act: " << dtype_name(w.dtype) << " cols " << w.cols;
}

}  // namespace

void ActQ16::quantize(const float* x, int64_t num_tokens, int64_t c, bool simd, bool with_split) {
  cols = c;
  nb = c / k_qk;
  split = with_split;
  q.resize(static_cast<size_t>(num_tokens * cols));
  q2.resize(split ? static_cast<size_t>(num_tokens * cols) : 0);
  d.resize(static_cast<size_t>(num_tokens * nb));
  s.resize(static_cast<size_t>(num_tokens * nb));
  h.resize(static_cast<size_t>(2 * num_tokens * nb));
  for (int64_t t = 0; t < num_tokens; ++t) {
    int16_t* q2t = split ? &q2[t * cols] : nullptr;
    if (simd) {
      quantize_row_avx2(x + t * cols, cols, &q[t * cols], q2t, &d[t * nb], &s[t * nb], &h[2 * t * nb]);
    } else {
      for (int64_t b = 0; b < nb; ++b)
        quantize_block_scalar(x + t * cols + b * k_qk, &q[t * cols + b * k_qk], q2t ? q2t + b * k_qk : nullptr,
                              &d[t * nb + b], &s[t * nb + b], &h[2 * (t * nb + b)]);
    }
  }
}

Q16TileFn q16act_tile_avx2(DType d, int nt, bool split) {
  switch (d) {
    case DType::q8_0: return pick<DType::q8_0>(nt, split);
    case DType::q4_0: return pick<DType::q4_0>(nt, split);
    case DType::q5_0: return pick<DType::q5_0>(nt, split);
    case DType::q5_1: return pick<DType::q5_1>(nt, split);
    case DType::q4_k: return pick<DType::q4_k>(nt, split);
    case DType::q5_k: return pick<DType::q5_k>(nt, split);
    case DType::q6_k: return pick<DType::q6_k>(nt, split);
    case DType::q3_k: return pick<DType::q3_k>(nt, split);
    case DType::q2_k: return pick<DType::q2_k>(nt, split);
    default: return pick<DType::q4_1>(nt, split);
  }
}

bool q16act_reads(DType d) { return dtype_cpu_int_blocks(d) || k_q5(d) || k_256(d); }

Q16TileFn q16act_tile(DType d, int nt, bool split) {
  // The VNNI tiles read q8_0/q4_0/q4_1 only.
  if (dtype_cpu_int_blocks(d) && simd_level() == SimdLevel::avx512 && q16act_vnni_enabled() && q16act_vnni_supported())
    return q16act_tile_avx512vnni(d, nt, split);
  return q16act_tile_avx2(d, nt, split);
}

namespace {

void quantize_row(const float* x, int64_t cols, int16_t* q, int16_t* q2, float* d, float* s, const char* what) {
  CHECK(cols % k_qk == 0) << what << ": cols " << cols << " is not a multiple of 32";
  if (simd_level() != SimdLevel::scalar) return quantize_row_avx2(x, cols, q, q2, d, s, nullptr);
  for (int64_t b = 0; b < cols / k_qk; ++b)
    quantize_block_scalar(x + b * k_qk, q + b * k_qk, q2 ? q2 + b * k_qk : nullptr, d + b, s + b, nullptr);
}

void ref_any(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens, bool split) {
  check_weight(w);
  switch (w.dtype) {
    case DType::q8_0: return ref_typed<DType::q8_0>(x, w, bias, y, num_tokens, split);
    case DType::q4_0: return ref_typed<DType::q4_0>(x, w, bias, y, num_tokens, split);
    case DType::q5_0: return ref_typed<DType::q5_0>(x, w, bias, y, num_tokens, split);
    case DType::q5_1: return ref_typed<DType::q5_1>(x, w, bias, y, num_tokens, split);
    case DType::q4_k: return ref_typed<DType::q4_k>(x, w, bias, y, num_tokens, split);
    case DType::q5_k: return ref_typed<DType::q5_k>(x, w, bias, y, num_tokens, split);
    case DType::q6_k: return ref_typed<DType::q6_k>(x, w, bias, y, num_tokens, split);
    case DType::q3_k: return ref_typed<DType::q3_k>(x, w, bias, y, num_tokens, split);
    case DType::q2_k: return ref_typed<DType::q2_k>(x, w, bias, y, num_tokens, split);
    default: return ref_typed<DType::q4_1>(x, w, bias, y, num_tokens, split);
  }
}

void cpu_any(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens, bool split) {
  check_weight(w);
  if (simd_level() == SimdLevel::scalar) return ref_any(x, w, bias, y, num_tokens, split);
  switch (w.dtype) {
    case DType::q8_0: return cpu_typed<DType::q8_0>(x, w, bias, y, num_tokens, split);
    case DType::q4_0: return cpu_typed<DType::q4_0>(x, w, bias, y, num_tokens, split);
    case DType::q5_0: return cpu_typed<DType::q5_0>(x, w, bias, y, num_tokens, split);
    case DType::q5_1: return cpu_typed<DType::q5_1>(x, w, bias, y, num_tokens, split);
    case DType::q4_k: return cpu_typed<DType::q4_k>(x, w, bias, y, num_tokens, split);
    case DType::q5_k: return cpu_typed<DType::q5_k>(x, w, bias, y, num_tokens, split);
    case DType::q6_k: return cpu_typed<DType::q6_k>(x, w, bias, y, num_tokens, split);
    case DType::q3_k: return cpu_typed<DType::q3_k>(x, w, bias, y, num_tokens, split);
    case DType::q2_k: return cpu_typed<DType::q2_k>(x, w, bias, y, num_tokens, split);
    default: return cpu_typed<DType::q4_1>(x, w, bias, y, num_tokens, split);
  }
}

}  // namespace

void quantize_act_q16(const float* x, int64_t cols, int16_t* q, float* d, float* s) {
  quantize_row(x, cols, q, nullptr, d, s, "quantize_act_q16");
}

void quantize_act_q16x2(const float* x, int64_t cols, int16_t* q, int16_t* q2, float* d, float* s) {
  quantize_row(x, cols, q, q2, d, s, "quantize_act_q16x2");
}

void matvec_q16act_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  ref_any(x, w, bias, y, num_tokens, false);
}

void matvec_q16act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  cpu_any(x, w, bias, y, num_tokens, false);
}

void matvec_q16x2act_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  ref_any(x, w, bias, y, num_tokens, true);
}

void matvec_q16x2act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  cpu_any(x, w, bias, y, num_tokens, true);
}

}  // namespace snap::kernels
