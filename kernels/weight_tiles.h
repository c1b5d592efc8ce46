// The 4-row tile layout of block-format weights (WeightLayout::tiles4), read by the q8x3act
// decode matvec's vector tiles (AVX-512 VNNI or AVX2, kernels/cpu/matvec_q8x3act.cpp): per 4 rows one contiguous
// stream, with each step's 16 block scales in one 64-byte load and each row's 4 blocks of
// quants in one zmm, where the row-major layout needs a 16-lane gather and 12 lane inserts per
// 4 rows × 4 blocks. Same bytes as the row-major matrix, rearranged: a matrix keeps its size and
// rows r ≥ 4·⌊rows/4⌋ (the last rows % 4) stay row-major at their usual offsets.
//
// Layout (bb = block bytes, qb = quant bytes per block: 16 for q4_0/q4_1, 32 for q8_0, hb = bb −
// qb header bytes: d, and q4_1's m). Tile i (rows 4i..4i+3) starts at byte 4i·row_bytes; inside
// it, group g (blocks 4g..4g+nblk−1, nblk = min(4, nb − 4g)) starts at 16g·bb and holds
//   headers: for each field f (d; then m for q4_1): 4·nblk f16 at lane 4j + k (block j, row k),
//   quants:  for each row k, nblk·qb bytes: q4: block j's 16 bytes at 16j; q8_0: elements 0..15
//            of block j at 16j, elements 16..31 at 16·nblk + 16j.
// So a full group is, for q4_1: 64 bytes of d/m then 4 × 64 bytes of quants (320 = 16 × 20).
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace snap::kernels {

// Rearranges a row-major block-format matrix (q8_0, q4_0, q4_1) into tiles4, in place (one
// 4-row tile at a time through a small buffer: no second copy of the matrix).
void weight_tiles4_pack(DType dtype, void* data, int64_t rows, int64_t cols);

// Rows [r0, r0 + n) of w (either layout) as row-major blocks into dst (n · row_bytes bytes).
void weight_tiles4_unpack_rows(const WeightView& w, int64_t r0, int64_t n, void* dst);

// Whether the CPU decode matvec reads tiles4 for dtype: q8_0/q4_0/q4_1 with q8x3act (the
// current matvec_act()) running its vector tiles (AVX-512 VNNI or AVX2). Every other path reads tiles4 too, by
// unpacking rows (correct, slower), so this only decides what is worth packing at load.
// Env SNAP_WEIGHT_TILES=0 says no (benchmarks compare both layouts in one binary).
bool weight_tiles4_wanted(DType dtype);

}  // namespace snap::kernels
