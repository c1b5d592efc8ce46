// Device helpers over a PagedKvCuda view shared by the attention kernels (attention_paged.cu,
// attention_prefill_tc.cu): a key's position, the binary search for a query's visible keys and
// the union of several rows' visible ranges.
// Header-only (inline __device__), so every .cu that includes it gets its own copy.
#pragma once

#include <cstdint>

#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels::paged {

// Key j's block (from the head's block table) and its slot in the block. 32-bit division: a
// head holds fewer than 2^31 keys, and int64 division is a long software routine on the GPU
// (it cost the decode kernel more instructions per chunk than its arithmetic).
struct KeySlot {
  int64_t block;
  int32_t slot;
};
inline __device__ KeySlot key_slot(const PagedKvCuda& kv, const PagedKvHead& h, int64_t j) {
  const int32_t j32 = static_cast<int32_t>(j), b = j32 / kv.block_size;
  return {h.block_table[b], j32 - b * kv.block_size};
}

inline __device__ int32_t key_position(const PagedKvCuda& kv, const PagedKvHead& h, int64_t j) {
  const KeySlot at = key_slot(kv, h, j);
  return kv.pos_base[at.block * kv.pos_block_stride + at.slot];
}

// Key j's K and V rows (head_dim bf16 each) in the paged cache.
struct KvRows {
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
};
inline __device__ KvRows kv_rows(const PagedKvCuda& kv, const PagedKvHead& h, int64_t j, int head_dim) {
  const KeySlot at = key_slot(kv, h, j);
  const int64_t off = static_cast<int64_t>(at.slot) * head_dim;
  return {kv.k_base + at.block * kv.k_block_stride + off, kv.v_base + at.block * kv.v_block_stride + off};
}

// Elements c .. c + 7 of key j's K and V rows as 16-byte loads (the rows must be 16-byte aligned).
inline __device__ void kv_piece(const PagedKvCuda& kv, const PagedKvHead& h, int64_t j, int head_dim, int c, uint4* k,
                                uint4* v) {
  const KvRows rows = kv_rows(kv, h, j, head_dim);
  *k = *reinterpret_cast<const uint4*>(rows.k + c);
  *v = *reinterpret_cast<const uint4*>(rows.v + c);
}

// First j in [0, length) with pos_j > bound (positions ascend within a head); length if none.
// The ends are looked at first: a decode query sees every key (one load instead of a binary
// search of log2(length) dependent loads, ~17 at 128K keys, which every split block of the
// decode kernel would otherwise wait through).
inline __device__ int64_t first_above(const PagedKvCuda& kv, const PagedKvHead& h, int64_t bound) {
  if (h.length == 0 || key_position(kv, h, h.length - 1) <= bound) return h.length;
  if (key_position(kv, h, 0) > bound) return 0;
  int64_t lo = 1, hi = h.length - 1;  // pos_0 <= bound < pos_(length-1)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (key_position(kv, h, mid) <= bound)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// The keys [*lo, *hi) a query at position qp sees (causal by position, and within the sliding
// window when there is one), clipped to [kb, ke); empty ranges come out as lo == hi.
inline __device__ void visible_keys(const PagedKvCuda& kv, const PagedKvHead& h, int32_t qp, int sliding_window,
                                    int64_t kb, int64_t ke, int64_t* lo, int64_t* hi) {
  int64_t b = first_above(kv, h, qp);
  int64_t a = sliding_window > 0 ? first_above(kv, h, static_cast<int64_t>(qp) - sliding_window) : 0;
  a = a > kb ? a : kb;
  b = b < ke ? b : ke;
  *lo = a;
  *hi = b > a ? b : a;
}

// The union [*lo, *hi) of the rows' visible key ranges [lo_s[r], hi_s[r]), r in [first, last),
// skipping empty ones; [0, 0) when every range is empty.
inline __device__ void range_union(const int64_t* lo_s, const int64_t* hi_s, int first, int last, int64_t* lo,
                                   int64_t* hi) {
  int64_t a = INT64_MAX, b = 0;
  for (int r = first; r < last; ++r) {
    if (lo_s[r] >= hi_s[r]) continue;
    a = lo_s[r] < a ? lo_s[r] : a;
    b = hi_s[r] > b ? hi_s[r] : b;
  }
  *lo = a < b ? a : 0;
  *hi = a < b ? b : 0;
}

// A block's share of an attention kernel's work: rows [r0, r0 + nrows) of KV head g
// (blockIdx.y; row r is token r / group, query head g·group + r % group), keys [kb, ke) of
// split `split` (blockIdx.z unless given: a batch of sequences numbers its blocks' splits
// itself; every key when unsplit: the prompt kernels).
struct BlockSpan {
  int group, g, nrows;
  int64_t split, r0, kb, ke;
  PagedKvHead head;
};
inline __device__ BlockSpan block_span(const PagedKvCuda& kv, const AttentionParams& p, int64_t num_tokens,
                                       int rows_per_block, int64_t splits = 1, int64_t split_keys = 0,
                                       int64_t split = -1) {
  BlockSpan b;
  b.group = p.num_heads / p.num_kv_heads;
  b.g = blockIdx.y;
  b.split = split >= 0 ? split : blockIdx.z;
  const int64_t rows_total = num_tokens * b.group;
  b.r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  b.nrows = static_cast<int>(rows_total - b.r0 < rows_per_block ? rows_total - b.r0 : rows_per_block);
  b.head = kv.heads[b.g];
  b.kb = splits > 1 ? b.split * split_keys : 0;
  b.ke = splits > 1 ? (b.kb + split_keys < b.head.length ? b.kb + split_keys : b.head.length) : b.head.length;
  return b;
}

// Row rr of the span as a row of q and out: t · num_heads + h.
inline __device__ int64_t span_row(const BlockSpan& b, int num_heads, int rr) {
  const int64_t r = b.r0 + rr;
  return r / b.group * num_heads + b.g * b.group + r % b.group;
}

// Thread tid < rows sets [lo_s[tid], hi_s[tid]): the keys of [kb, ke) span row tid sees, empty
// for the rows past nrows.
inline __device__ void span_visible(const PagedKvCuda& kv, const BlockSpan& b, const int32_t* q_positions,
                                    int sliding_window, int tid, int rows, int64_t* lo_s, int64_t* hi_s) {
  if (tid >= rows) return;
  int64_t lo = 0, hi = 0;
  if (tid < b.nrows)
    visible_keys(kv, b.head, q_positions[(b.r0 + tid) / b.group], sliding_window, b.kb, b.ke, &lo, &hi);
  lo_s[tid] = lo;
  hi_s[tid] = hi;
}

}  // namespace snap::kernels::paged
