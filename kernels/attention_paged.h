// Causal GQA attention over a PAGED, per-KV-head KV cache. Same semantics and arguments
// as attention_ref/attention_cpu (kernels.h) except the keys: each KV head has its own
// block table and length, and every key carries its own RoPE position (a compressed head
// keeps its entries' original positions). kernels/ knows nothing about pools: raw pointers.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace snap::kernels {

// One KV head: logical key j (j < length) lives in block block_table[j / block_size], slot
// j % block_size. Positions within a head are strictly increasing in j (the cache keeps
// them so; attention_paged_cpu relies on it to find each query's visible range by search).
struct PagedKvHead {
  const int32_t* block_table = nullptr;  // [ceil(length / block_size)]
  int64_t length = 0;
};

// The KV of one layer. Block b: K at k_base + b*k_block_stride, [block_size, head_dim];
// V at v_base + b*v_block_stride, [block_size, head_dim]; positions at
// pos_base + b*pos_block_stride, [block_size]. Strides in elements of their own type; for
// q8_0, whose rows are not whole elements (kernels/kv_convert.h), K/V strides are in bytes
// and a block's rows are kv_row_bytes(q8_0, head_dim) apart.
// K and V elements are `dtype`: f32, bf16, f16 or q8_0 (the kernels convert them to f32 in
// registers and accumulate in f32; the reference converts each element and sums in f64).
struct PagedKv {
  DType dtype = DType::f32;
  const void* k_base = nullptr;  // elements of dtype
  const void* v_base = nullptr;
  const int32_t* pos_base = nullptr;
  int64_t k_block_stride = 0;
  int64_t v_block_stride = 0;
  int64_t pos_block_stride = 0;
  int block_size = 0;
  const PagedKvHead* heads = nullptr;  // [num_kv_heads]
};

// q: [num_tokens, num_heads, head_dim]; out: [num_tokens, num_heads, head_dim].
// Key j of head g is visible to query t iff pos_j <= q_positions[t] and, when
// p.sliding_window > 0, q_positions[t] − pos_j < p.sliding_window. A query with no visible
// key gets zeros. Query head h reads KV head h / (num_heads / num_kv_heads).
void attention_paged_ref(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKv& kv,
                         const AttentionParams& p, float* out);
void attention_paged_cpu(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKv& kv,
                         const AttentionParams& p, float* out);

}  // namespace snap::kernels
