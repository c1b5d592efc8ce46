// llama.cpp's blocks (as a GGUF file and common/dtype.h hold them) split into the device's
// arrays (kernels_cuda.h BlockWeights): quants, f16 scales, mins and extra bytes, each
// contiguous over the blocks, so that a row's quants can be read with 16-byte loads (ggml's
// 18-, 22-, 24-, 84-, 110-, 144- and 210-byte blocks cannot). Host code: DeviceWeights::upload and the kernel
// tests use it.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

// Bytes of one ggml block of the format (block_format_elems weights).
constexpr int64_t block_format_ggml_bytes(BlockFormat f) {
  switch (f) {
    case BlockFormat::q8_0: return 34;
    case BlockFormat::q4_0: return 18;
    case BlockFormat::q4_1: return 20;
    case BlockFormat::q5_0: return 22;
    case BlockFormat::q5_1: return 24;
    case BlockFormat::q4_k: return 144;
    case BlockFormat::q6_k: return 210;
    case BlockFormat::q5_k: return 176;
    case BlockFormat::q3_k: return 110;
    case BlockFormat::q2_k: return 84;
  }
  return 0;
}

// Every format, in BlockFormat's order.
inline constexpr BlockFormat k_all_block_formats[] = {BlockFormat::q8_0, BlockFormat::q4_0, BlockFormat::q4_1,
                                                      BlockFormat::q5_0, BlockFormat::q5_1, BlockFormat::q4_k, BlockFormat::q6_k,
                                                      BlockFormat::q5_k, BlockFormat::q3_k, BlockFormat::q2_k};

// The DType a host Matrix holds the format's ggml blocks in (common/dtype.h), and the format
// of a block DType (false for an element type): the one table of the correspondence.
constexpr DType block_format_dtype(BlockFormat f) {
  switch (f) {
    case BlockFormat::q8_0: return DType::q8_0;
    case BlockFormat::q4_0: return DType::q4_0;
    case BlockFormat::q4_1: return DType::q4_1;
    case BlockFormat::q5_0: return DType::q5_0;
    case BlockFormat::q5_1: return DType::q5_1;
    case BlockFormat::q4_k: return DType::q4_k;
    case BlockFormat::q6_k: return DType::q6_k;
    case BlockFormat::q5_k: return DType::q5_k;
    case BlockFormat::q3_k: return DType::q3_k;
    case BlockFormat::q2_k: return DType::q2_k;
  }
  return DType::f32;
}
inline bool block_format_of(DType t, BlockFormat* out) {
  for (const BlockFormat f : k_all_block_formats) {
    if (block_format_dtype(f) == t) {
      *out = f;
      return true;
    }
  }
  return false;
}

struct SplitBlocks {
  std::vector<uint8_t> quants;   // per block: q8_0 32, q4_0/q4_1/q5_0/q5_1 16, q4_k 128, q6_k 192 (ql, qh), q5_k 160 (qh, qs),
                                 // q3_k 96 (hmask, qs), q2_k 64
  std::vector<uint16_t> scales;  // per block: d
  std::vector<uint16_t> mins;    // q4_1, q5_1: m; q4_k, q5_k, q2_k: dmin
  std::vector<uint8_t> extra;    // per block: q5_0/q5_1 qh (4), q4_k/q5_k/q3_k scales (12), q6_k/q2_k scales (16)
};

// Where a block's parts lie in ggml's block (byte offset, bytes; offset −1: none): q8_0 d 0,
// qs 2; q4_0 d 0, qs 2; q4_1 d 0, m 2, qs 4; q5_0 d 0, qh 2, qs 6; q5_1 d 0, m 2, qh 4, qs 8; q4_k d 0, dmin 2, scales 4,
// qs 16; q6_k ql 0, qh 128, scales 192, d 208; q5_k d 0, dmin 2, scales 4, qh 16, qs 48; q3_k hmask 0,
// qs 32, scales 96, d 108; q2_k scales 0, qs 16, d 80, dmin 82.
struct BlockParts {
  struct Part { int64_t at, bytes; };
  Part q{0, 0}, d{0, 2}, m{-1, 0}, e{-1, 0};
};
constexpr BlockParts block_parts(BlockFormat f) {
  BlockParts p;
  switch (f) {
    case BlockFormat::q8_0: p.q = {2, 32}; break;
    case BlockFormat::q4_0: p.q = {2, 16}; break;
    case BlockFormat::q4_1: p.q = {4, 16}; p.m = {2, 2}; break;
    case BlockFormat::q5_0: p.q = {6, 16}; p.e = {2, 4}; break;
    case BlockFormat::q5_1: p.q = {8, 16}; p.m = {2, 2}; p.e = {4, 4}; break;
    case BlockFormat::q4_k: p.q = {16, 128}; p.m = {2, 2}; p.e = {4, 12}; break;
    case BlockFormat::q6_k: p.q = {0, 192}; p.d = {208, 2}; p.e = {192, 16}; break;
    case BlockFormat::q5_k: p.q = {16, 160}; p.m = {2, 2}; p.e = {4, 12}; break;  // quants: qh then qs
    case BlockFormat::q3_k: p.q = {0, 96}; p.d = {108, 2}; p.e = {96, 12}; break;  // quants: hmask then qs
    case BlockFormat::q2_k: p.q = {16, 64}; p.d = {80, 2}; p.m = {82, 2}; p.e = {0, 16}; break;
  }
  return p;
}

inline SplitBlocks split_ggml_blocks(BlockFormat f, const uint8_t* src, int64_t nblocks) {
  const BlockParts p = block_parts(f);
  const int64_t bb = block_format_ggml_bytes(f);
  SplitBlocks out;
  out.quants.resize(static_cast<size_t>(nblocks * p.q.bytes));
  out.scales.resize(static_cast<size_t>(nblocks));
  if (p.m.at >= 0) out.mins.resize(static_cast<size_t>(nblocks));
  if (p.e.at >= 0) out.extra.resize(static_cast<size_t>(nblocks * p.e.bytes));
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* blk = src + b * bb;
    std::memcpy(&out.quants[b * p.q.bytes], blk + p.q.at, static_cast<size_t>(p.q.bytes));
    std::memcpy(&out.scales[b], blk + p.d.at, 2);
    if (p.m.at >= 0) std::memcpy(&out.mins[b], blk + p.m.at, 2);
    if (p.e.at >= 0) std::memcpy(&out.extra[b * p.e.bytes], blk + p.e.at, static_cast<size_t>(p.e.bytes));
  }
  return out;
}

// The inverse: the first nblocks blocks of w (host-readable arrays) as ggml's blocks into dst
// (nblocks · block_format_ggml_bytes bytes).
inline void join_ggml_blocks(const BlockWeights& w, int64_t nblocks, uint8_t* dst) {
  const BlockParts p = block_parts(w.format);
  const int64_t bb = block_format_ggml_bytes(w.format);
  const auto* q = static_cast<const uint8_t*>(w.quants);
  for (int64_t b = 0; b < nblocks; ++b) {
    uint8_t* blk = dst + b * bb;
    std::memcpy(blk + p.q.at, q + b * p.q.bytes, static_cast<size_t>(p.q.bytes));
    std::memcpy(blk + p.d.at, &w.scales[b], 2);
    if (p.m.at >= 0) std::memcpy(blk + p.m.at, &w.mins[b], 2);
    if (p.e.at >= 0) std::memcpy(blk + p.e.at, w.extra + b * p.e.bytes, static_cast<size_t>(p.e.bytes));
  }
}

}  // namespace snap::kernels
