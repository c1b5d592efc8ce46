// Internal to kernels/cpu: the pieces of the q16act matvec (matvec_q16act.cpp) that matmul.cpp's
// fused matvec driver uses, so several matrices sharing one input quantize it once and run
// their row blocks in one OpenMP region (as matvec_q8act.h does for q8act).
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace snap::kernels {

// The quantized rows of every token of one call: [num_tokens] × (cols int16, cols/32 scales d,
// cols/32 block sums s = d·Σq), as quantize_act_q16 produces them.
struct ActQ16 {
  std::vector<int16_t> q;
  std::vector<float> d, s;
  int64_t cols = 0, nb = 0;
  // simd: the AVX2 quantizer (bit-identical to the scalar one, which simd = false runs).
  void quantize(const float* x, int64_t num_tokens, int64_t cols, bool simd);
};

// y rows r .. r+3 (those < rows) for NT tokens starting at token t0 of a; y points at token t0's row.
using Q16TileFn = void (*)(const ActQ16& a, int64_t t0, const void* w, int64_t rows, const float* bias, float* y,
                           int64_t r);
// The AVX2 tile for block format d and 1 ≤ nt ≤ 4 tokens (needs AVX2; d quantized).
Q16TileFn q16act_tile_avx2(DType d, int nt);

}  // namespace snap::kernels
