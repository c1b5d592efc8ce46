// y[num_tokens, rows] = x[num_tokens, cols] · Wᵀ (+ bias) for f32, f16, bf16 weights and
// every ggml block format we load: q8_0, q4_0, q4_1, q5_0, q5_1 and the K formats q2_k .. q6_k (common/dtype.h). matmul_ref: f64 dot
// products. The K formats' 256-weight blocks are read 32 columns (one sub-block) at a time, so
// every tile below walks a row in 32-column chunks whatever the format.
// matmul_cpu: decode-sized batches go to a SIMD matvec (rows split across OpenMP threads,
// 4 rows × up to 4 tokens per register block, so each weight byte is loaded once per 4
// tokens; block formats are dequantized in registers, or with q8act/q16act multiplied as integers
// against quantized activations, kernels/cpu/matvec_q8act.cpp, matvec_q16act.cpp); larger batches go to OpenBLAS
// sgemm. matmul_multi_cpu runs several matrices' matvecs in one OpenMP region.
#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/k_blocks.h"
#include "kernels/cpu/matvec_q16act.h"
#include "kernels/cpu/matvec_q8x3act.h"
#include "kernels/cpu/matvec_q8act.h"
#include "kernels/cpu/matvec_tiles.h"
#include "kernels/cpu/simd.h"
#include "kernels/matmul_multi.h"
#include "kernels/matvec_act.h"
#include "kernels/weight_tiles.h"

namespace snap::kernels {

namespace {

template <DType D>
inline float load_w(const void* w, int64_t i) {
  if constexpr (D == DType::f32) return static_cast<const float*>(w)[i];
  if constexpr (D == DType::f16) return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  if constexpr (D == DType::bf16) return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
  return 0.0f;
}

// --- block formats: scalar decoding ---------------------------------------------------
// Every dequantized weight is exact in f32 or one rounding of an exact value: d is an f16
// (11 significant bits) and q has ≤ 8 bits, so d·q is exact, and q4_1's d·q + m rounds
// once whether or not it is fused. So all paths below (scalar, AVX2, AVX-512, the sgemm
// tiles) see bit-identical weights, equal to worker/model/dequant.cpp's.
constexpr int64_t k_qk = 32;  // elements per block

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q3_K's scales: scale_k3 (kernels/cpu/k_blocks.h).

// The K formats, one 32-weight sub-block (chunk j of 8) of the block at b, as
// worker/model/dequant.cpp computes it (bit-identical: every product is exact, one rounding):
//   q4_k: f16 d, f16 dmin, scales[12], qs[128]: w = (d·sc_j)·q − dmin·m_j, q nibble j&1 of
//         qs[32·(j/2) + l];
//   q5_k: f16 d, f16 dmin, scales[12], qh[32], qs[128]: as q4_k with bit j of qh[l] as q's fifth bit;
//   q6_k: ql[128], qh[64], int8 scales[16], f16 d: half g = j/4, s = j%4: q = (nibble s/2 of
//         ql[64g + 32(s&1) + l]) | ((qh[32g + l] >> 2s) & 3) << 4, w = (d·scale[8g + 2s + l/16])·(q − 32);
//   q3_k: hmask[32], qs[64], scales[12], f16 d: q = ((qs[32g + l] >> 2s) & 3) − (bit j of hmask[l] clear ? 4 : 0),
//         w = (d·scale_k3(2j + l/16))·q;
//   q2_k: scales[16], qs[64], f16 d, f16 dmin: q = (qs[32g + l] >> 2s) & 3, sc = scales[2j + l/16],
//         w = (d·(sc & 15))·q − dmin·(sc >> 4).
template <DType D>
inline void dequant_k_chunk_scalar(const uint8_t* b, int j, float* out) {
  if constexpr (D == DType::q4_k || D == DType::q5_k) {
    int sc, m;
    scale_min_k4(b + 4, j, &sc, &m);
    const float dl = load_f16(b) * static_cast<float>(sc), ml = load_f16(b + 2) * static_cast<float>(m);
    const uint8_t* qs = b + (D == DType::q4_k ? 16 : 48) + 32 * (j / 2);
    const int shift = 4 * (j & 1);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[l] >> shift) & 0x0f;
      if constexpr (D == DType::q5_k) q |= ((b[16 + l] >> j) & 1) << 4;
      out[l] = dl * static_cast<float>(q) - ml;
    }
  } else if constexpr (D == DType::q3_k) {
    const uint8_t* qs = b + 32 + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    const float d = load_f16(b + 108);
    for (int h = 0; h < 2; ++h) {
      const float dl = d * static_cast<float>(scale_k3(b + 96, 2 * j + h));
      for (int l = 16 * h; l < 16 * h + 16; ++l) {
        const int q = ((qs[l] >> shift) & 3) - ((((b[l] >> j) & 1) ^ 1) << 2);
        out[l] = dl * static_cast<float>(q);
      }
    }
  } else if constexpr (D == DType::q2_k) {
    const uint8_t* qs = b + 16 + 32 * (j / 4);
    const int shift = 2 * (j % 4);
    const float d = load_f16(b + 80), dmin = load_f16(b + 82);
    for (int h = 0; h < 2; ++h) {
      const uint8_t sc = b[2 * j + h];
      const float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
      for (int l = 16 * h; l < 16 * h + 16; ++l) out[l] = dl * static_cast<float>((qs[l] >> shift) & 3) - ml;
    }
  } else if constexpr (D == DType::q6_k) {
    const int g = j / 4, sub = j % 4;
    const uint8_t* ql = b + 64 * g + 32 * (sub & 1);
    const uint8_t* qh = b + 128 + 32 * g;
    const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = load_f16(b + 208);
    const int shift = 4 * (sub >> 1);
    for (int l = 0; l < 32; ++l) {
      const int q = ((ql[l] >> shift) & 0x0f) | (((qh[l] >> (2 * sub)) & 3) << 4);
      out[l] = d * static_cast<float>(scales[8 * g + 2 * sub + l / 16]) * static_cast<float>(q - 32);
    }
  }
}

constexpr bool k_block(DType d) { return dtype_block_elems(d) == 256; }

template <DType D>
inline void dequant_block_scalar(const uint8_t* b, float* out) {
  if constexpr (k_block(D)) {
    for (int j = 0; j < 8; ++j) dequant_k_chunk_scalar<D>(b, j, out + 32 * j);
  } else if constexpr (D == DType::q8_0) {
    const float d = load_f16(b);
    const auto* q = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(q[j]);
  } else if constexpr (D == DType::q4_0) {
    const float d = load_f16(b);
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>((b[2 + j] & 0x0f) - 8);
      out[j + 16] = d * static_cast<float>((b[2 + j] >> 4) - 8);
    }
  } else if constexpr (D == DType::q4_1) {
    const float d = load_f16(b), m = load_f16(b + 2);
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>(b[4 + j] & 0x0f) + m;
      out[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
    }
  } else if constexpr (D == DType::q5_0 || D == DType::q5_1) {
    // f16 d, (q5_1: f16 m,) u32 qh, qs[16]: q = nibble | bit j of qh << 4; w = d·(q − 16), or d·q + m.
    constexpr int head = D == DType::q5_0 ? 2 : 4;
    const float d = load_f16(b), m = D == DType::q5_1 ? load_f16(b + 2) : 0.0f;
    uint32_t qh;
    std::memcpy(&qh, b + head, 4);
    for (int j = 0; j < 16; ++j) {
      const int lo = (b[head + 4 + j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (b[head + 4 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      if constexpr (D == DType::q5_0) {
        out[j] = d * static_cast<float>(lo - 16);
        out[j + 16] = d * static_cast<float>(hi - 16);
      } else {
        out[j] = d * static_cast<float>(lo) + m;
        out[j + 16] = d * static_cast<float>(hi) + m;
      }
    }
  }
}

// Rows per block, tokens per group and the parallel threshold are the ones the quantized-
// activation tiles use (run_parts calls them with the same row blocks).
using tiles::k_block_rows;
using tiles::k_block_tokens;
using tiles::k_parallel_min_work;

// --- scalar -----------------------------------------------------------------
template <DType D>
void matvec_block_scalar(const float* x, const void* w, int64_t rows, int64_t cols, const float* bias, float* y,
                         int64_t num_tokens, int64_t r) {
  const int64_t r_end = std::min(rows, r + k_block_rows);
  for (int64_t i = r; i < r_end; ++i) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* xt = x + t * cols;
      float acc = 0.0f;
      for (int64_t c = 0; c < cols; ++c) acc += xt[c] * load_w<D>(w, i * cols + c);
      y[t * rows + i] = acc + (bias ? bias[i] : 0.0f);
    }
  }
}

// Block formats: each block of each row is decoded once and used for every token.
template <DType D>
void qmatvec_block_scalar(const float* x, const void* w, int64_t rows, int64_t cols, const float* bias, float* y,
                          int64_t num_tokens, int64_t r) {
  constexpr int64_t per = dtype_block_elems(D);
  const int64_t nb = cols / per;
  const auto* base = static_cast<const uint8_t*>(w);
  const int64_t r_end = std::min(rows, r + k_block_rows);
  float wb[per];
  for (int64_t i = r; i < r_end; ++i) {
    const uint8_t* row = base + i * nb * dtype_block_bytes(D);
    for (int64_t t = 0; t < num_tokens; ++t) y[t * rows + i] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      dequant_block_scalar<D>(row + b * dtype_block_bytes(D), wb);
      for (int64_t t = 0; t < num_tokens; ++t) {
        const float* xt = x + t * cols + b * per;
        for (int64_t c = 0; c < per; c += k_qk) {  // a sum per 32 columns, as for the 32-weight formats
          float acc = 0.0f;
          for (int j = 0; j < k_qk; ++j) acc += xt[c + j] * wb[c + j];
          y[t * rows + i] += acc;
        }
      }
    }
    if (bias) {
      for (int64_t t = 0; t < num_tokens; ++t) y[t * rows + i] += bias[i];
    }
  }
}

// --- AVX2 + FMA + F16C ------------------------------------------------------
template <DType D>
SNAP_TARGET_AVX2 inline __m256 load8_avx2(const void* w, int64_t i) {
  if constexpr (D == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (D == DType::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType D, int NT>
SNAP_TARGET_AVX2 void matvec_tile_avx2(const float* x, const void* w, int64_t rows, int64_t cols, const float* bias,
                                       float* y, int64_t r) {
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  int64_t row[k_block_rows];  // rows past the end repeat the last one; their results are dropped
  for (int k = 0; k < k_block_rows; ++k) row[k] = std::min(r + k, rows - 1) * cols;
  __m256 acc[k_block_rows][NT];
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) acc[k][t] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * cols + c);
    for (int k = 0; k < k_block_rows; ++k) {
      const __m256 wv = load8_avx2<D>(w, row[k] + c);
      for (int t = 0; t < NT; ++t) acc[k][t] = _mm256_fmadd_ps(wv, xv[t], acc[k][t]);
    }
  }
  for (int k = 0; k < nr; ++k) {
    for (int t = 0; t < NT; ++t) {
      float s = hsum_avx2(acc[k][t]);
      for (int64_t cc = c; cc < cols; ++cc) s += x[t * cols + cc] * load_w<D>(w, row[k] + cc);
      y[t * rows + r + k] = s + (bias ? bias[r + k] : 0.0f);
    }
  }
}

// An f16 through F16C: the exact value, as load_f16 gives it, without its branches (the K formats
// read two or four per 32 weights).
SNAP_TARGET_AVX2 inline float load_f16_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

SNAP_TARGET_AVX2 inline __m256 splat_f16_avx2(const uint8_t* p) { return _mm256_set1_ps(load_f16_f16c(p)); }

// One block as four vectors of 8: w[j] holds elements 8j .. 8j+7.
template <DType D>
SNAP_TARGET_AVX2 inline void dequant_block_avx2(const uint8_t* b, __m256 w[4]) {
  const __m256 d = splat_f16_avx2(b);
  if constexpr (D == DType::q5_0 || D == DType::q5_1) {
    // The fifth bits: byte i of each half gets bit i of its 16 bits of qh (shuffle its bytes
    // out, test one bit a byte), as 0x10.
    constexpr int head = D == DType::q5_0 ? 2 : 4;
    uint32_t qh;
    std::memcpy(&qh, b + head, 4);
    const __m128i all = _mm_set1_epi32(static_cast<int>(qh));
    const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    const __m128i k10 = _mm_set1_epi8(0x10), nib = _mm_set1_epi8(0x0f);
    const __m128i bytes_lo =
        _mm_and_si128(_mm_shuffle_epi8(all, _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)), bit);
    const __m128i bytes_hi =
        _mm_and_si128(_mm_shuffle_epi8(all, _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)), bit);
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + head + 4));
    __m128i lo = _mm_or_si128(_mm_and_si128(qs, nib), _mm_and_si128(_mm_cmpeq_epi8(bytes_lo, bit), k10));
    __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(qs, 4), nib), _mm_and_si128(_mm_cmpeq_epi8(bytes_hi, bit), k10));
    if constexpr (D == DType::q5_0) {
      lo = _mm_sub_epi8(lo, k10);
      hi = _mm_sub_epi8(hi, k10);
      w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d);
      w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d);
      w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d);
      w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d);
    } else {  // d·q is exact: fused or not, one rounding
      const __m256 m = splat_f16_avx2(b + 2);
      w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d, m);
      w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d, m);
      w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d, m);
      w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d, m);
    }
  } else if constexpr (D == DType::q8_0) {
    for (int j = 0; j < 4; ++j) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * j));
      w[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  } else {
    constexpr int k_qs = D == DType::q4_1 ? 4 : 2;
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k_qs));
    const __m128i nib = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(qs, nib);                     // elements 0..15
    __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), nib);  // elements 16..31
    if constexpr (D == DType::q4_0) {
      lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
      hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
      w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d);
      w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d);
      w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d);
      w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d);
    } else {
      const __m256 m = splat_f16_avx2(b + 2);
      w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d, m);
      w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d, m);
      w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d, m);
      w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d, m);
    }
  }
}

// A K format's sub-block j of the block at b as four vectors of 8 (the values of
// dequant_k_chunk_scalar: Q4_K/Q5_K/Q2_K's (d·sc)·q − dmin·m rounds once, fused or not; Q6_K's and
// Q3_K's products are exact). The bit fields are cut with 16-bit shifts and byte masks: a bit
// shifted in from the neighbouring byte never survives the mask.
template <DType D>
SNAP_TARGET_AVX2 inline void dequant_k_chunk_avx2(const uint8_t* b, int j, __m256 w[4]) {
  const __m128i nib = _mm_set1_epi8(0x0f);
  if constexpr (D == DType::q4_k || D == DType::q5_k) {
    int sc, m;
    scale_min_k4(b + 4, j, &sc, &m);
    const __m256 dl = _mm256_set1_ps(load_f16_f16c(b) * static_cast<float>(sc));
    const __m256 ml = _mm256_set1_ps(load_f16_f16c(b + 2) * static_cast<float>(m));
    const uint8_t* qs = b + (D == DType::q4_k ? 16 : 48) + 32 * (j / 2);
    const __m128i shift = _mm_cvtsi32_si128(4 * (j & 1));
    __m128i q0 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), shift), nib);
    __m128i q1 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)), shift), nib);
    if constexpr (D == DType::q5_k) {  // bit j of qh[l] above each nibble
      const __m128i hshift = _mm_cvtsi32_si128(j), one = _mm_set1_epi8(1);
      const __m128i h0 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)), hshift), one);
      const __m128i h1 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32)), hshift), one);
      q0 = _mm_or_si128(q0, _mm_slli_epi16(h0, 4));  // h ≤ 1: the shift stays in its byte
      q1 = _mm_or_si128(q1, _mm_slli_epi16(h1, 4));
    }
    w[0] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q0)), dl, ml);
    w[1] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q0, 8))), dl, ml);
    w[2] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q1)), dl, ml);
    w[3] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q1, 8))), dl, ml);
  } else if constexpr (D == DType::q3_k || D == DType::q2_k) {
    // Two halves of 16 weights, each with its own scale: q = 2 bits of qs[32g + l] (Q3_K: less 4
    // where bit j of hmask[l] is clear).
    const uint8_t* qs = b + (D == DType::q3_k ? 32 : 16) + 32 * (j / 4);
    const __m128i shift = _mm_cvtsi32_si128(2 * (j % 4)), three = _mm_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // unrolled: w stays in registers
      __m128i q = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * h)), shift), three);
      if constexpr (D == DType::q3_k) {
        const __m128i hm = _mm_and_si128(
            _mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * h)), _mm_cvtsi32_si128(j)),
            _mm_set1_epi8(1));
        q = _mm_sub_epi8(_mm_or_si128(q, _mm_slli_epi16(hm, 2)), _mm_set1_epi8(4));  // q + 4·bit − 4, in [−4, 3]
        const __m256 dl = _mm256_set1_ps(load_f16_f16c(b + 108) * static_cast<float>(scale_k3(b + 96, 2 * j + h)));
        w[2 * h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), dl);
        w[2 * h + 1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), dl);
      } else {
        const uint8_t sc = b[2 * j + h];
        const __m256 dl = _mm256_set1_ps(load_f16_f16c(b + 80) * static_cast<float>(sc & 0x0f));
        const __m256 ml = _mm256_set1_ps(load_f16_f16c(b + 82) * static_cast<float>(sc >> 4));
        w[2 * h] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), dl, ml);
        w[2 * h + 1] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), dl, ml);
      }
    }
  } else {
    const int g = j / 4, sub = j % 4;
    const uint8_t* ql = b + 64 * g + 32 * (sub & 1);
    const uint8_t* qh = b + 128 + 32 * g;
    const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = load_f16_f16c(b + 208);
    const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(scales[8 * g + 2 * sub]));
    const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(scales[8 * g + 2 * sub + 1]));
    const __m128i lshift = _mm_cvtsi32_si128(4 * (sub >> 1)), hshift = _mm_cvtsi32_si128(2 * sub);
    const __m128i three = _mm_set1_epi8(3), k32 = _mm_set1_epi8(32);
    __m128i q[2];
    for (int h = 0; h < 2; ++h) {
      const __m128i lo = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 16 * h)), lshift), nib);
      const __m128i hi = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * h)), hshift), three);
      q[h] = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), k32);  // hi ≤ 3: the shift stays in its byte
    }
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q[0])), d0);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q[0], 8))), d0);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q[1])), d1);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q[1], 8))), d1);
  }
}

// Columns 32c .. 32c + 31 of a row of blocks: block c of a 32-weight format, or sub-block c % 8 of
// block c / 8 of a K format. The byte offset of the block holding them, for the prefetches.
template <DType D>
constexpr int64_t chunk_block_offset(int64_t c) {
  return k_block(D) ? c / 8 * dtype_block_bytes(D) : c * dtype_block_bytes(D);
}
template <DType D>
SNAP_TARGET_AVX2 inline void dequant_chunk_avx2(const uint8_t* row, int64_t c, __m256 w[4]) {
  if constexpr (k_block(D)) dequant_k_chunk_avx2<D>(row + chunk_block_offset<D>(c), static_cast<int>(c % 8), w);
  else dequant_block_avx2<D>(row + chunk_block_offset<D>(c), w);
}

// Block formats: same blocking as matvec_tile_avx2; x is read from L1 inside the FMAs
// (16 accumulators already fill the 16 ymm registers).
template <DType D, int NT>
SNAP_TARGET_AVX2 void qmatvec_tile_avx2(const float* x, const void* w, int64_t rows, int64_t cols, const float* bias,
                                        float* y, int64_t r) {
  const int64_t row_bytes = dtype_row_bytes(D, cols), nb = cols / k_qk;  // nb: 32-column chunks
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  const uint8_t* row[k_block_rows];
  for (int k = 0; k < k_block_rows; ++k) row[k] = static_cast<const uint8_t*>(w) + std::min(r + k, rows - 1) * row_bytes;
  __m256 acc[k_block_rows][NT];
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) acc[k][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * k_qk;
    for (int k = 0; k < k_block_rows; ++k) {
      __m256 wv[4];
      dequant_chunk_avx2<D>(row[k], b, wv);
      for (int j = 0; j < 4; ++j)
        for (int t = 0; t < NT; ++t) acc[k][t] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(xb + t * cols + 8 * j), acc[k][t]);
    }
  }
  for (int k = 0; k < nr; ++k)
    for (int t = 0; t < NT; ++t) y[t * rows + r + k] = hsum_avx2(acc[k][t]) + (bias ? bias[r + k] : 0.0f);
}

// --- AVX-512 ----------------------------------------------------------------
template <DType D>
SNAP_TARGET_AVX512 inline __m512 load16_avx512(const void* w, int64_t i, __mmask16 m) {
  if constexpr (D == DType::f32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(w) + i);
    if constexpr (D == DType::f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType D, int NT>
SNAP_TARGET_AVX512 void matvec_tile_avx512(const float* x, const void* w, int64_t rows, int64_t cols,
                                           const float* bias, float* y, int64_t r) {
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  int64_t row[k_block_rows];
  for (int k = 0; k < k_block_rows; ++k) row[k] = std::min(r + k, rows - 1) * cols;
  __m512 acc[k_block_rows][NT];
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) acc[k][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < cols; c += 16) {
    // Full mask except on the last, partial chunk: one loop, no scalar tail.
    const __mmask16 m = cols - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - c)) - 1);
    __m512 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_maskz_loadu_ps(m, x + t * cols + c);
    for (int k = 0; k < k_block_rows; ++k) {
      const __m512 wv = load16_avx512<D>(w, row[k] + c, m);
      for (int t = 0; t < NT; ++t) acc[k][t] = _mm512_fmadd_ps(wv, xv[t], acc[k][t]);
    }
  }
  for (int k = 0; k < nr; ++k)
    for (int t = 0; t < NT; ++t) y[t * rows + r + k] = hsum_avx512(acc[k][t]) + (bias ? bias[r + k] : 0.0f);
}

SNAP_TARGET_AVX512 inline __m512 splat_f16_avx512(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm512_set1_ps(_cvtsh_ss(h));
}

// One block as two vectors of 16: w[0] holds elements 0..15, w[1] 16..31.
template <DType D>
SNAP_TARGET_AVX512 inline void dequant_block_avx512(const uint8_t* b, __m512 w[2]) {
  const __m512 d = splat_f16_avx512(b);
  if constexpr (D == DType::q8_0) {
    for (int j = 0; j < 2; ++j) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * j));
      w[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    }
  } else {
    constexpr int k_qs = D == DType::q4_1 ? 4 : 2;
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k_qs));
    const __m128i nib = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(qs, nib);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), nib);
    if constexpr (D == DType::q4_0) {
      lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
      hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
      w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
      w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
    } else {
      const __m512 m = splat_f16_avx512(b + 2);
      w[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), d, m);
      w[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), d, m);
    }
  }
}

// Columns 32c .. 32c + 31 as two vectors of 16 (see dequant_chunk_avx2): the K formats, Q5_0 and
// Q5_1 through their AVX2 decoding, its halves joined.
template <DType D>
SNAP_TARGET_AVX512 inline void dequant_chunk_avx512(const uint8_t* row, int64_t c, __m512 w[2]) {
  if constexpr (k_block(D) || D == DType::q5_0 || D == DType::q5_1) {
    __m256 h[4];
    dequant_chunk_avx2<D>(row, c, h);
    w[0] = _mm512_insertf32x8(_mm512_castps256_ps512(h[0]), h[1], 1);
    w[1] = _mm512_insertf32x8(_mm512_castps256_ps512(h[2]), h[3], 1);
  } else {
    dequant_block_avx512<D>(row + chunk_block_offset<D>(c), w);
  }
}

// Software prefetch distance for the block-format tiles: the hardware prefetcher alone left
// the q8_0 LM head (49152×576, one thread) at 5.7 GB/s, 5.2 ms; 1 KiB ahead of each row
// stream: 9.4 GB/s, 3.2 ms (512 B: 5.1 ms, 2 KiB: 3.5 ms). q4_x are compute-bound here.
constexpr int64_t k_prefetch_bytes = 1024;

// Block formats: as matvec_tile_avx512 with 32-element steps. Lane i of each accumulator
// sums columns ≡ i (mod 16) in column order, exactly like the f32 tile, so on the
// dequantized matrix both give bit-identical results. 16 accumulators + 2·NT x + 2 w ≤ 32 zmm.
template <DType D, int NT>
SNAP_TARGET_AVX512 void qmatvec_tile_avx512(const float* x, const void* w, int64_t rows, int64_t cols,
                                            const float* bias, float* y, int64_t r) {
  const int64_t row_bytes = dtype_row_bytes(D, cols), nb = cols / k_qk;  // nb: 32-column chunks
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  const uint8_t* row[k_block_rows];
  for (int k = 0; k < k_block_rows; ++k) row[k] = static_cast<const uint8_t*>(w) + std::min(r + k, rows - 1) * row_bytes;
  __m512 acc[k_block_rows][NT];
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) acc[k][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512 x0[NT], x1[NT];
    for (int t = 0; t < NT; ++t) {
      x0[t] = _mm512_loadu_ps(x + t * cols + b * k_qk);
      x1[t] = _mm512_loadu_ps(x + t * cols + b * k_qk + 16);
    }
    for (int k = 0; k < k_block_rows; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(row[k] + chunk_block_offset<D>(b) + k_prefetch_bytes), _MM_HINT_T0);
      __m512 wv[2];
      dequant_chunk_avx512<D>(row[k], b, wv);
      for (int t = 0; t < NT; ++t) acc[k][t] = _mm512_fmadd_ps(wv[0], x0[t], acc[k][t]);
      for (int t = 0; t < NT; ++t) acc[k][t] = _mm512_fmadd_ps(wv[1], x1[t], acc[k][t]);
    }
  }
  for (int k = 0; k < nr; ++k)
    for (int t = 0; t < NT; ++t) y[t * rows + r + k] = hsum_avx512(acc[k][t]) + (bias ? bias[r + k] : 0.0f);
}

// --- dispatch ---------------------------------------------------------------
using TileFn = void (*)(const float*, const void*, int64_t, int64_t, const float*, float*, int64_t);

template <DType D>
TileFn pick_tile(SimdLevel level, int nt) {
  if constexpr (dtype_is_quantized(D)) {
    if (level == SimdLevel::avx512) {
      switch (nt) {
        case 1: return qmatvec_tile_avx512<D, 1>;
        case 2: return qmatvec_tile_avx512<D, 2>;
        case 3: return qmatvec_tile_avx512<D, 3>;
        default: return qmatvec_tile_avx512<D, 4>;
      }
    }
    switch (nt) {
      case 1: return qmatvec_tile_avx2<D, 1>;
      case 2: return qmatvec_tile_avx2<D, 2>;
      case 3: return qmatvec_tile_avx2<D, 3>;
      default: return qmatvec_tile_avx2<D, 4>;
    }
  }
  if (level == SimdLevel::avx512) {
    switch (nt) {
      case 1: return matvec_tile_avx512<D, 1>;
      case 2: return matvec_tile_avx512<D, 2>;
      case 3: return matvec_tile_avx512<D, 3>;
      default: return matvec_tile_avx512<D, 4>;
    }
  }
  switch (nt) {
    case 1: return matvec_tile_avx2<D, 1>;
    case 2: return matvec_tile_avx2<D, 2>;
    case 3: return matvec_tile_avx2<D, 3>;
    default: return matvec_tile_avx2<D, 4>;
  }
}

// --- the matvec driver ----------------------------------------------------------
// One matrix of a (possibly fused) matvec call: its output and how to run one of its row
// blocks (k_block_rows rows, every token). A block's arithmetic depends only on the matrix,
// the block and x, never on what else shares the call, so fused and single calls agree bitwise.
using ScalarBlockFn = void (*)(const float*, const void*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
struct MatvecPart {
  WeightView w;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t num_blocks = 0;
  ScalarBlockFn scalar = nullptr;          // SIMD level scalar
  TileFn full = nullptr, tail = nullptr;   // f32 activations: 4 tokens, num_tokens % 4
  Q8TileFn qfull = nullptr, qtail = nullptr;  // q8act (kernels/cpu/matvec_q8act.cpp)
  Q16TileFn q16full = nullptr, q16tail = nullptr;  // q16act/q16x2act (kernels/cpu/matvec_q16act.cpp)
  bool q16split = false;                           // q16x2act: the tiles read the residual plane
  Q8x3TileFn x3full = nullptr, x3tail = nullptr;   // q8x3act (kernels/cpu/matvec_q8x3act.cpp)
  // A tiles4 matrix (kernels/weight_tiles.h) whose tiles above read row-major blocks: each row
  // block is unpacked first (only the q8x3act VNNI tiles read tiles4 themselves).
  bool unpack = false;
};

template <DType D>
MatvecPart make_part(const WeightView& w, const float* bias, float* y, SimdLevel level, int rest, MatvecAct act) {
  MatvecPart p;
  p.w = w;
  p.bias = bias;
  p.y = y;
  p.num_blocks = (w.rows + k_block_rows - 1) / k_block_rows;
  if (level == SimdLevel::scalar) {
    if constexpr (dtype_is_quantized(D)) p.scalar = qmatvec_block_scalar<D>;
    else p.scalar = matvec_block_scalar<D>;
  } else if (dtype_cpu_int_blocks(D) && act == MatvecAct::q8) {
    p.qfull = q8act_tile_avx2(D, k_block_tokens);
    p.qtail = rest ? q8act_tile_avx2(D, rest) : nullptr;
  } else if (q16act_reads(D) && (act == MatvecAct::q16 || act == MatvecAct::q16x2)) {
    const bool split = act == MatvecAct::q16x2;
    p.q16full = q16act_tile(D, k_block_tokens, split);
    p.q16tail = rest ? q16act_tile(D, rest, split) : nullptr;
    p.q16split = split;
  } else if (dtype_cpu_int_blocks(D) && act == MatvecAct::q8x3) {
    if (w.layout == WeightLayout::tiles4 && q8x3act_tile_t4(D, k_block_tokens) != nullptr) {
      p.x3full = q8x3act_tile_t4(D, k_block_tokens);
      p.x3tail = rest ? q8x3act_tile_t4(D, rest) : nullptr;
      return p;
    }
    p.x3full = q8x3act_tile(D, k_block_tokens);
    p.x3tail = rest ? q8x3act_tile(D, rest) : nullptr;
  } else {
    p.full = pick_tile<D>(level, k_block_tokens);
    p.tail = rest ? pick_tile<D>(level, rest) : nullptr;
  }
  p.unpack = w.layout == WeightLayout::tiles4;
  return p;
}

MatvecPart make_part(const WeightView& w, const float* bias, float* y, SimdLevel level, int rest, MatvecAct act) {
  CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0) << "matmul: empty weight";
  CHECK(w.cols % dtype_block_elems(w.dtype) == 0) << "matmul: " << dtype_name(w.dtype) << " cols " << w.cols;
  CHECK(w.layout == WeightLayout::rows || dtype_is_quantized(w.dtype))
      << "matmul: tiles4 layout on " << dtype_name(w.dtype) << " weights";
  switch (w.dtype) {
    case DType::f32: return make_part<DType::f32>(w, bias, y, level, rest, act);
    case DType::f16: return make_part<DType::f16>(w, bias, y, level, rest, act);
    case DType::bf16: return make_part<DType::bf16>(w, bias, y, level, rest, act);
    case DType::q8_0: return make_part<DType::q8_0>(w, bias, y, level, rest, act);
    case DType::q4_0: return make_part<DType::q4_0>(w, bias, y, level, rest, act);
    case DType::q4_1: return make_part<DType::q4_1>(w, bias, y, level, rest, act);
    case DType::q5_0: return make_part<DType::q5_0>(w, bias, y, level, rest, act);
    case DType::q5_1: return make_part<DType::q5_1>(w, bias, y, level, rest, act);
    case DType::q4_k: return make_part<DType::q4_k>(w, bias, y, level, rest, act);
    case DType::q6_k: return make_part<DType::q6_k>(w, bias, y, level, rest, act);
    case DType::q5_k: return make_part<DType::q5_k>(w, bias, y, level, rest, act);
    case DType::q3_k: return make_part<DType::q3_k>(w, bias, y, level, rest, act);
    case DType::q2_k: return make_part<DType::q2_k>(w, bias, y, level, rest, act);
  }
  CHECK(false) << "matmul: the CPU kernels cannot read " << dtype_name(w.dtype) << " weights";
  return {};
}

// Token groups innermost: a block of 4 rows (≤ 4·cols·4 bytes) stays in L1 across groups.
void run_block(const MatvecPart& p, const float* x, const ActQ8& act, const ActQ16& act16, const ActQ8x3& act8x3,
               int64_t num_tokens, int64_t b) {
  const int64_t rows = p.w.rows, cols = p.w.cols, r = b * k_block_rows;
  if (p.unpack) {
    // The block's rows as a row-major matrix of nr rows, run as one block, its y scattered back:
    // the same tile arithmetic as on the row-major matrix, so the same results.
    const int64_t nr = std::min<int64_t>(k_block_rows, rows - r);
    thread_local std::vector<uint8_t> wbuf;
    thread_local std::vector<float> ybuf;
    wbuf.resize(static_cast<size_t>(nr * dtype_row_bytes(p.w.dtype, cols)));
    ybuf.resize(static_cast<size_t>(num_tokens * nr));
    weight_tiles4_unpack_rows(p.w, r, nr, wbuf.data());
    MatvecPart q = p;
    q.unpack = false;
    q.w = {p.w.dtype, wbuf.data(), nr, cols, WeightLayout::rows};
    q.bias = p.bias ? p.bias + r : nullptr;
    q.y = ybuf.data();
    q.num_blocks = 1;
    run_block(q, x, act, act16, act8x3, num_tokens, 0);
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t k = 0; k < nr; ++k) p.y[t * rows + r + k] = ybuf[static_cast<size_t>(t * nr + k)];
    return;
  }
  if (p.scalar) return p.scalar(x, p.w.data, rows, cols, p.bias, p.y, num_tokens, r);
  const int64_t full_groups = num_tokens / k_block_tokens;
  const int64_t t_rest = full_groups * k_block_tokens;
  if (p.qfull) {
    for (int64_t g = 0; g < full_groups; ++g)
      p.qfull(act, g * k_block_tokens, p.w.data, rows, p.bias, p.y + g * k_block_tokens * rows, r);
    if (p.qtail) p.qtail(act, t_rest, p.w.data, rows, p.bias, p.y + t_rest * rows, r);
    return;
  }
  if (p.q16full) {
    for (int64_t g = 0; g < full_groups; ++g)
      p.q16full(act16, g * k_block_tokens, p.w.data, rows, p.bias, p.y + g * k_block_tokens * rows, r);
    if (p.q16tail) p.q16tail(act16, t_rest, p.w.data, rows, p.bias, p.y + t_rest * rows, r);
    return;
  }
  if (p.x3full) {
    for (int64_t g = 0; g < full_groups; ++g)
      p.x3full(act8x3, g * k_block_tokens, p.w.data, rows, p.bias, p.y + g * k_block_tokens * rows, r);
    if (p.x3tail) p.x3tail(act8x3, t_rest, p.w.data, rows, p.bias, p.y + t_rest * rows, r);
    return;
  }
  for (int64_t g = 0; g < full_groups; ++g) {
    const int64_t t0 = g * k_block_tokens;
    p.full(x + t0 * cols, p.w.data, rows, cols, p.bias, p.y + t0 * rows, r);
  }
  if (p.tail) p.tail(x + t_rest * cols, p.w.data, rows, cols, p.bias, p.y + t_rest * rows, r);
}

// All parts' row blocks in one OpenMP region (static schedule over their concatenation: the
// parts share cols, so blocks cost alike). x is quantized once when any part runs q8act/q16act.
void run_parts(const float* x, const MatvecPart* parts, int count, int64_t num_tokens) {
  thread_local ActQ8 act;  // the caller's thread only: filled before the parallel region
  thread_local ActQ16 act16;
  thread_local ActQ8x3 act8x3;
  int64_t total = 0, work = 0;
  bool q8 = false, q16 = false, q16split = false, x3 = false;
  for (int i = 0; i < count; ++i) {
    total += parts[i].num_blocks;
    work += parts[i].w.rows * parts[i].w.cols * num_tokens;
    q8 = q8 || parts[i].qfull != nullptr;
    q16 = q16 || parts[i].q16full != nullptr;
    q16split = q16split || parts[i].q16split;
    x3 = x3 || parts[i].x3full != nullptr;
  }
  if (q8) act.quantize(x, num_tokens, parts[0].w.cols, true);
  if (q16) act16.quantize(x, num_tokens, parts[0].w.cols, true, q16split);
  if (x3) act8x3.quantize(x, num_tokens, parts[0].w.cols, simd_level() == SimdLevel::avx512);
  const ActQ8& a = act;
  const ActQ16& a16 = act16;
  const ActQ8x3& a8x3 = act8x3;
#pragma omp parallel for schedule(static) if (work >= k_parallel_min_work)
  for (int64_t g = 0; g < total; ++g) {
    int i = 0;
    int64_t b = g;
    while (b >= parts[i].num_blocks) b -= parts[i++].num_blocks;
    run_block(parts[i], x, a, a16, a8x3, num_tokens, b);
  }
}

// The integer paths only for block formats on a SIMD level (the scalar level stays the f32 reference).
// Q5_0, Q5_1 and the K formats Q2_K to Q6_K have q16act/q16x2act tiles only (matvec_q16act.cpp):
// they run q16act when asked and q16x2act under the other integer modes (q8act, q8x3act: the
// accurate one of theirs).
MatvecAct act_for(DType d, SimdLevel level) {
  if (level == SimdLevel::scalar) return MatvecAct::f32;
  const MatvecAct mode = matvec_act();
  if (dtype_cpu_int_blocks(d)) return mode;
  if (q16act_reads(d))  // Q5_0, Q5_1, Q2_K .. Q6_K
    return mode == MatvecAct::f32 || mode == MatvecAct::q16 ? mode : MatvecAct::q16x2;
  return MatvecAct::f32;
}

void matvec(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens, MatvecAct act) {
  const SimdLevel level = simd_level();
  const int rest = static_cast<int>(num_tokens % k_block_tokens);
  const MatvecPart part = make_part(w, bias, y, level, rest, act);
  run_parts(x, &part, 1, num_tokens);
}

// --- f16/bf16/block formats → f32 conversion for the sgemm path ----------------
// n elements from src (for a block format n is whole blocks and src points at a block).
template <DType D>
SNAP_TARGET_AVX512 void convert_avx512(const void* src, float* dst, int64_t n) {
  if constexpr (dtype_is_quantized(D)) {
    const auto* b = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; i += k_qk) {  // 32-column chunks of the blocks from src on
      __m512 w[2];
      dequant_chunk_avx512<D>(b, i / k_qk, w);
      _mm512_storeu_ps(dst + i, w[0]);
      _mm512_storeu_ps(dst + i + 16, w[1]);
    }
  } else {
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
      _mm512_mask_storeu_ps(dst + i, m, load16_avx512<D>(src, i, m));
    }
  }
}

template <DType D>
SNAP_TARGET_AVX2 void convert_avx2(const void* src, float* dst, int64_t n) {
  if constexpr (dtype_is_quantized(D)) {
    const auto* b = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; i += k_qk) {
      __m256 w[4];
      dequant_chunk_avx2<D>(b, i / k_qk, w);
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(dst + i + 8 * j, w[j]);
    }
  } else {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_avx2<D>(src, i));
    for (; i < n; ++i) dst[i] = load_w<D>(src, i);
  }
}

template <DType D>
void convert_scalar(const void* src, float* dst, int64_t n) {
  if constexpr (dtype_is_quantized(D)) {
    const auto* b = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; i += dtype_block_elems(D), b += dtype_block_bytes(D)) dequant_block_scalar<D>(b, dst + i);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load_w<D>(src, i);
  }
}

template <DType D>
void convert_rows(const void* src, float* dst, int64_t n) {
  switch (simd_level()) {
    case SimdLevel::avx512: return convert_avx512<D>(src, dst, n);
    case SimdLevel::avx2: return convert_avx2<D>(src, dst, n);
    case SimdLevel::scalar: return convert_scalar<D>(src, dst, n);
  }
}

// f16/bf16 prefill: convert a tile of W rows to f32 (sized to stay in L2, 1 MiB per core
// here: 256 KiB) and sgemm it, rather than a hand-blocked SIMD GEMM: OpenBLAS reaches 63–81
// GFLOP/s per core at 512 tokens on f32, and the tiled f16 path 55–65 GFLOP/s (bench_kernels,
// one thread), i.e. conversion costs 10–20%, far less than matching OpenBLAS's blocking would.
// Block formats use 8 MiB tiles, converted by all OpenMP threads: every projection of
// SmolLM2-135M is then one sgemm call, which OpenBLAS spreads over its own threads; with
// 256 KiB tiles (14 calls for 1536×576, serial conversion between them while OpenBLAS's
// threads spin) prefill at 512 tokens ran at 310 tok/s vs 570 for f32 (bench_generate,
// --threads 1, OpenBLAS at its default 2 threads); with 8 MiB tiles 612 vs 566.
constexpr int64_t k_tile_bytes = 256 << 10;
constexpr int64_t k_tile_bytes_blocks = 8 << 20;

// The converted tile, kept between calls on the caller's thread and never zeroed (every element
// used is written first): a fresh zeroed vector per projection put a memset and the page faults
// of up to 8 MiB in every prefill projection (6% of test_engine's time in Release, a quarter
// under ASan, whose allocator maps large blocks afresh each time).
float* tile_scratch(int64_t floats) {
  thread_local std::unique_ptr<float[]> buf;
  thread_local int64_t cap = 0;
  if (floats > cap) {
    buf.reset(new float[static_cast<size_t>(floats)]);
    cap = floats;
  }
  return buf.get();
}

template <DType D>
void gemm_converted(const float* x, const WeightView& w, float* y, int64_t num_tokens) {
  const int64_t rows = w.rows, cols = w.cols;
  const int64_t tile_bytes = dtype_is_quantized(D) ? k_tile_bytes_blocks : k_tile_bytes;
  int64_t tile_rows = std::max<int64_t>(16, tile_bytes / (cols * 4));
  if (w.layout == WeightLayout::tiles4) tile_rows = tile_rows / 4 * 4;  // whole 4-row tiles per task
  float* const tile = tile_scratch(std::min(tile_rows, rows) * cols);
  const auto* src = static_cast<const uint8_t*>(w.data);
  const int64_t row_bytes = dtype_row_bytes(D, cols);
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t nr = std::min(tile_rows, rows - r0);
    if constexpr (dtype_is_quantized(D)) {
      constexpr int64_t k_rows_per_task = 64;
#pragma omp parallel for schedule(static) if (nr > k_rows_per_task)
      for (int64_t i = 0; i < nr; i += k_rows_per_task) {
        const int64_t n = std::min(k_rows_per_task, nr - i);
        if (w.layout == WeightLayout::tiles4) {  // rows back to row-major blocks, in L1/L2, then as below
          thread_local std::vector<uint8_t> blocks;
          blocks.resize(static_cast<size_t>(n * row_bytes));
          weight_tiles4_unpack_rows(w, r0 + i, n, blocks.data());
          convert_rows<D>(blocks.data(), tile + i * cols, n * cols);
        } else {
          convert_rows<D>(src + (r0 + i) * row_bytes, tile + i * cols, n * cols);
        }
      }
    } else {
      convert_rows<D>(src + r0 * row_bytes, tile, nr * cols);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(num_tokens), static_cast<int>(nr),
                static_cast<int>(cols), 1.0f, x, static_cast<int>(cols), tile, static_cast<int>(cols), 0.0f,
                y + r0, static_cast<int>(rows));
  }
}

}  // namespace

// --- reference ----------------------------------------------------------------
namespace {

// Row r of w as f32 (exact: see the block-format notes above).
void ref_row(const WeightView& w, int64_t r, float* out) {
  std::vector<uint8_t> unpacked;
  const auto* row = static_cast<const uint8_t*>(w.data) + r * dtype_row_bytes(w.dtype, w.cols);
  if (w.layout == WeightLayout::tiles4) {
    unpacked.resize(static_cast<size_t>(dtype_row_bytes(w.dtype, w.cols)));
    weight_tiles4_unpack_rows(w, r, 1, unpacked.data());
    row = unpacked.data();
  }
  for (int64_t c = 0; c < w.cols; c += dtype_block_elems(w.dtype)) {
    switch (w.dtype) {
      case DType::f32: out[c] = load_w<DType::f32>(row, c); break;
      case DType::f16: out[c] = load_w<DType::f16>(row, c); break;
      case DType::bf16: out[c] = load_w<DType::bf16>(row, c); break;
      case DType::q8_0: dequant_block_scalar<DType::q8_0>(row + c / k_qk * 34, out + c); break;
      case DType::q4_0: dequant_block_scalar<DType::q4_0>(row + c / k_qk * 18, out + c); break;
      case DType::q4_1: dequant_block_scalar<DType::q4_1>(row + c / k_qk * 20, out + c); break;
      case DType::q5_0: dequant_block_scalar<DType::q5_0>(row + c / k_qk * 22, out + c); break;
      case DType::q5_1: dequant_block_scalar<DType::q5_1>(row + c / k_qk * 24, out + c); break;
      case DType::q4_k: dequant_block_scalar<DType::q4_k>(row + c / 256 * 144, out + c); break;
      case DType::q6_k: dequant_block_scalar<DType::q6_k>(row + c / 256 * 210, out + c); break;
      case DType::q5_k: dequant_block_scalar<DType::q5_k>(row + c / 256 * 176, out + c); break;
      case DType::q3_k: dequant_block_scalar<DType::q3_k>(row + c / 256 * 110, out + c); break;
      case DType::q2_k: dequant_block_scalar<DType::q2_k>(row + c / 256 * 84, out + c); break;
    }
  }
}

}  // namespace

void matmul_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  std::vector<float> wr(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    ref_row(w, r, wr.data());
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = bias ? bias[r] : 0.0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(x[t * w.cols + c]) * wr[c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

// --- fast paths -----------------------------------------------------------------
void matmul_matvec_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  matvec(x, w, bias, y, num_tokens, act_for(w.dtype, simd_level()));
}

void matmul_matvec_f32act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  matvec(x, w, bias, y, num_tokens, MatvecAct::f32);
}

void matmul_gemm_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0) << "matmul: empty weight";
  CHECK(w.layout == WeightLayout::rows || dtype_is_quantized(w.dtype))
      << "matmul: tiles4 layout on " << dtype_name(w.dtype) << " weights";
  CHECK(w.cols % dtype_block_elems(w.dtype) == 0) << "matmul: " << dtype_name(w.dtype) << " cols " << w.cols;
  switch (w.dtype) {
    case DType::f32:
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(num_tokens), static_cast<int>(w.rows),
                  static_cast<int>(w.cols), 1.0f, x, static_cast<int>(w.cols), static_cast<const float*>(w.data),
                  static_cast<int>(w.cols), 0.0f, y, static_cast<int>(w.rows));
      break;
    case DType::f16: gemm_converted<DType::f16>(x, w, y, num_tokens); break;
    case DType::bf16: gemm_converted<DType::bf16>(x, w, y, num_tokens); break;
    case DType::q8_0: gemm_converted<DType::q8_0>(x, w, y, num_tokens); break;
    case DType::q4_0: gemm_converted<DType::q4_0>(x, w, y, num_tokens); break;
    case DType::q4_1: gemm_converted<DType::q4_1>(x, w, y, num_tokens); break;
    case DType::q5_0: gemm_converted<DType::q5_0>(x, w, y, num_tokens); break;
    case DType::q5_1: gemm_converted<DType::q5_1>(x, w, y, num_tokens); break;
    case DType::q4_k: gemm_converted<DType::q4_k>(x, w, y, num_tokens); break;
    case DType::q6_k: gemm_converted<DType::q6_k>(x, w, y, num_tokens); break;
    case DType::q5_k: gemm_converted<DType::q5_k>(x, w, y, num_tokens); break;
    case DType::q3_k: gemm_converted<DType::q3_k>(x, w, y, num_tokens); break;
    case DType::q2_k: gemm_converted<DType::q2_k>(x, w, y, num_tokens); break;
  }
  if (bias) {
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t r = 0; r < w.rows; ++r) y[t * w.rows + r] += bias[r];
  }
}

namespace {
int64_t gemm_min_tokens(DType d) {
  return d == DType::f32 ? k_matmul_gemm_min_tokens_f32
         : dtype_is_quantized(d) ? k_matmul_gemm_min_tokens_quant
                                 : k_matmul_gemm_min_tokens_half;
}
}  // namespace

void matmul_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  if (num_tokens < gemm_min_tokens(w.dtype)) return matmul_matvec_cpu(x, w, bias, y, num_tokens);
  matmul_gemm_cpu(x, w, bias, y, num_tokens);
}

void matmul_rowwise_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  matmul_matvec_cpu(x, w, bias, y, num_tokens);
}

void matmul_multi_cpu(const float* x, const MatmulOut* outs, int count, int64_t num_tokens, bool rowwise) {
  CHECK(count >= 1 && count <= k_matmul_multi_max) << "matmul_multi: " << count << " matrices";
  const SimdLevel level = simd_level();
  const int rest = static_cast<int>(num_tokens % k_block_tokens);
  MatvecPart parts[k_matmul_multi_max];
  int n = 0;
  for (int i = 0; i < count; ++i) {
    const MatmulOut& o = outs[i];
    CHECK_EQ(o.w.cols, outs[0].w.cols) << "matmul_multi: the matrices must share their input width";
    if (!rowwise && num_tokens >= gemm_min_tokens(o.w.dtype)) {
      matmul_gemm_cpu(x, o.w, o.bias, o.y, num_tokens);  // as matmul_cpu would
      continue;
    }
    parts[n++] = make_part(o.w, o.bias, o.y, level, rest, act_for(o.w.dtype, level));
  }
  if (n > 0) run_parts(x, parts, n, num_tokens);
}

}  // namespace snap::kernels
