// BlockPool: the fixed-size KV blocks every sequence's paged cache draws from. A block
// holds `block_size` tokens of ONE layer's ONE KV head: keys [block_size, head_dim],
// values [block_size, head_dim] in kv_dtype (f32, bf16, f16, or q8_0 rows with their scales,
// kernels/kv_convert.h) and the int32 RoPE position of each slot. The pool is
// sized in bytes once at start-up (one allocation, see storage) and never grows; alloc()
// returns resource_exhausted when it is full. Thread-safe: sequences on different threads
// share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace snap {

// The K/V element type when none is asked for (--kv-dtype): see README, "KV cache dtype".
inline constexpr DType k_default_kv_dtype = DType::f32;

// "f32", "bf16", "f16", "q8_0" → the type; "" → k_default_kv_dtype; anything else
// invalid_argument naming the accepted values (the --kv-dtype flag).
Result<DType> kv_dtype_from_name(const std::string& name);

struct BlockPoolConfig {
  int block_size = 16;  // tokens per block
  int head_dim = 0;
  DType kv_dtype = k_default_kv_dtype;  // element type of K and V: f32, bf16, f16 or q8_0
  int64_t capacity_bytes = 0;   // the pool holds floor(capacity_bytes / block_bytes) blocks
};

class BlockPool {
 public:
  // invalid_argument for non-positive sizes, a capacity below one block or a kv_dtype other
  // than f32, bf16, f16 or q8_0.
  static Result<std::unique_ptr<BlockPool>> create(const BlockPoolConfig& cfg);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A free block id in [0, num_blocks()), most recently freed first (LIFO: its memory is
  // likely still in cache). resource_exhausted with a one-line message when none is left.
  Result<int32_t> alloc();
  // Returns a block to the pool. Freeing a block that is not in use is a broken invariant (CHECK).
  void free(int32_t id);

  int block_size() const { return cfg_.block_size; }
  int head_dim() const { return cfg_.head_dim; }
  DType kv_dtype() const { return cfg_.kv_dtype; }
  // Bytes of one token's K (or V) row of one head: head_dim × 4 (f32), × 2 (bf16, f16), or
  // head_dim + 2 × ceil(head_dim / 32) for q8_0 (int8 values + f16 scales: 68 for 64).
  int64_t row_bytes() const { return row_bytes_; }
  // Bytes of one block: K + V + positions (block_size × (2 × row_bytes + 4)), exactly.
  int64_t block_bytes() const { return block_bytes_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const;
  int64_t num_used() const { return num_blocks_ - num_free(); }
  // The most blocks ever in use at once (high-water mark since creation).
  int64_t peak_used() const;

  // --- storage ---------------------------------------------------------------------
  // Three regions of the one allocation, each starting on a 4 KiB page: K [num_blocks,
  // block_size, head_dim], V [num_blocks, block_size, head_dim], positions [num_blocks,
  // block_size]. Keeping all K together (rather than K and V side by side per block) makes
  // consecutive blocks one stream, and a 16 × 64 f32 K block exactly one page: SmolLM2
  // decode at 8K keys (1 thread) measured ~30% slower with K|V|positions interleaved per block.
  // K and V are raw bytes of kv_dtype elements; k(id)/v(id) point at a block's first element.
  std::byte* k_base() { return data_.get(); }
  std::byte* v_base() { return data_.get() + v_offset_; }
  int32_t* pos_base() { return reinterpret_cast<int32_t*>(data_.get() + pos_offset_); }
  // Block stride in the units of kernels::PagedKv: elements, or bytes for q8_0.
  int64_t kv_block_stride() const {
    return cfg_.kv_dtype == DType::q8_0 ? cfg_.block_size * row_bytes_ : int64_t{cfg_.block_size} * cfg_.head_dim;
  }
  int64_t pos_block_stride() const { return cfg_.block_size; }  // int32s
  std::byte* k(int32_t id) { return k_base() + id * cfg_.block_size * row_bytes_; }
  std::byte* v(int32_t id) { return v_base() + id * cfg_.block_size * row_bytes_; }
  int32_t* positions(int32_t id) { return pos_base() + id * pos_block_stride(); }

  // --- pool-wide accounting (the paged caches report their deltas) --------------------
  // resident: blocks in use × block_bytes(); stored: K/V bytes of the tokens actually held;
  // full_equivalent: K/V bytes an uncompressed cache of the same sequences would need.
  int64_t resident_bytes() const { return num_used() * block_bytes_; }
  int64_t stored_bytes() const;
  int64_t full_equivalent_bytes() const;
  void add_accounting(int64_t stored_delta, int64_t full_equivalent_delta);

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  BlockPool(const BlockPoolConfig& cfg, int64_t block_bytes, int64_t num_blocks, int64_t v_offset, int64_t pos_offset,
            std::byte* data);

  BlockPoolConfig cfg_;
  int64_t row_bytes_ = 0;
  int64_t block_bytes_ = 0;
  int64_t num_blocks_ = 0;
  int64_t v_offset_ = 0, pos_offset_ = 0;         // bytes from data_ to the V and position regions
  std::unique_ptr<std::byte, FreeDeleter> data_;  // K | V | positions regions

  mutable std::mutex mu_;
  std::vector<int32_t> free_;    // stack of free ids; back() is handed out next
  std::vector<uint8_t> in_use_;  // [num_blocks]: 1 while allocated (double-free detection)
  int64_t peak_used_ = 0;
  int64_t stored_bytes_ = 0;
  int64_t full_equivalent_bytes_ = 0;
};

}  // namespace snap
