// Device KV cache writes: the twins of the paged cache's append and compaction copies.
//   kv_append_cuda: new K/V rows (f32, [num_tokens, num_kv_heads, head_dim], after RoPE) -> bf16
//     at the ends of the heads' block tables, with their positions. Each head's slots come from
//     the DEVICE head table (its length already counts the new rows), so the host uploads no
//     slot list and waits for nothing.
//   kv_gather_cuda: rows src_slots[i] -> dst_slots[i] (compaction into fresh blocks: the
//     ranges never overlap, so every row is read before anything could overwrite it).
//   word_edits_cuda: a few int32 words of device buffers set from the launch's own arguments
//     (the pool's block-table edits: a new block id, a head's length), stream-ordered.
//   kv_append_slots_cuda: a decode step's append in one launch (one sequence's rows, or one row
//     of each of several sequences): the rows to slots the host names and the views' edits,
//     both in the launch's arguments.
// One warp per row, lanes over head_dim: each row is 2·head_dim contiguous bytes.
#include <algorithm>

#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

namespace {
constexpr int k_warps = 8;

// Row r of the new K/V (f32) as bf16 into slot dst, with its position; a warp, lanes over head_dim.
__device__ void write_row(const float* k_new, const float* v_new, int64_t r, int32_t position, int64_t dst, int head_dim,
                          int lane, __nv_bfloat16* k_base, __nv_bfloat16* v_base, int32_t* pos_base) {
  for (int d = lane; d < head_dim; d += 32) {
    k_base[dst * head_dim + d] = __float2bfloat16_rn(k_new[r * head_dim + d]);
    v_base[dst * head_dim + d] = __float2bfloat16_rn(v_new[r * head_dim + d]);
  }
  if (lane == 0) pos_base[dst] = position;
}

// *word[i] = value[i], over the block's threads.
__device__ void apply_edits(const WordEdits& edits) {
  for (int i = static_cast<int>(threadIdx.x); i < edits.count; i += static_cast<int>(blockDim.x))
    *edits.word[i] = edits.value[i];
}
}  // namespace

__global__ void kv_append_kernel(const float* k_new, const float* v_new, const int32_t* positions, int64_t num_tokens,
                                 int num_kv_heads, int head_dim, const PagedKvHead* heads, int block_size,
                                 __nv_bfloat16* k_base, __nv_bfloat16* v_base, int32_t* pos_base) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * k_warps + (threadIdx.x >> 5);
  if (r >= num_tokens * num_kv_heads) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = r / num_kv_heads;
  const int g = static_cast<int>(r - t * num_kv_heads);
  const PagedKvHead h = heads[g];
  const int64_t j = h.length - num_tokens + t;  // the logical entry this row becomes
  const int64_t dst = int64_t{h.block_table[j / block_size]} * block_size + j % block_size;
  write_row(k_new, v_new, r, positions[t], dst, head_dim, lane, k_base, v_base, pos_base);
}

void kv_append_cuda(const float* k_new, const float* v_new, const int32_t* positions, int64_t num_tokens,
                    int num_kv_heads, int head_dim, const PagedKvHead* heads, int block_size, __nv_bfloat16* k_base,
                    __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t stream) {
  const int64_t rows = num_tokens * num_kv_heads;
  if (rows <= 0) return;
  kv_append_kernel<<<static_cast<unsigned>((rows + k_warps - 1) / k_warps), k_warps * 32, 0, stream>>>(
      k_new, v_new, positions, num_tokens, num_kv_heads, head_dim, heads, block_size, k_base, v_base, pos_base);
}

__global__ void kv_append_slots_kernel(const float* k_new, const float* v_new, const int32_t* positions,
                                       int num_kv_heads, int head_dim, KvSlots slots, WordEdits edits,
                                       __nv_bfloat16* k_base, __nv_bfloat16* v_base, int32_t* pos_base) {
  if (blockIdx.x == 0) apply_edits(edits);  // nothing in this launch reads the edited words
  const int r = static_cast<int>(blockIdx.x) * k_warps + static_cast<int>(threadIdx.x >> 5);
  if (r >= slots.count) return;
  write_row(k_new, v_new, r, positions[r / num_kv_heads], slots.slot[r], head_dim, threadIdx.x & 31, k_base, v_base,
            pos_base);
}

void kv_append_slots_cuda(const float* k_new, const float* v_new, const int32_t* positions, int num_kv_heads,
                          int head_dim, const KvSlots& slots, const WordEdits& edits, __nv_bfloat16* k_base,
                          __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t stream) {
  const int blocks = std::max((slots.count + k_warps - 1) / k_warps, edits.count > 0 ? 1 : 0);
  if (blocks == 0) return;
  kv_append_slots_kernel<<<blocks, k_warps * 32, 0, stream>>>(k_new, v_new, positions, num_kv_heads, head_dim, slots,
                                                              edits, k_base, v_base, pos_base);
}

__global__ void word_edits_kernel(WordEdits edits) { apply_edits(edits); }

void word_edits_cuda(const WordEdits& edits, cudaStream_t stream) {
  if (edits.count <= 0) return;
  word_edits_kernel<<<1, 256, 0, stream>>>(edits);
}

__global__ void kv_gather_kernel(const int64_t* src_slots, const int64_t* dst_slots, int64_t count, int head_dim,
                                 __nv_bfloat16* k_base, __nv_bfloat16* v_base, int32_t* pos_base) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * k_warps + (threadIdx.x >> 5);
  if (r >= count) return;
  const int lane = threadIdx.x & 31;
  const int64_t src = src_slots[r], dst = dst_slots[r];
  for (int d = lane; d < head_dim; d += 32) {
    k_base[dst * head_dim + d] = k_base[src * head_dim + d];
    v_base[dst * head_dim + d] = v_base[src * head_dim + d];
  }
  if (lane == 0) pos_base[dst] = pos_base[src];
}

void kv_gather_cuda(const int64_t* src_slots, const int64_t* dst_slots, int64_t count, int head_dim,
                    __nv_bfloat16* k_base, __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t stream) {
  if (count <= 0) return;
  kv_gather_kernel<<<static_cast<unsigned>((count + k_warps - 1) / k_warps), k_warps * 32, 0, stream>>>(
      src_slots, dst_slots, count, head_dim, k_base, v_base, pos_base);
}

}  // namespace snap::kernels
