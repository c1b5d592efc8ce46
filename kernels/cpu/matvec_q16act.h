// Internal to kernels/cpu: the pieces of the q16act matvec (matvec_q16act.cpp) that matmul.cpp's
// fused matvec driver uses, so several matrices sharing one input quantize it once and run
// their row blocks in one OpenMP region (as matvec_q8act.h does for q8act).
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace snap::kernels {

// The quantized rows of every token of one call: [num_tokens] × (cols int16, cols/32 scales d,
// cols/32 block sums s), as quantize_act_q16 produces them. With split (q16x2act), q2 holds a
// second int16 plane, the rounding residual at scale d/32768: x ≈ d·(q + q2/32768), and
// s = d·(Σq + Σq2/32768); without it q2 is empty and s = d·Σq. h: 2 per block, s's value over
// its elements 0..15 and 16..31 (Q2_K's mins are per 16 weights).
struct ActQ16 {
  std::vector<int16_t> q, q2;
  std::vector<float> d, s, h;
  int64_t cols = 0, nb = 0;
  bool split = false;
  // simd: the AVX2 quantizer (bit-identical to the scalar one, which simd = false runs).
  void quantize(const float* x, int64_t num_tokens, int64_t cols, bool simd, bool split);
};

// y rows r .. r+3 (those < rows) for NT tokens starting at token t0 of a; y points at token t0's row.
using Q16TileFn = void (*)(const ActQ16& a, int64_t t0, const void* w, int64_t rows, const float* bias, float* y,
                           int64_t r);
// The AVX2 tile for block format d and 1 ≤ nt ≤ 4 tokens (needs AVX2; d quantized); split:
// the q16x2act tile, which reads both planes (the ActQ16 must have been quantized with split).
Q16TileFn q16act_tile_avx2(DType d, int nt, bool split);
// The tile the matvec runs: the AVX-512 VNNI one (kernels/cpu/matvec_q16act_vnni.cpp) when it is
// enabled, simd_level() is avx512 and the CPU has avx512vnni, else the AVX2 one. It is off
// unless env SNAP_MATVEC_VNNI=1 or q16act_vnni_enable(true) (its tests, bench_matvec's +vnni
// modes) turns it on: on the one VNNI machine it ran on it was no faster than the AVX2 tiles.
Q16TileFn q16act_tile(DType d, int nt, bool split);
// The formats these tiles read: q8_0, q4_0, q4_1, q5_0, q5_1 and the K formats Q2_K to Q6_K
// (32-weight sub-blocks).
bool q16act_reads(DType d);
// Whether this CPU can run the VNNI tiles (AVX-512 F/BW/VL/DQ level + avx512vnni).
bool q16act_vnni_supported();
void q16act_vnni_enable(bool on);
bool q16act_vnni_enabled();
Q16TileFn q16act_tile_avx512vnni(DType d, int nt, bool split);

}  // namespace snap::kernels
