// The q8-activation matvec for block-format weights (kernels/matvec_act.h): activations are
// quantized once per call to int8 blocks of 32 (f32 scale), and each weight block's dot
// product is an exact integer sum scaled once: y = Σ_b d_w·d_x·Σ q_w·q_x (+ m_w·d_x·Σ q_x for
// q4_1; q4_0 is q4_1 with m = −8·d_w, q8_0 has no m term). matvec_q8act_ref is the plain
// scalar version (f64 sums); matvec_q8act_cpu the AVX2 tiles (4 rows × up to 4 tokens).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/matvec_q8act.h"
#include "kernels/cpu/matvec_tiles.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/matvec_q8x3act.h"
#include "kernels/matvec_act.h"

namespace snap::kernels {

// --- the process-wide choice ----------------------------------------------------------
namespace {

std::atomic<int> g_act{-1};  // -1: not set, read SNAP_MATVEC

int act_from_env() {  // -1: SNAP_MATVEC unset or not a mode name
  const char* e = std::getenv("SNAP_MATVEC");
  MatvecAct a;
  return e != nullptr && matvec_act_from_name(e, &a) ? static_cast<int>(a) : -1;
}

}  // namespace

// q8x3act where its tiles have a u8 × s8 dot product instruction (AVX-512 VNNI, or AVX-VNNI at the
// avx2 level). On plain AVX2 its vpmaddubsw tiles beat q16x2act by 1.2-1.3x with one thread but
// not with two (bench_matvec on Zen 5 as SNAP_SIMD=avx2 SNAP_AVXVNNI=0, e602ff9: q4_1 5.72 vs
// 5.20 ms, q8_0 8.53 vs 6.75 ms), and older AVX2 cores have fewer ports for them: q16x2act there.
MatvecAct matvec_act_default() {
  const Q8x3Tiles t = q8x3act_tiles();
  return t == Q8x3Tiles::avx512_vnni || t == Q8x3Tiles::avx2_vnni ? MatvecAct::q8x3 : MatvecAct::q16x2;
}

MatvecAct matvec_act() {
  const int a = g_act.load(std::memory_order_relaxed);
  if (a >= 0) return static_cast<MatvecAct>(a);
  static const int from_env = act_from_env();
  return from_env >= 0 ? static_cast<MatvecAct>(from_env) : matvec_act_default();
}

const char* matvec_act_tiles_name() {
  if (matvec_act() != MatvecAct::q8x3) return simd_level_name();
  return q8x3act_tiles_name(q8x3act_tiles());
}

void matvec_act_set(MatvecAct act) { g_act.store(static_cast<int>(act), std::memory_order_relaxed); }

const char* matvec_act_name(MatvecAct act) {
  switch (act) {
    case MatvecAct::q8: return "q8act";
    case MatvecAct::q16: return "q16act";
    case MatvecAct::q16x2: return "q16x2act";
    case MatvecAct::q8x3: return "q8x3act";
    default: return "f32act";
  }
}

bool matvec_act_from_name(const std::string& name, MatvecAct* out) {
  if (name == "f32act") *out = MatvecAct::f32;
  else if (name == "q8act") *out = MatvecAct::q8;
  else if (name == "q16act") *out = MatvecAct::q16;
  else if (name == "q16x2act") *out = MatvecAct::q16x2;
  else if (name == "q8x3act") *out = MatvecAct::q8x3;
  else return false;
  return true;
}

namespace {

constexpr int64_t k_qk = 32;  // elements per block, weights and activations alike
using tiles::k_block_rows;
// Software prefetch ahead of each row stream (matmul.cpp measured 1 KiB best for the q8_0 LM head).
constexpr int64_t k_prefetch_bytes = 1024;

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// --- activation quantization ------------------------------------------------------------
// Scalar and AVX2 give bit-identical q, d, s: the same IEEE operations in the same order
// (|x| max is exact, d = amax/127, id = 1/d, q = round-to-nearest-even(x·id)).
void quantize_block_scalar(const float* x, int8_t* q, float* d, float* s) {
  float amax = 0.0f;
  bool finite = true;
  for (int j = 0; j < k_qk; ++j) {
    finite = finite && std::isfinite(x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  if (!finite) {
    std::memset(q, 0, k_qk);
    *d = *s = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float dd = amax / 127.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  int sum = 0;
  for (int j = 0; j < k_qk; ++j) {
    const int v = static_cast<int>(std::nearbyint(x[j] * id));
    q[j] = static_cast<int8_t>(std::clamp(v, -127, 127));
    sum += q[j];
  }
  *d = dd;
  *s = dd * static_cast<float>(sum);
}

SNAP_TARGET_AVX2 void quantize_row_avx2(const float* x, int64_t cols, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
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
      quantize_block_scalar(xb, q + b * k_qk, d + b, s + b);
      continue;
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float dd = _mm_cvtss_f32(m) / 127.0f;
    const __m256 id = _mm256_set1_ps(dd != 0.0f ? 1.0f / dd : 0.0f);
    __m256i i[4];
    for (int j = 0; j < 4; ++j)
      i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // |x·id| ≤ 127 up to rounding of id, so the saturating packs keep every value in [-127, 127]
    // except a 127.5 → 128 that cannot occur (x·id ≤ amax·(1/dd) rounds to ≤ 127.00002).
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    const __m256i p01 = _mm256_packs_epi32(i[0], i[1]);
    const __m256i p23 = _mm256_packs_epi32(i[2], i[3]);
    const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * k_qk), p);
    d[b] = dd;
    s[b] = dd * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

// --- weight blocks: scale, offset and the 32 quants in element order ------------------
// q8_0: d, q ∈ [-128, 127]; q4_0: d, nibbles n ∈ [0, 15] with w = d·n − 8d (m = −8d);
// q4_1: d, m, w = d·n + m. Byte j of the 16 nibble bytes holds element j (low) and j+16 (high).
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

// --- reference ----------------------------------------------------------------------------
template <DType D>
void ref_typed(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  ActQ8 a;
  a.quantize(x, num_tokens, w.cols, false);
  const int64_t bb = dtype_block_bytes(D);
  for (int64_t r = 0; r < w.rows; ++r) {
    const auto* row = static_cast<const uint8_t*>(w.data) + r * a.nb * bb;
    for (int64_t t = 0; t < num_tokens; ++t) {
      double acc = bias ? bias[r] : 0.0;
      for (int64_t b = 0; b < a.nb; ++b) {
        float dw, mw;
        int qw[32];
        block_scalar<D>(row + b * bb, &dw, &mw, qw);
        int64_t sumi = 0;
        for (int j = 0; j < 32; ++j) sumi += int64_t{qw[j]} * a.q[t * w.cols + b * k_qk + j];
        acc += double{dw} * a.d[t * a.nb + b] * static_cast<double>(sumi);
        if constexpr (D != DType::q8_0) acc += double{mw} * a.s[t * a.nb + b];
      }
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

// --- AVX2 ----------------------------------------------------------------------------------
// f16 → f32 with the F16C instruction (common/dtype.h's portable conversion costs ~10 ops,
// twice per q4_1 block and row: it made the q4_1 tile no faster than the f32act one).
SNAP_TARGET_AVX2 inline float load_f16_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 32 nibbles → 32 bytes in element order (low nibbles in the low lane, high in the high lane).
SNAP_TARGET_AVX2 inline __m256i nibbles_avx2(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// 4 rows × NT tokens. Per block and row: one integer dot (maddubs: u8·s8 pairs → s16, exact
// as |pair| ≤ 2·128·127 < 2^15; madd with ones → 8 s32 partial sums), converted to f32 and
// FMA'd with d_w·d_x into the row's accumulator; q4's m_w·s_x goes to a scalar sum. Every
// token's order of operations is the same whatever NT is, so rows stay batch-invariant.
template <DType D, int NT>
SNAP_TARGET_AVX2 void tile_avx2(const ActQ8& a, int64_t t0, const void* w, int64_t rows, const float* bias, float* y,
                                int64_t r) {
  constexpr int64_t bb = dtype_block_bytes(D);
  const int64_t nb = a.nb, cols = a.cols;
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  const uint8_t* row[k_block_rows];  // rows past the end repeat the last one; results dropped
  for (int k = 0; k < k_block_rows; ++k) row[k] = static_cast<const uint8_t*>(w) + std::min(r + k, rows - 1) * nb * bb;
  const int8_t* xq = a.q.data() + t0 * cols;
  const float* xd = a.d.data() + t0 * nb;
  const float* xs = a.s.data() + t0 * nb;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[k_block_rows][NT];
  float macc[k_block_rows][NT];
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) {
      acc[k][t] = _mm256_setzero_ps();
      macc[k][t] = 0.0f;
    }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * cols + b * k_qk));
    for (int k = 0; k < k_block_rows; ++k) {
      const uint8_t* blk = row[k] + b * bb;
      _mm_prefetch(reinterpret_cast<const char*>(blk + k_prefetch_bytes), _MM_HINT_T0);
      const float dw = load_f16_f16c(blk);
      if constexpr (D == DType::q8_0) {
        const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        const __m256i aw = _mm256_sign_epi8(wq, wq);  // |q_w| as u8 (−128 → 128, still right)
        for (int t = 0; t < NT; ++t) {
          const __m256i sx = _mm256_sign_epi8(xv[t], wq);  // q_x with q_w's sign (q_x ≠ −128)
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
          acc[k][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * xd[t * nb + b]), acc[k][t]);
        }
      } else {
        constexpr int k_qs = D == DType::q4_1 ? 4 : 2;
        const float mw = D == DType::q4_1 ? load_f16_f16c(blk + 2) : -8.0f * dw;
        const __m256i wq = nibbles_avx2(blk + k_qs);
        for (int t = 0; t < NT; ++t) {
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xv[t]), ones);
          acc[k][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * xd[t * nb + b]), acc[k][t]);
          // An explicit FMA: left to -ffp-contract, some NT instantiations fused it and
          // others did not, and a token's result then depended on its batch.
          macc[k][t] = std::fma(mw, xs[t * nb + b], macc[k][t]);
        }
      }
    }
  }
  for (int k = 0; k < nr; ++k)
    for (int t = 0; t < NT; ++t)
      y[t * rows + r + k] = hsum_avx2(acc[k][t]) + macc[k][t] + (bias ? bias[r + k] : 0.0f);
}

template <DType D>
Q8TileFn pick(int nt) {
  switch (nt) {
    case 1: return tile_avx2<D, 1>;
    case 2: return tile_avx2<D, 2>;
    case 3: return tile_avx2<D, 3>;
    default: return tile_avx2<D, 4>;
  }
}

template <DType D>
void cpu_typed(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  thread_local ActQ8 a;  // the caller's thread only: filled before the parallel region
  a.quantize(x, num_tokens, w.cols, true);
  tiles::run(a, [](int nt) { return pick<D>(nt); }, w.data, w.rows, w.cols, bias, y, num_tokens);
}

void check_weight(const WeightView& w) {
  CHECK(w.data != nullptr && w.rows > 0 && w.cols > 0) << "matvec q8act: empty weight";
  CHECK(dtype_cpu_int_blocks(w.dtype)) << "matvec q8act: " << dtype_name(w.dtype) << " weights (needs q8_0/q4_0/q4_1)";
  CHECK(w.layout == WeightLayout::rows) << "matvec q8act: tiles4 weights (this kernel reads row-major blocks; "
                                           "matmul_cpu unpacks tiles4)";
  CHECK(w.cols % k_qk == 0) << "matvec q8act: " << dtype_name(w.dtype) << " cols " << w.cols;
}

}  // namespace

void ActQ8::quantize(const float* x, int64_t num_tokens, int64_t c, bool simd) {
  cols = c;
  nb = c / k_qk;
  q.resize(static_cast<size_t>(num_tokens * cols));
  d.resize(static_cast<size_t>(num_tokens * nb));
  s.resize(static_cast<size_t>(num_tokens * nb));
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (simd) {
      quantize_row_avx2(x + t * cols, cols, &q[t * cols], &d[t * nb], &s[t * nb]);
    } else {
      for (int64_t b = 0; b < nb; ++b)
        quantize_block_scalar(x + t * cols + b * k_qk, &q[t * cols + b * k_qk], &d[t * nb + b], &s[t * nb + b]);
    }
  }
}

Q8TileFn q8act_tile_avx2(DType d, int nt) {
  switch (d) {
    case DType::q8_0: return pick<DType::q8_0>(nt);
    case DType::q4_0: return pick<DType::q4_0>(nt);
    default: return pick<DType::q4_1>(nt);
  }
}

void quantize_act_q8(const float* x, int64_t cols, int8_t* q, float* d, float* s) {
  CHECK(cols % k_qk == 0) << "quantize_act_q8: cols " << cols << " is not a multiple of 32";
  if (simd_level() != SimdLevel::scalar) return quantize_row_avx2(x, cols, q, d, s);
  for (int64_t b = 0; b < cols / k_qk; ++b) quantize_block_scalar(x + b * k_qk, q + b * k_qk, d + b, s + b);
}

void matvec_q8act_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  check_weight(w);
  switch (w.dtype) {
    case DType::q8_0: return ref_typed<DType::q8_0>(x, w, bias, y, num_tokens);
    case DType::q4_0: return ref_typed<DType::q4_0>(x, w, bias, y, num_tokens);
    default: return ref_typed<DType::q4_1>(x, w, bias, y, num_tokens);
  }
}

void matvec_q8act_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens) {
  check_weight(w);
  if (simd_level() == SimdLevel::scalar) return matvec_q8act_ref(x, w, bias, y, num_tokens);
  switch (w.dtype) {
    case DType::q8_0: return cpu_typed<DType::q8_0>(x, w, bias, y, num_tokens);
    case DType::q4_0: return cpu_typed<DType::q4_0>(x, w, bias, y, num_tokens);
    default: return cpu_typed<DType::q4_1>(x, w, bias, y, num_tokens);
  }
}

}  // namespace snap::kernels
