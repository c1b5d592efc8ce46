// The q16act / q16x2act tiles (kernels/cpu/matvec_q16act.cpp) for AVX-512 with VNNI: one
// weight block of 32 quants widened to 32 int16 in one zmm, and each block's integer dot
// product one vpdpwssd (int16 pairs → int32, accumulated onto zero: the same exact sums as the
// AVX2 tile's two vpmaddwd + add), then the same f32 scaling per block in 16 lanes.
// Run first on 2026-12-02, on a 2-core Xeon with AVX-512 VNNI: tests/kernels/
// test_matvec_q16act_vnni.cpp (against the scalar reference over awkward shapes, batch
// invariance bitwise, NaN per token) passes there, and skips on CPUs without AVX-512 VNNI. It
// was no faster than the AVX2 tiles there (build/bench/bench_matvec --acts
// q16x2act,q16x2act+vnni, q4_1 stack: 12.22 vs 12.34 ms per token), so it stays off by default:
// q16act_tile's dispatch picks it only when it is enabled (env SNAP_MATVEC_VNNI=1 or
// q16act_vnni_enable), simd_level() is avx512 and the CPU reports avx512vnni. On such CPUs the
// default mode is q8x3act (kernels/cpu/matvec_q8x3act.cpp), which uses VNNI's u8 × s8 dot products.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kernels/cpu/matvec_q16act.h"
#include "kernels/cpu/matvec_tiles.h"
#include "kernels/cpu/simd.h"

#define SNAP_TARGET_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

namespace snap::kernels {

namespace {

constexpr int64_t k_qk = 32;
using tiles::k_block_rows;  // the row blocks matvec_q16act.cpp drives
constexpr float k_lo_scale = 1.0f / 32768.0f;
constexpr int64_t k_prefetch_bytes = 1024;

SNAP_TARGET_AVX512VNNI inline float load_f16_vnni(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// One weight block's 32 quants as int16 in element order.
template <DType D>
SNAP_TARGET_AVX512VNNI inline __m512i widen_block_vnni(const uint8_t* blk) {
  if constexpr (D == DType::q8_0) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
  } else {
    constexpr int k_qs = D == DType::q4_1 ? 4 : 2;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + k_qs));
    const __m128i nib = _mm_set1_epi8(0x0f);
    const __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(v, nib)),
                                                  _mm_and_si128(_mm_srli_epi16(v, 4), nib), 1);
    return _mm512_cvtepu8_epi16(bytes);
  }
}

// As matvec_q16act.cpp's tile_avx2: 4 rows × NT tokens, the same per-token order of operations
// whatever NT is (batch invariance), the q4 m term as a scalar FMA per block.
template <DType D, int NT, bool Split>
SNAP_TARGET_AVX512VNNI void tile_vnni(const ActQ16& a, int64_t t0, const void* w, int64_t rows, const float* bias,
                                      float* y, int64_t r) {
  constexpr int64_t bb = dtype_block_bytes(D);
  const int64_t nb = a.nb, cols = a.cols;
  const int nr = static_cast<int>(std::min<int64_t>(k_block_rows, rows - r));
  const uint8_t* row[k_block_rows];
  for (int k = 0; k < k_block_rows; ++k) row[k] = static_cast<const uint8_t*>(w) + std::min(r + k, rows - 1) * nb * bb;
  const int16_t* xq = a.q.data() + t0 * cols;
  const int16_t* xq2 = Split ? a.q2.data() + t0 * cols : nullptr;
  const float* xd = a.d.data() + t0 * nb;
  const float* xs = a.s.data() + t0 * nb;
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[k_block_rows][NT];
  float macc[k_block_rows][NT];
  for (int k = 0; k < k_block_rows; ++k)
    for (int t = 0; t < NT; ++t) {
      acc[k][t] = _mm512_setzero_ps();
      macc[k][t] = 0.0f;
    }
  for (int64_t b = 0; b < nb; ++b) {
    for (int k = 0; k < k_block_rows; ++k) {
      const uint8_t* blk = row[k] + b * bb;
      _mm_prefetch(reinterpret_cast<const char*>(blk + k_prefetch_bytes), _MM_HINT_T0);
      const float dw = load_f16_vnni(blk);
      const __m512i wq = widen_block_vnni<D>(blk);
      for (int t = 0; t < NT; ++t) {
        const __m512i x1 = _mm512_loadu_si512(xq + t * cols + b * k_qk);
        __m512 v = _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(zero, wq, x1));
        if constexpr (Split) {
          const __m512i x2 = _mm512_loadu_si512(xq2 + t * cols + b * k_qk);
          v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpwssd_epi32(zero, wq, x2)), _mm512_set1_ps(k_lo_scale), v);
        }
        acc[k][t] = _mm512_fmadd_ps(v, _mm512_set1_ps(dw * xd[t * nb + b]), acc[k][t]);
      }
      if constexpr (D != DType::q8_0) {
        const float mw = D == DType::q4_1 ? load_f16_vnni(blk + 2) : -8.0f * dw;
        for (int t = 0; t < NT; ++t) macc[k][t] = std::fma(mw, xs[t * nb + b], macc[k][t]);
      }
    }
  }
  for (int k = 0; k < nr; ++k)
    for (int t = 0; t < NT; ++t)
      y[t * rows + r + k] = hsum_avx512(acc[k][t]) + macc[k][t] + (bias ? bias[r + k] : 0.0f);
}

template <DType D, bool Split>
Q16TileFn pick(int nt) {
  switch (nt) {
    case 1: return tile_vnni<D, 1, Split>;
    case 2: return tile_vnni<D, 2, Split>;
    case 3: return tile_vnni<D, 3, Split>;
    default: return tile_vnni<D, 4, Split>;
  }
}

template <DType D>
Q16TileFn pick(int nt, bool split) {
  return split ? pick<D, true>(nt) : pick<D, false>(nt);
}

}  // namespace

namespace {
std::atomic<bool> g_vnni_on{[] {
  const char* e = std::getenv("SNAP_MATVEC_VNNI");
  return e != nullptr && std::string_view(e) == "1";
}()};
}  // namespace

void q16act_vnni_enable(bool on) { g_vnni_on.store(on, std::memory_order_relaxed); }
bool q16act_vnni_enabled() { return g_vnni_on.load(std::memory_order_relaxed); }

bool q16act_vnni_supported() {
  static const bool ok = simd_level_supported() == SimdLevel::avx512 && __builtin_cpu_supports("avx512vnni");
  return ok;
}

Q16TileFn q16act_tile_avx512vnni(DType d, int nt, bool split) {
  switch (d) {
    case DType::q8_0: return pick<DType::q8_0>(nt, split);
    case DType::q4_0: return pick<DType::q4_0>(nt, split);
    default: return pick<DType::q4_1>(nt, split);
  }
}

}  // namespace snap::kernels
