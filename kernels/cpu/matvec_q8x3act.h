// Internal to kernels/cpu: the pieces of the q8x3act matvec (matvec_q8x3act.cpp) that
// matmul.cpp's fused matvec driver uses, so several matrices sharing one input quantize it once
// and run their row blocks in one OpenMP region (as matvec_q16act.h does for q16act).
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace snap::kernels {

// The quantized rows of every token of one call. Per token and block of 32: an integer
// V_j = round(x_j / d) with d = max|x| / (127·2^14), |V| < 2^21 (22 bits), written as three
// signed 8-bit digits V = a·2^14 + b·2^7 + c (a ∈ [-127, 127], b, c ∈ [-64, 64]).
// Layout, per token: groups of 4 blocks, ng = ceil(nb / 4); group g holds 128 bytes per plane,
// bytes [16j, 16j+16) = elements 0..15 of block 4g+j and bytes [64+16j, 64+16j+16) = elements
// 16..31 (the order of a q4 block's low and high nibbles), zero where a block is missing.
// xd / xs: 16 floats per group, lane 4j+k = d resp. s = d·ΣV of block 4g+j (for any row k of
// the tile), 0 for a missing block, NaN for a block holding a NaN or an infinity.
// ca / cbc: the same lanes, 128·Σa and 128·(128·Σb + Σc) of the block (what q8_0's sign flip
// adds to the two integer sums, taken off in the tile).
struct ActQ8x3 {
  std::vector<int8_t> qa, qb, qc;  // [num_tokens][ng][128]
  std::vector<float> xd, xs;       // [num_tokens][ng][16]
  std::vector<int32_t> ca, cbc;    // [num_tokens][ng][16]
  int64_t cols = 0, nb = 0, ng = 0;
  // simd: the vector quantizer of simd_level() (AVX-512 or AVX2, each bit-identical to the scalar
  // one, which simd = false or the scalar level runs).
  void quantize(const float* x, int64_t num_tokens, int64_t cols, bool simd);
};

// y rows r .. r+3 (those < rows) for NT tokens starting at token t0 of a; y points at token t0's row.
using Q8x3TileFn = void (*)(const ActQ8x3& a, int64_t t0, const void* w, int64_t rows, const float* bias, float* y,
                            int64_t r);
// Whether this CPU runs the AVX-512 tiles: AVX-512 F/BW/VL/DQ (simd_level() avx512) and avx512vnni.
bool q8x3act_vnni_supported();
// Whether the AVX2 tiles use AVX-VNNI's 256-bit vpdpbusd (the CPU has it, env SNAP_AVXVNNI is
// not 0 and q8x3act_avxvnni_enable(false) was not called); else vpmaddubsw + vpmaddwd.
bool q8x3act_avxvnni_supported();
void q8x3act_avxvnni_enable(bool on);
// Which tiles q8x3act_tile and q8x3act_tile_t4 return on this CPU (after SNAP_SIMD and
// SNAP_AVXVNNI): the AVX-512 VNNI ones where q8x3act_vnni_supported(); else at simd_level()
// avx2 and up the AVX2 ones, with AVX-VNNI's vpdpbusd where q8x3act_avxvnni_supported(), or
// vpmaddubsw + vpmaddwd; else scalar. The one place the choice is made.
enum class Q8x3Tiles { scalar, avx2_maddubs, avx2_vnni, avx512_vnni };
Q8x3Tiles q8x3act_tiles();
// "avx512-vnni", "avx2+avx-vnni", "avx2 maddubs", "scalar".
const char* q8x3act_tiles_name(Q8x3Tiles t);
// Whether q8x3act_tile returns vector tiles (q8x3act_tiles() is not scalar).
bool q8x3act_vector_tiles();
// The tile for block format d (q8_0, q4_0, q4_1) and 1 ≤ nt ≤ 4 tokens: the AVX-512 VNNI one
// where q8x3act_vnni_supported(); else at simd_level() avx2 (or avx512 without VNNI) the AVX2
// one (matvec_q8x3act_avx2.inc), bit-identical to the AVX-512 one, with or without AVX-VNNI;
// else a scalar tile with the same per-token results up to f32 rounding (exact integer sums,
// f32 accumulation in another order).
Q8x3TileFn q8x3act_tile(DType d, int nt);
// The same for a WeightLayout::tiles4 matrix (kernels/weight_tiles.h): the AVX-512 VNNI or AVX2
// tile reading the tiles, bit-identical to q8x3act_tile's on the row-major matrix; null at the
// scalar level (callers then unpack the rows).
Q8x3TileFn q8x3act_tile_t4(DType d, int nt);

}  // namespace snap::kernels
