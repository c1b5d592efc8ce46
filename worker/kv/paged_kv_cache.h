// PagedKvCache: one sequence's KV, paged per (layer, KV head) in blocks of a shared
// BlockPool. Each head has its own block table, length and per-token RoPE positions, so
// heads may hold different numbers of tokens after compression (compact() keeps chosen
// entries with their original positions and frees the blocks no longer needed). Positions
// within a head are strictly increasing; new tokens continue at next_position().
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/attention_paged.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/kv_cache.h"

namespace snap {

class PagedKvCache {
 public:
  // The pool must outlive the cache and have pool.head_dim() == shape.head_dim (CHECK).
  PagedKvCache(BlockPool& pool, KvCacheShape shape);
  ~PagedKvCache() { free_all(); }
  PagedKvCache(PagedKvCache&& other) noexcept;
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;
  PagedKvCache& operator=(PagedKvCache&&) = delete;

  const KvCacheShape& shape() const { return shape_; }
  BlockPool& pool() const { return pool_; }

  // --- writes ------------------------------------------------------------------------
  // Appends n tokens to one head: positions[n], k/v rows [n, head_dim]. Positions must be
  // strictly increasing and above the head's last stored position (invalid_argument).
  // resource_exhausted when the pool cannot hold them; then nothing is appended.
  Status append(int layer, int kv_head, const int32_t* positions, const float* k, const float* v, int64_t n);
  // Appends a chunk the forward pass produced for one layer: k/v [num_tokens, num_kv_heads,
  // head_dim], token-major. All heads or none (on exhaustion nothing is appended).
  Status append_layer(int layer, const int32_t* positions, const float* k, const float* v, int64_t num_tokens);
  // Keeps only entries keep_indices (strictly increasing indices into the head's current
  // contents) in that order, moved to the front, and returns the blocks no longer needed to
  // the pool. invalid_argument for unsorted or out-of-range indices (cache unchanged).
  Status compact(int layer, int kv_head, const std::vector<int32_t>& keep_indices);
  // Returns every block to the pool; the sequence restarts at position 0.
  void free_all();
  // Makes this (empty) cache a copy of `src` (same pool and shape): every head's entries,
  // positions and next_position, in blocks of its own (a fork: n choices of one prompt
  // share its prefill and compression, then diverge). Copies whole blocks. On
  // resource_exhausted nothing is kept.
  Status copy_from(const PagedKvCache& src);

  // --- reads -------------------------------------------------------------------------
  // 1 + the largest position ever appended (0 when empty): where the next token goes.
  int32_t next_position() const { return next_position_; }
  int64_t length(int layer, int kv_head) const { return head(layer, kv_head).length; }
  const std::vector<int32_t>& block_table(int layer, int kv_head) const { return head(layer, kv_head).blocks; }
  // Entry j < length of a head: its key row, value row [head_dim] as f32 (converted from
  // the pool's kv_dtype: exactly what attention reads) and its position.
  void read_k_row(int layer, int kv_head, int64_t j, float* out) const;
  void read_v_row(int layer, int kv_head, int64_t j, float* out) const;
  std::vector<float> k_row(int layer, int kv_head, int64_t j) const;
  std::vector<float> v_row(int layer, int kv_head, int64_t j) const;
  int32_t position(int layer, int kv_head, int64_t j) const;
  // The positions a head holds, in order (explainability dumps).
  std::vector<int32_t> positions(int layer, int kv_head) const;
  // The kernel view of one layer for attention_paged_*. Valid until this layer is next
  // modified (append, compact, free_all).
  kernels::PagedKv layer_view(int layer);

  // --- accounting ----------------------------------------------------------------------
  // resident: blocks held × pool.block_bytes() (what this sequence really occupies: K, V
  // and positions, whole blocks);
  // stored: K/V bytes of the tokens held, Σ lengths × 2 × pool.row_bytes() (q8_0: with scales);
  // full_equivalent: what the uncompressed cache of the same sequence would occupy in this
  // pool, on the same basis as resident: num_layers × num_kv_heads × ceil(next_position /
  // block_size) blocks × block_bytes. So resident / full_equivalent is exactly 1 for `full`
  // and the memory a policy saves for the others. The pool sums stored and full_equivalent.
  int64_t num_blocks() const { return num_blocks_; }
  int64_t resident_bytes() const { return num_blocks_ * pool_.block_bytes(); }
  int64_t stored_bytes() const { return stored_tokens_ * token_bytes(); }
  int64_t full_equivalent_bytes() const { return full_equivalent_bytes_at(next_position_); }

 private:
  struct HeadKv {
    std::vector<int32_t> blocks;  // block table
    int64_t length = 0;           // tokens stored
  };
  HeadKv& head(int layer, int kv_head);
  const HeadKv& head(int layer, int kv_head) const;
  int64_t full_equivalent_bytes_at(int64_t next_position) const {
    const int64_t blocks = (next_position + pool_.block_size() - 1) / pool_.block_size();
    return int64_t{shape_.num_layers} * shape_.num_kv_heads * blocks * pool_.block_bytes();
  }
  int64_t token_bytes() const { return 2 * pool_.row_bytes(); }
  // Allocates blocks so that h can hold `new_length` tokens, appending them to h.blocks and
  // counting them in `added`; resource_exhausted when the pool runs dry (roll back with shrink).
  Status grow(HeadKv& h, int64_t new_length, int64_t& added);
  // Returns the last `count` blocks of h to the pool.
  void shrink(HeadKv& h, int64_t count);
  const std::byte* row_address(bool value, int layer, int kv_head, int64_t j) const;
  void write_rows(HeadKv& h, const int32_t* positions, const float* k, const float* v, int64_t n, int64_t row_stride);
  Status check_positions(const HeadKv& h, const int32_t* positions, int64_t n, int layer, int kv_head) const;
  void set_next_position(int32_t next);

  BlockPool& pool_;
  KvCacheShape shape_;
  std::vector<HeadKv> heads_;                             // [num_layers * num_kv_heads]
  std::vector<std::vector<kernels::PagedKvHead>> views_;  // [num_layers][num_kv_heads], filled by layer_view
  int32_t next_position_ = 0;
  int64_t num_blocks_ = 0;
  int64_t stored_tokens_ = 0;
};

}  // namespace snap
