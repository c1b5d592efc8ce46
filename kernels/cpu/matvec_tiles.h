// The OpenMP driver the quantized-activation decode matvecs share (matvec_q8act.cpp,
// matvec_q16act.cpp, matvec_q8x3act.cpp): the weight's rows in blocks of 4 split statically over
// the threads, and inside each block the tokens in groups of 4, then one tail group of 1-3.
// A tile computes y[t0..t0+nt) × rows [row0, row0+4) from the activations quantized beforehand
// on the caller's thread. Batch invariance: a token's sums do not depend on which group it is in
// (each tile's per-token arithmetic is the same at every nt; the kernels' tests check it).
#pragma once

#include <cstdint>

namespace snap::kernels::tiles {

constexpr int k_block_rows = 4;
constexpr int k_block_tokens = 4;
// matmul.cpp's run_parts calls the same tiles over the same row blocks, so it uses these too.
// Below this many multiply-adds a parallel region costs more than it saves (~5 µs fork/join on
// a 2-core box vs ~3 µs for 64K bf16 FMAs at memory speed).
constexpr int64_t k_parallel_min_work = 1 << 16;

// pick(nt) returns the tile for groups of nt tokens (1..4); Tile is callable as
// tile(act, t0, w, rows, bias, y + t0 * rows, row0).
template <class Act, class Pick>
void run(const Act& act, Pick pick, const void* w, int64_t rows, int64_t cols, const float* bias, float* y,
         int64_t num_tokens) {
  const int64_t num_blocks = (rows + k_block_rows - 1) / k_block_rows;
  const int64_t full_groups = num_tokens / k_block_tokens;
  const int rest = static_cast<int>(num_tokens % k_block_tokens);
  const auto full = pick(k_block_tokens);
  const auto tail = rest ? pick(rest) : nullptr;
  const bool parallel = rows * cols * num_tokens >= k_parallel_min_work;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int64_t g = 0; g < full_groups; ++g) {
      const int64_t t0 = g * k_block_tokens;
      full(act, t0, w, rows, bias, y + t0 * rows, b * k_block_rows);
    }
    if (tail) {
      const int64_t t0 = full_groups * k_block_tokens;
      tail(act, t0, w, rows, bias, y + t0 * rows, b * k_block_rows);
    }
  }
}

}  // namespace snap::kernels::tiles
