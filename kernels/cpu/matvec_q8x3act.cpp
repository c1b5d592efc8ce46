// The q8x3-activation matvec for block-format weights (kernels/matvec_act.h): activations are
// quantized once per call to 22-bit integers per block of 32 (V = round(x/d), d = max|x| /
// (127·2^14)), held as three signed 8-bit digit planes V = a·2^14 + b·2^7 + c, so that each
// block's dot product with the weight quants is an exact integer sum of u8 × s8 products: what
// AVX-512 VNNI's vpdpbusd does, 64 of them per instruction. The activation rounding error is at
// most 3/4·d ≈ 2^-21.4·max|x| per block (half a step, plus the f32 rounding of x·(1/d) near
// 2^21; q16act: 2^-16, q16x2act: 2^-31, an f32 element's own rounding: 2^-24 of itself).
//   q4_0 / q4_1: the nibbles are the u8 side as they are (q4_0's −8 and q4_1's m go to a
//     per-block m·Σx term, as in q16act).
//   q8_0: the quants + 128 (a sign-bit flip) are the u8 side; the 128·ΣV the flip adds is taken
//     off in the integer domain (the activation's digit sums), so nothing cancels in f32.
// The vector tile takes 4 rows × 4 blocks at a time: the 4 blocks' low-nibble halves in one
// zmm and their high halves in another (the activation planes are stored in that order), six
// vpdpbusd per row and token for the three planes, a 4 × 4 transpose-and-add that turns the
// four rows' lanes into one int32 per (block, row), and one f32 scaling FMA for all 16 of them,
// with the 16 weight scales fetched by one gather of the blocks' first 4 bytes.
// *_ref is the plain scalar version (exact int64 block sums, f64 accumulation).
#include "kernels/cpu/matvec_q8x3act.h"

#include <cpuid.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/matvec_tiles.h"
#include "kernels/cpu/simd.h"
#include "kernels/matvec_act.h"
#include "kernels/weight_tiles.h"

#define SNAP_TARGET_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

namespace snap::kernels {

namespace {

constexpr int64_t k_qk = 32;
constexpr int64_t k_group = 4;                  // blocks per group
constexpr int64_t k_group_bytes = 128;          // per plane and group
constexpr int32_t k_vmax = 127 * 16384 + 8191;  // |V| clamp: keeps a within [-127, 127]
constexpr float k_vscale = 127.0f * 16384.0f;   // d = max|x| / k_vscale
using tiles::k_block_rows;
// Software prefetch ahead of each row stream. bench_matvec, q4_1 stack, 2 threads, as a ratio to
// q16x2act in the same run: 1 KiB (matvec_q16act.cpp's) 0.80, 3 KiB 0.47-0.65, 4 KiB 0.63, 6 KiB 0.60-0.64.
constexpr int64_t k_prefetch_bytes = 4096;
// The tiles4 tile's one stream per 4 rows: prefetch this far ahead (bench_matvec, q4_1 stack,
// 2 threads; see tile_vnni_t4).
constexpr int64_t k_prefetch_t4_bytes = 8192;

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Byte offset, within a token's plane, of element e of block bi.
inline int64_t plane_pos(int64_t bi, int e) {
  return (bi / k_group) * k_group_bytes + (e < 16 ? 0 : 64) + (bi % k_group) * 16 + (e & 15);
}

// The digits of V, and the scales of one block, as the layout of ActQ8x3 says.
inline void digits(int32_t v, int8_t* a, int8_t* b, int8_t* c) {
  const int32_t da = (v + 8192) >> 14;  // arithmetic shift: floor
  const int32_t rem = v - da * 16384;   // [-8192, 8191]
  const int32_t db = (rem + 64) >> 7;   // [-64, 64]
  *a = static_cast<int8_t>(da);
  *b = static_cast<int8_t>(db);
  *c = static_cast<int8_t>(rem - db * 128);  // [-64, 63]
}

// One block, scalar: V in v[32] (for the reference), the digits into the planes, d and s.
void quantize_block_scalar(const float* x, int64_t bi, int8_t* pa, int8_t* pb, int8_t* pc, int32_t* v, float* d,
                           float* s, int32_t sums[3]) {
  sums[0] = sums[1] = sums[2] = 0;
  float amax = 0.0f;
  bool finite = true;
  for (int j = 0; j < k_qk; ++j) {
    finite = finite && std::isfinite(x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  if (!finite) {
    for (int j = 0; j < k_qk; ++j) {
      v[j] = 0;
      pa[plane_pos(bi, j)] = pb[plane_pos(bi, j)] = pc[plane_pos(bi, j)] = 0;
    }
    *d = *s = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float dd = amax / k_vscale;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  int32_t sum = 0;
  for (int j = 0; j < k_qk; ++j) {
    const float p = x[j] * id;
    v[j] = std::clamp(static_cast<int32_t>(std::nearbyint(p)), -k_vmax, k_vmax);
    sum += v[j];
    int8_t* qa = &pa[plane_pos(bi, j)];
    int8_t* qb = &pb[plane_pos(bi, j)];
    int8_t* qc = &pc[plane_pos(bi, j)];
    digits(v[j], qa, qb, qc);
    sums[0] += *qa;
    sums[1] += *qb;
    sums[2] += *qc;
  }
  *d = dd;
  *s = dd * static_cast<float>(sum);
}

// The same block with AVX-512: the same IEEE operations (|x| max, one division, x·(1/d),
// round to nearest even, the same clamp and integer digits), so bit-identical to the scalar one.
SNAP_TARGET_AVX512 void quantize_block_avx512(const float* x, int64_t bi, int8_t* pa, int8_t* pb, int8_t* pc,
                                              float* d, float* s, int32_t sums[3]) {
  const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
  const __m512 alo = _mm512_abs_ps(lo), ahi = _mm512_abs_ps(hi);
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  if (_mm512_cmp_ps_mask(alo, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(ahi, inf, _CMP_NLT_UQ)) {
    int32_t v[k_qk];
    return quantize_block_scalar(x, bi, pa, pb, pc, v, d, s, sums);
  }
  const float dd = _mm512_reduce_max_ps(_mm512_max_ps(alo, ahi)) / k_vscale;
  const __m512 id = _mm512_set1_ps(dd != 0.0f ? 1.0f / dd : 0.0f);
  const __m512i vmax = _mm512_set1_epi32(k_vmax), vmin = _mm512_set1_epi32(-k_vmax);
  __m512i sum = _mm512_setzero_si512(), sa = sum, sb = sum, sc = sum;
  for (int half = 0; half < 2; ++half) {
    __m512i v = _mm512_cvt_roundps_epi32(_mm512_mul_ps(half ? hi : lo, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_epi32(_mm512_max_epi32(v, vmin), vmax);
    sum = _mm512_add_epi32(sum, v);
    const __m512i da = _mm512_srai_epi32(_mm512_add_epi32(v, _mm512_set1_epi32(8192)), 14);
    const __m512i rem = _mm512_sub_epi32(v, _mm512_slli_epi32(da, 14));
    const __m512i db = _mm512_srai_epi32(_mm512_add_epi32(rem, _mm512_set1_epi32(64)), 7);
    const __m512i dc = _mm512_sub_epi32(rem, _mm512_slli_epi32(db, 7));
    sa = _mm512_add_epi32(sa, da);
    sb = _mm512_add_epi32(sb, db);
    sc = _mm512_add_epi32(sc, dc);
    const int64_t pos = plane_pos(bi, half * 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pa + pos), _mm512_cvtepi32_epi8(da));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pb + pos), _mm512_cvtepi32_epi8(db));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pc + pos), _mm512_cvtepi32_epi8(dc));
  }
  *d = dd;
  *s = dd * static_cast<float>(_mm512_reduce_add_epi32(sum));
  sums[0] = _mm512_reduce_add_epi32(sa);
  sums[1] = _mm512_reduce_add_epi32(sb);
  sums[2] = _mm512_reduce_add_epi32(sc);
}

// 16 int32 digits (two vectors) → 16 bytes in order (the values fit: no saturation).
SNAP_TARGET_AVX2 inline __m128i pack16(__m256i u, __m256i v) {
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(u, v), 0xd8);
  return _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

// The same block with AVX2: the same IEEE operations again (vcvtps2dq rounds to nearest even
// under the default MXCSR, as nearbyint does), so bit-identical to the scalar one too.
SNAP_TARGET_AVX2 void quantize_block_avx2(const float* x, int64_t bi, int8_t* pa, int8_t* pb, int8_t* pc, float* d,
                                          float* s, int32_t sums[3]) {
  __m256 xv[4];
  __m256 amax = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    xv[i] = _mm256_loadu_ps(x + 8 * i);
    const __m256 ax = _mm256_andnot_ps(sign, xv[i]);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(ax, inf, _CMP_NLT_UQ));
    amax = _mm256_max_ps(amax, ax);
  }
  if (bad) {
    int32_t v[k_qk];
    return quantize_block_scalar(x, bi, pa, pb, pc, v, d, s, sums);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float dd = _mm_cvtss_f32(m4) / k_vscale;
  const __m256 id = _mm256_set1_ps(dd != 0.0f ? 1.0f / dd : 0.0f);
  const __m256i vmax = _mm256_set1_epi32(k_vmax), vmin = _mm256_set1_epi32(-k_vmax);
  __m256i sum = _mm256_setzero_si256(), sa = sum, sb = sum, sc = sum;
  __m256i da[4], db[4], dc[4];
  for (int i = 0; i < 4; ++i) {
    __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(xv[i], id));
    v = _mm256_min_epi32(_mm256_max_epi32(v, vmin), vmax);
    sum = _mm256_add_epi32(sum, v);
    da[i] = _mm256_srai_epi32(_mm256_add_epi32(v, _mm256_set1_epi32(8192)), 14);
    const __m256i rem = _mm256_sub_epi32(v, _mm256_slli_epi32(da[i], 14));
    db[i] = _mm256_srai_epi32(_mm256_add_epi32(rem, _mm256_set1_epi32(64)), 7);
    dc[i] = _mm256_sub_epi32(rem, _mm256_slli_epi32(db[i], 7));
    sa = _mm256_add_epi32(sa, da[i]);
    sb = _mm256_add_epi32(sb, db[i]);
    sc = _mm256_add_epi32(sc, dc[i]);
  }
  for (int half = 0; half < 2; ++half) {
    const int64_t pos = plane_pos(bi, half * 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pa + pos), pack16(da[2 * half], da[2 * half + 1]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pb + pos), pack16(db[2 * half], db[2 * half + 1]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(pc + pos), pack16(dc[2 * half], dc[2 * half + 1]));
  }
  *d = dd;
  *s = dd * static_cast<float>(hsum_epi32_avx2(sum));
  sums[0] = hsum_epi32_avx2(sa);
  sums[1] = hsum_epi32_avx2(sb);
  sums[2] = hsum_epi32_avx2(sc);
}

// --- weight blocks (the reference): d, m and the 32 quants as signed values --------------
template <DType D>
inline void block_scalar(const uint8_t* b, float* d, float* m, int* q) {
  *d = load_f16(b);
  if constexpr (D == DType::q8_0) {
    *m = 0.0f;
    for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(b[2 + j]);
  } else {
    constexpr int k_qs = D == DType::q4_1 ? 4 : 2;
    *m = D == DType::q4_1 ? load_f16(b + 2) : -8.0f * *d;
    for (int j = 0; j < 16; ++j) {
      q[j] = b[k_qs + j] & 0x0f;
      q[j + 16] = b[k_qs + j] >> 4;
    }
  }
}

// The reference keeps V itself (the planes are checked against it by the quantizer's test).
struct RefAct {
  ActQ8x3 planes;
  std::vector<int32_t> v;
  std::vector<float> d, s;
};

void quantize_ref(const float* x, int64_t num_tokens, int64_t cols, RefAct* r) {
  r->planes.quantize(x, num_tokens, cols, false);
  const int64_t nb = cols / k_qk;
  r->v.resize(static_cast<size_t>(num_tokens * cols));
  r->d.resize(static_cast<size_t>(num_tokens * nb));
  r->s.resize(static_cast<size_t>(num_tokens * nb));
  std::vector<int8_t> scratch(static_cast<size_t>(r->planes.ng * k_group_bytes));
  int32_t sums[3];
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t b = 0; b < nb; ++b)
      quantize_block_scalar(x + t * cols + b * k_qk, b, scratch.data(), scratch.data(), scratch.data(),
                            &r->v[t * cols + b * k_qk], &r->d[t * nb + b], &r->s[t * nb + b], sums);
}

template <DType D>
void ref_typed(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  RefAct a;
  quantize_ref(x, num_tokens, w.cols, &a);
  const int64_t nb = w.cols / k_qk, bb = dtype_block_bytes(D);
  for (int64_t r = 0; r < w.rows; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + r * nb * bb;
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = bias ? bias[r] : 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        float dw, mw;
        int qw[32];
        block_scalar<D>(row + b * bb, &dw, &mw, qw);
        int64_t sumi = 0;
        for (int j = 0; j < 32; ++j) sumi += int64_t{qw[j]} * a.v[t * w.cols + b * k_qk + j];
        acc += double{dw} * a.d[t * nb + b] * static_cast<double>(sumi);
        if constexpr (D != DType::q8_0) acc += double{mw} * a.s[t * nb + b];
      }
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

// --- the scalar tile (CPUs without AVX-512 VNNI) ----------------------------------------------
// Reads the planes as the vector tile does (V = a·2^14 + b·2^7 + c, exact int32 sums per block),
// accumulating each row and token in f32 block by block.
template <DType D, int NT>
void tile_scalar(const ActQ8x3& a, int64_t t0, const void* w, int64_t rows, const float* bias, float* y, int64_t r) {
  constexpr int64_t bb = dtype_block_bytes(D);
  const int64_t nb = a.nb;
  for (int k = 0; k < k_block_rows && r + k < rows; ++k) {
    const auto* row = static_cast<const uint8_t*>(w) + (r + k) * nb * bb;
    for (int t = 0; t < NT; ++t) {
      const int64_t off = (t0 + t) * a.ng * k_group_bytes;
      const int64_t soff = (t0 + t) * a.ng * 16;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        float dw, mw;
        int qw[32];
        block_scalar<D>(row + b * bb, &dw, &mw, qw);
        int64_t sumi = 0;
        for (int j = 0; j < 32; ++j) {
          const int64_t p = off + plane_pos(b, j);
          sumi += int64_t{qw[j]} * (a.qa[p] * 16384 + a.qb[p] * 128 + a.qc[p]);
        }
        const int64_t lane = soff + (b / k_group) * 16 + (b % k_group) * 4;
        acc = std::fma(static_cast<float>(sumi), dw * a.xd[lane], acc);
        if constexpr (D != DType::q8_0) acc = std::fma(mw, a.xs[lane], acc);
      }
      y[t * rows + r + k] = acc + (bias ? bias[r + k] : 0.0f);
    }
  }
}

// --- the AVX-512 VNNI tile ------------------------------------------------------------------
// Lanes of a 16-int32 vector: 4j+k, j = block of the group, k = row of the tile.
// R[k] holds row k's partial sums, 4 lanes per block: this sums each block's 4 lanes and puts
// row k's sum at lane 4j+k (a 4 × 4 transpose-and-add inside each 128-bit lane).
SNAP_TARGET_AVX512VNNI inline __m512i reduce_rows(const __m512i R[4]) {
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(R[0], R[1]), _mm512_unpackhi_epi32(R[0], R[1]));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(R[2], R[3]), _mm512_unpackhi_epi32(R[2], R[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

// 16 bytes from each of p, p + stride, p + 2·stride, p + 3·stride into the four 128-bit lanes
// (n < 4: only the first n, the rest zero).
SNAP_TARGET_AVX512VNNI inline __m512i load_quarters(const uint8_t* p, int64_t stride, int n) {
  const auto q = [&](int j) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * stride)); };
  if (n == 4) {
    const __m256i l = _mm256_inserti128_si256(_mm256_castsi128_si256(q(0)), q(1), 1);
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(q(2)), q(3), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
  }
  // The last group of a row: only what is there is read (the lanes' indices must be constants).
  __m512i v = _mm512_zextsi128_si512(q(0));
  if (n > 1) v = _mm512_inserti32x4(v, q(1), 1);
  if (n > 2) v = _mm512_inserti32x4(v, q(2), 2);
  return v;
}

// One group (4 blocks × 4 rows) for NT tokens: dw/mw hold the 16 (block, row) scales at lane
// 4j+k, lo/hi each row's 4 blocks of quants as u8 (elements 0..15 and 16..31). Both tiles below
// call this, so they agree bit for bit.
template <DType D, int NT>
SNAP_TARGET_AVX512VNNI inline void group_vnni(const ActQ8x3& a, int64_t t0, int64_t g, __m512 dw, __m512 mw,
                                              const __m512i lo[k_block_rows], const __m512i hi[k_block_rows],
                                              __m512 acc[NT]) {
  const __m512i zero = _mm512_setzero_si512();
  const int64_t ng = a.ng;
  for (int t = 0; t < NT; ++t) {
    const int64_t off8 = ((t0 + t) * ng + g) * k_group_bytes;
    const int8_t* pa = a.qa.data() + off8;
    const int8_t* pb = a.qb.data() + off8;
    const int8_t* pc = a.qc.data() + off8;
    const __m512i alo = _mm512_loadu_si512(pa), ahi = _mm512_loadu_si512(pa + 64);
    const __m512i blo = _mm512_loadu_si512(pb), bhi = _mm512_loadu_si512(pb + 64);
    const __m512i clo = _mm512_loadu_si512(pc), chi = _mm512_loadu_si512(pc + 64);
    const int64_t off16 = ((t0 + t) * ng + g) * 16;
    __m512 f;
    if constexpr (D == DType::q8_0) {
      // Two integer sums per row: a's (≤ 2^20 per lane) and 2^7·b's + c's (≤ 2^26); together
      // at 2^14 they would overflow int32. The flip added 128·Σdigit per block: taken off here.
      __m512i ra[k_block_rows], rbc[k_block_rows];
      for (int k = 0; k < k_block_rows; ++k) {
        ra[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo[k], alo), hi[k], ahi);
        __m512i x = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo[k], blo), hi[k], bhi);
        x = _mm512_slli_epi32(x, 7);
        rbc[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x, lo[k], clo), hi[k], chi);
      }
      const __m512i ta = _mm512_sub_epi32(reduce_rows(ra), _mm512_loadu_si512(a.ca.data() + off16));
      const __m512i tbc = _mm512_sub_epi32(reduce_rows(rbc), _mm512_loadu_si512(a.cbc.data() + off16));
      f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ta), _mm512_set1_ps(16384.0f), _mm512_cvtepi32_ps(tbc));
    } else {
      // Nibbles ≤ 15: the whole V = (a·2^7 + b)·2^7 + c sum fits one int32 (≤ 2^30 after the
      // 4 lanes of a block are added), built by shifting between the planes.
      __m512i rv[k_block_rows];
      for (int k = 0; k < k_block_rows; ++k) {
        __m512i x = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo[k], alo), hi[k], ahi);
        x = _mm512_slli_epi32(x, 7);
        x = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x, lo[k], blo), hi[k], bhi);
        x = _mm512_slli_epi32(x, 7);
        rv[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x, lo[k], clo), hi[k], chi);
      }
      f = _mm512_cvtepi32_ps(reduce_rows(rv));
    }
    const __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(a.xd.data() + off16));
    acc[t] = _mm512_fmadd_ps(f, scale, acc[t]);
    if constexpr (D != DType::q8_0) acc[t] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(a.xs.data() + off16), acc[t]);
  }
}

// Lane 4j+k → row k: the four 128-bit lanes (blocks) summed, plus the bias.
template <int NT>
SNAP_TARGET_AVX512VNNI inline void store_rows(const __m512 acc[NT], int64_t rows, const float* bias, float* y,
                                              int64_t r) {
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  for (int t = 0; t < NT; ++t) {
    const __m128 s = _mm_add_ps(_mm_add_ps(_mm512_extractf32x4_ps(acc[t], 0), _mm512_extractf32x4_ps(acc[t], 1)),
                                _mm_add_ps(_mm512_extractf32x4_ps(acc[t], 2), _mm512_extractf32x4_ps(acc[t], 3)));
    float out[4];
    _mm_storeu_ps(out, s);
    for (int k = 0; k < nr; ++k) y[t * rows + r + k] = out[k] + (bias ? bias[r + k] : 0.0f);
  }
}

// The row-major tile: the 4 rows' blocks from 4 streams, the scales by one gather.
template <DType D, int NT>
SNAP_TARGET_AVX512VNNI void tile_vnni(const ActQ8x3& a, int64_t t0, const void* w, int64_t rows, const float* bias,
                                      float* y, int64_t r) {
  constexpr int64_t bb = dtype_block_bytes(D);
  constexpr int k_qs = D == DType::q4_1 ? 4 : 2;
  const int64_t nb = a.nb, ng = a.ng, row_bytes = nb * bb;
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  const uint8_t* base = static_cast<const uint8_t*>(w) + r * row_bytes;
  const uint8_t* row[k_block_rows];  // rows past the end repeat the last one; results dropped
  for (int k = 0; k < k_block_rows; ++k) row[k] = static_cast<const uint8_t*>(w) + std::min(r + k, rows - 1) * row_bytes;
  // Lane 4j+k gathers from block j of row min(k, rows − 1 − r): offset k'·row_bytes + j·bb.
  const __m512i lane_k = _mm512_set_epi32(3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0);
  const __m512i lane_j = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i kk = _mm512_min_epi32(lane_k, _mm512_set1_epi32(static_cast<int32_t>(nr - 1)));
  const __m512i gather_off =
      _mm512_add_epi32(_mm512_mullo_epi32(kk, _mm512_set1_epi32(static_cast<int32_t>(row_bytes))),
                       _mm512_mullo_epi32(lane_j, _mm512_set1_epi32(static_cast<int32_t>(bb))));
  const __m512i nib = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t b0 = g * k_group;
    const int nblk = static_cast<int>(std::min<int64_t>(k_group, nb - b0));
    // The 16 weight scales (and q4_1's m): the first 4 bytes of each (block, row).
    const __mmask16 lanes = nblk == 4 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (4 * nblk)) - 1);
    const __m512i head = _mm512_mask_i32gather_epi32(zero, lanes, gather_off, base + b0 * bb, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (D == DType::q4_1) mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
    else if constexpr (D == DType::q4_0) mw = _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
    // Each row's 4 blocks: the quants of elements 0..15 (lo) and 16..31 (hi), as u8.
    __m512i lo[k_block_rows], hi[k_block_rows];
    for (int k = 0; k < k_block_rows; ++k) {
      const uint8_t* blk = row[k] + b0 * bb;
      _mm_prefetch(reinterpret_cast<const char*>(blk + k_prefetch_bytes), _MM_HINT_T0);
      const __m512i v = load_quarters(blk + k_qs, bb, nblk);
      if constexpr (D == DType::q8_0) {
        // A missing block reads 0x80 after the flip; its activation digits are 0, so it adds nothing.
        const __m512i v2 = load_quarters(blk + 18, bb, nblk);
        lo[k] = _mm512_xor_si512(v, flip);
        hi[k] = _mm512_xor_si512(v2, flip);
      } else {
        lo[k] = _mm512_and_si512(v, nib);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      }
    }
    group_vnni<D, NT>(a, t0, g, dw, mw, lo, hi, acc);
  }
  store_rows<NT>(acc, rows, bias, y, r);
}

// The tiles4 tile (kernels/weight_tiles.h): one contiguous stream per 4 rows, each group's 16
// scales in one load and each row's 4 blocks in one zmm (masked loads for a short last group,
// leaving the same zero lanes as load_quarters and the gather). The same group_vnni arithmetic
// as tile_vnni, so its results are bit-identical to tile_vnni's on the row-major matrix. The
// last rows % 4 rows of a tiles4 matrix are row-major: tile_vnni.
template <DType D, int NT>
SNAP_TARGET_AVX512VNNI void tile_vnni_t4(const ActQ8x3& a, int64_t t0, const void* w, int64_t rows, const float* bias,
                                         float* y, int64_t r) {
  if (r + k_block_rows > rows) return tile_vnni<D, NT>(a, t0, w, rows, bias, y, r);
  constexpr int64_t bb = dtype_block_bytes(D);
  constexpr int64_t qb = D == DType::q8_0 ? 32 : 16;  // quant bytes per block
  constexpr int64_t hb = bb - qb;                     // header bytes per block
  const int64_t nb = a.nb, ng = a.ng;
  const uint8_t* tile = static_cast<const uint8_t*>(w) + r * nb * bb;
  const __m512i nib = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t b0 = g * k_group;
    const int nblk = static_cast<int>(std::min<int64_t>(k_group, nb - b0));
    const uint8_t* grp = tile + k_block_rows * b0 * bb;
    for (int64_t o = 0; o < k_block_rows * nblk * bb; o += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(grp + k_prefetch_t4_bytes + o), _MM_HINT_T0);
    }
    const __mmask16 lanes = static_cast<__mmask16>((1u << (4 * nblk)) - 1);
    const __mmask64 bytes = nblk == 4 ? ~__mmask64{0} : (__mmask64{1} << (16 * nblk)) - 1;
    const __m512 dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, grp));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (D == DType::q4_1) mw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, grp + 8 * nblk));
    else if constexpr (D == DType::q4_0) mw = _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
    const uint8_t* quants = grp + k_block_rows * nblk * hb;
    __m512i lo[k_block_rows], hi[k_block_rows];
    for (int k = 0; k < k_block_rows; ++k) {
      const uint8_t* q = quants + k * nblk * qb;
      const __m512i v = _mm512_maskz_loadu_epi8(bytes, q);
      if constexpr (D == DType::q8_0) {
        lo[k] = _mm512_xor_si512(v, flip);
        hi[k] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes, q + 16 * nblk), flip);
      } else {
        lo[k] = _mm512_and_si512(v, nib);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      }
    }
    group_vnni<D, NT>(a, t0, g, dw, mw, lo, hi, acc);
  }
  store_rows<NT>(acc, rows, bias, y, r);
}

// --- the AVX2 tiles (matvec_q8x3act_avx2.inc): with AVX-VNNI and without -------------------
#define Q8X3_AVX2_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define Q8X3_AVX2_VNNI 1
#define Q8X3_AVX2_NS avx2_vnni
#include "kernels/cpu/matvec_q8x3act_avx2.inc"
#undef Q8X3_AVX2_TARGET
#undef Q8X3_AVX2_VNNI
#undef Q8X3_AVX2_NS
#define Q8X3_AVX2_TARGET SNAP_TARGET_AVX2
#define Q8X3_AVX2_VNNI 0
#define Q8X3_AVX2_NS avx2_plain
#include "kernels/cpu/matvec_q8x3act_avx2.inc"
#undef Q8X3_AVX2_TARGET
#undef Q8X3_AVX2_VNNI
#undef Q8X3_AVX2_NS

// AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4), unless env SNAP_AVXVNNI=0 or q8x3act_avxvnni_enable(false).
bool cpu_has_avxvnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) != 0;
}
std::atomic<bool> g_avxvnni_on{[] {
  const char* e = std::getenv("SNAP_AVXVNNI");
  return e == nullptr || std::strcmp(e, "0") != 0;
}()};

template <DType D>
Q8x3TileFn pick(int nt, bool vnni) {
  if (vnni) {
    switch (nt) {
      case 1: return tile_vnni<D, 1>;
      case 2: return tile_vnni<D, 2>;
      case 3: return tile_vnni<D, 3>;
      default: return tile_vnni<D, 4>;
    }
  }
  switch (nt) {
    case 1: return tile_scalar<D, 1>;
    case 2: return tile_scalar<D, 2>;
    case 3: return tile_scalar<D, 3>;
    default: return tile_scalar<D, 4>;
  }
}

template <DType D>
Q8x3TileFn pick_t4(int nt) {
  switch (nt) {
    case 1: return tile_vnni_t4<D, 1>;
    case 2: return tile_vnni_t4<D, 2>;
    case 3: return tile_vnni_t4<D, 3>;
    default: return tile_vnni_t4<D, 4>;
  }
}

// w is row-major, or tiles4 with the VNNI tiles available.
template <DType D>
void cpu_typed(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  thread_local ActQ8x3 a;  // the caller's thread only: filled before the parallel region
  a.quantize(x, num_tokens, w.cols, true);
  if (w.layout == WeightLayout::tiles4) {
    tiles::run(a, [](int nt) { return q8x3act_tile_t4(D, nt); }, w.data, w.rows, w.cols, bias, y, num_tokens);
  } else {
    tiles::run(a, [](int nt) { return q8x3act_tile(D, nt); }, w.data, w.rows, w.cols, bias, y, num_tokens);
  }
}

// A tiles4 matrix as a row-major copy (for the paths that do not read tiles4).
struct RowMajorCopy {
  std::vector<uint8_t> bytes;
  WeightView view;
  explicit RowMajorCopy(const WeightView& w)
      : bytes(static_cast<size_t>(w.rows * dtype_row_bytes(w.dtype, w.cols))), view{w.dtype, nullptr, w.rows, w.cols} {
    weight_tiles4_unpack_rows(w, 0, w.rows, bytes.data());
    view.data = bytes.data();
  }
};

void check_weight(const WeightView& w) {
  CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0) << "matvec q8x3act: empty weight";
  CHECK(dtype_cpu_int_blocks(w.dtype)) << "matvec q8x3act: " << dtype_name(w.dtype) << " weights (needs q8_0/q4_0/q4_1)";
  CHECK(w.cols % k_qk == 0) << "matvec q8x3act: " << dtype_name(w.dtype) << " cols " << w.cols;
}

}  // namespace

void ActQ8x3::quantize(const float* x, int64_t num_tokens, int64_t c, bool simd) {
  CHECK(c % k_qk == 0) << "quantize q8x3act: cols " << c << " is not a multiple of 32";
  cols = c;
  nb = c / k_qk;
  ng = (nb + k_group - 1) / k_group;
  const size_t plane = static_cast<size_t>(num_tokens * ng * k_group_bytes);
  const size_t lanes = static_cast<size_t>(num_tokens * ng * 16);
  qa.resize(plane);
  qb.resize(plane);
  qc.resize(plane);
  xd.resize(lanes);
  xs.resize(lanes);
  ca.resize(lanes);
  cbc.resize(lanes);
  int32_t v[k_qk];
  const SimdLevel level = simd ? simd_level() : SimdLevel::scalar;
  for (int64_t t = 0; t < num_tokens; ++t) {
    int8_t* pa = &qa[t * ng * k_group_bytes];
    int8_t* pb = &qb[t * ng * k_group_bytes];
    int8_t* pc = &qc[t * ng * k_group_bytes];
    float* td = &xd[t * ng * 16];
    float* ts = &xs[t * ng * 16];
    int32_t* tca = &ca[t * ng * 16];
    int32_t* tcbc = &cbc[t * ng * 16];
    if (nb % k_group != 0) {  // the last group's missing blocks: zero digits and scales
      const int64_t last = (ng - 1) * k_group_bytes;
      std::memset(pa + last, 0, k_group_bytes);
      std::memset(pb + last, 0, k_group_bytes);
      std::memset(pc + last, 0, k_group_bytes);
      std::fill(td + (ng - 1) * 16, td + ng * 16, 0.0f);
      std::fill(ts + (ng - 1) * 16, ts + ng * 16, 0.0f);
      std::fill(tca + (ng - 1) * 16, tca + ng * 16, 0);
      std::fill(tcbc + (ng - 1) * 16, tcbc + ng * 16, 0);
    }
    for (int64_t bi = 0; bi < nb; ++bi) {
      float d, s;
      int32_t sums[3];  // Σa, Σb, Σc: q8_0's sign flip adds 128·Σa and 128·(128·Σb + Σc)
      if (level == SimdLevel::avx512) quantize_block_avx512(x + t * c + bi * k_qk, bi, pa, pb, pc, &d, &s, sums);
      else if (level == SimdLevel::avx2) quantize_block_avx2(x + t * c + bi * k_qk, bi, pa, pb, pc, &d, &s, sums);
      else quantize_block_scalar(x + t * c + bi * k_qk, bi, pa, pb, pc, v, &d, &s, sums);
      const int64_t lane0 = (bi / k_group) * 16 + (bi % k_group) * 4;
      for (int k = 0; k < 4; ++k) {
        td[lane0 + k] = d;
        ts[lane0 + k] = s;
        tca[lane0 + k] = 128 * sums[0];
        tcbc[lane0 + k] = 128 * (128 * sums[1] + sums[2]);
      }
    }
  }
}

bool q8x3act_vnni_supported() {
  static const bool cpu = simd_level_supported() == SimdLevel::avx512 && __builtin_cpu_supports("avx512vnni");
  return cpu && simd_level() == SimdLevel::avx512;
}

bool q8x3act_avxvnni_supported() {
  static const bool cpu = simd_level_supported() >= SimdLevel::avx2 && cpu_has_avxvnni();
  return cpu && g_avxvnni_on.load(std::memory_order_relaxed);
}

void q8x3act_avxvnni_enable(bool on) { g_avxvnni_on.store(on, std::memory_order_relaxed); }

Q8x3Tiles q8x3act_tiles() {
  if (q8x3act_vnni_supported()) return Q8x3Tiles::avx512_vnni;
  if (simd_level() < SimdLevel::avx2) return Q8x3Tiles::scalar;
  return q8x3act_avxvnni_supported() ? Q8x3Tiles::avx2_vnni : Q8x3Tiles::avx2_maddubs;
}

const char* q8x3act_tiles_name(Q8x3Tiles t) {
  switch (t) {
    case Q8x3Tiles::avx512_vnni: return "avx512-vnni";
    case Q8x3Tiles::avx2_vnni: return "avx2+avx-vnni";
    case Q8x3Tiles::avx2_maddubs: return "avx2 maddubs";
    default: return "scalar";
  }
}

bool q8x3act_vector_tiles() { return q8x3act_tiles() != Q8x3Tiles::scalar; }

Q8x3TileFn q8x3act_tile(DType d, int nt) {
  const Q8x3Tiles t = q8x3act_tiles();
  if (t == Q8x3Tiles::avx2_vnni) return avx2_vnni::pick_tile(d, nt, false);
  if (t == Q8x3Tiles::avx2_maddubs) return avx2_plain::pick_tile(d, nt, false);
  const bool vnni = t == Q8x3Tiles::avx512_vnni;
  switch (d) {
    case DType::q8_0: return pick<DType::q8_0>(nt, vnni);
    case DType::q4_0: return pick<DType::q4_0>(nt, vnni);
    default: return pick<DType::q4_1>(nt, vnni);
  }
}

Q8x3TileFn q8x3act_tile_t4(DType d, int nt) {
  switch (q8x3act_tiles()) {
    case Q8x3Tiles::avx2_vnni: return avx2_vnni::pick_tile(d, nt, true);
    case Q8x3Tiles::avx2_maddubs: return avx2_plain::pick_tile(d, nt, true);
    case Q8x3Tiles::scalar: return nullptr;
    default: break;
  }
  switch (d) {
    case DType::q8_0: return pick_t4<DType::q8_0>(nt);
    case DType::q4_0: return pick_t4<DType::q4_0>(nt);
    default: return pick_t4<DType::q4_1>(nt);
  }
}

void quantize_act_q8x3(const float* x, int64_t cols, int32_t* v, float* d, float* s) {
  CHECK(cols % k_qk == 0) << "quantize_act_q8x3: cols " << cols << " is not a multiple of 32";
  std::vector<int8_t> scratch(static_cast<size_t>((cols / k_qk + k_group - 1) / k_group * k_group_bytes));
  int32_t sums[3];
  for (int64_t b = 0; b < cols / k_qk; ++b)
    quantize_block_scalar(x + b * k_qk, b, scratch.data(), scratch.data(), scratch.data(), v + b * k_qk, d + b, s + b,
                          sums);
}

void matvec_q8x3act_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  check_weight(w);
  if (w.layout == WeightLayout::tiles4) return matvec_q8x3act_ref(x, RowMajorCopy(w).view, bias, y, num_tokens);
  switch (w.dtype) {
    case DType::q8_0: return ref_typed<DType::q8_0>(x, w, bias, y, num_tokens);
    case DType::q4_0: return ref_typed<DType::q4_0>(x, w, bias, y, num_tokens);
    default: return ref_typed<DType::q4_1>(x, w, bias, y, num_tokens);
  }
}

void matvec_q8x3act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  check_weight(w);
  if (simd_level() == SimdLevel::scalar) return matvec_q8x3act_ref(x, w, bias, y, num_tokens);
  if (w.layout == WeightLayout::tiles4 && q8x3act_tile_t4(w.dtype, 1) == nullptr) {
    return matvec_q8x3act_cpu(x, RowMajorCopy(w).view, bias, y, num_tokens);
  }
  switch (w.dtype) {
    case DType::q8_0: return cpu_typed<DType::q8_0>(x, w, bias, y, num_tokens);
    case DType::q4_0: return cpu_typed<DType::q4_0>(x, w, bias, y, num_tokens);
    default: return cpu_typed<DType::q4_1>(x, w, bias, y, num_tokens);
  }
}

}  // namespace snap::kernels
