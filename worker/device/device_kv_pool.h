// The KV block pool on one GPU: bf16 K and V slabs [num_blocks, block_size, head_dim] and an
// int32 position slab in device memory; the block accounting (free list, per-head block
// tables, lengths) on the host. As on the CPU (worker/kv), a block holds block_size tokens of
// one (layer, KV head) of one sequence, so heads hold different lengths after compression and
// compaction really frees blocks. Everything runs on the pool's stream, in order, so a freed
// block can be reused at once by later work on that stream.
//
// Each (sequence, layer) keeps its device view — the heads' lengths and block tables — in one
// device buffer for its whole life, with room for `table capacity` blocks per head. An append
// edits it in place through word_edits_cuda (the new block ids and lengths travel in the
// launch's arguments) and kv_append_cuda reads its slots from it, so a decode step's appends
// and views upload nothing and never wait for the GPU. The whole view is uploaded (and the
// host waits) only when a head outgrows the capacity (doubled each time), at compaction and at
// a layer's first view: table_uploads() counts these.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/kernels_cuda.h"

namespace snap {

struct DeviceKvShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
};

class DeviceKvPool {
 public:
  // As many blocks as fit in `bytes`; each costs block_size · (2 · head_dim · 2 + 4) bytes.
  static Result<std::unique_ptr<DeviceKvPool>> create(const DeviceKvShape& shape, int64_t bytes, cudaStream_t stream);
  ~DeviceKvPool();
  DeviceKvPool(const DeviceKvPool&) = delete;
  DeviceKvPool& operator=(const DeviceKvPool&) = delete;

  const DeviceKvShape& shape() const { return shape_; }
  int64_t block_bytes() const;
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // The most blocks ever in use at once (compaction's old + new blocks included).
  int64_t peak_used_blocks() const { return peak_used_; }

  // A new empty sequence's id: the lowest id not open (a released sequence's id is reused).
  int32_t add_sequence();
  bool is_open(int32_t seq) const {
    return seq >= 0 && seq < static_cast<int32_t>(seqs_.size()) && seqs_[seq].live;
  }
  Status release(int32_t seq);  // frees every block of seq
  // n > 1: a new sequence holding a copy of seq's cache — every (layer, KV head)'s entries in
  // fresh blocks, in order, with the same lengths and uncompressed lengths — copied on the
  // pool's stream (kv_gather_cuda). The two are independent from then on. All or nothing:
  // refused (nothing allocated) when the free blocks do not suffice.
  Result<int32_t> fork(int32_t seq);

  // Appends num_tokens rows of `layer`: k, v device f32 [num_tokens, num_kv_heads, head_dim]
  // (after RoPE), positions device int32 [num_tokens]. All or nothing: refused (nothing
  // written, nothing allocated) when the free blocks do not suffice.
  Status append(int32_t seq, int layer, const float* k, const float* v, const int32_t* positions, int64_t num_tokens);
  // One decode row of each of num_rows different sequences of `layer` (a continuous-batching
  // step): row b of k, v (device f32 [num_rows, num_kv_heads, head_dim]) and positions[b]
  // appended to sequence seqs[b] (host array), with the edits of every view in as few launches
  // as the kernels' arguments hold (kv_append_slots_cuda: 16 rows at 8 KV heads). The same
  // contents and views as append(seqs[b], layer, ..., 1) for each b. All or nothing, as append.
  Status append_rows(const int32_t* seqs, int64_t num_rows, int layer, const float* k, const float* v,
                     const int32_t* positions);
  // Keeps, per KV head g, the logical entries kept[g] (strictly ascending, < length): copied
  // into fresh blocks in that order, then the old blocks are freed.
  Status compact(int32_t seq, int layer, const std::vector<std::vector<int32_t>>& kept);

  int64_t length(int32_t seq, int layer, int g) const;
  int64_t appended(int32_t seq, int layer) const;   // the uncompressed length
  int64_t resident_bytes(int32_t seq) const;         // blocks held × block_bytes
  int64_t full_equivalent_bytes(int32_t seq) const;  // blocks the uncompressed cache would hold

  // The device view of (seq, layer) for attention_paged_cuda / snapkv_select_cuda: the resident
  // buffer, current for every kernel enqueued after this call on the pool's stream. Its
  // pointers stay valid until the release of seq or an append that outgrows its capacity.
  Result<kernels::PagedKvCuda> view(int32_t seq, int layer);
  // Slot of logical entry j of (seq, layer, g): block · block_size + j % block_size.
  int64_t slot(int32_t seq, int layer, int g, int64_t j) const;

  const __nv_bfloat16* k_slab() const { return k_; }
  const __nv_bfloat16* v_slab() const { return v_; }
  const int32_t* pos_slab() const { return pos_; }
  cudaStream_t stream() const { return stream_; }
  // Whole-view uploads so far (each one waits for the stream): a layer's first, a capacity
  // growth, a compaction. Appends within the capacity make none.
  int64_t table_uploads() const { return table_uploads_; }

 private:
  DeviceKvPool(const DeviceKvShape& shape, int64_t num_blocks, cudaStream_t stream);
  struct Sequence {
    bool live = false;
    std::vector<std::vector<std::vector<int32_t>>> tables;  // [layer][g] block ids
    std::vector<std::vector<int64_t>> lengths;              // [layer][g]
    std::vector<int64_t> appended;                          // [layer]
    std::vector<void*> view_buf;     // [layer] device: [nkv] PagedKvHead, then nkv tables of table_cap ids
    std::vector<int64_t> table_cap;  // [layer] blocks each head's table has room for (0: no buffer)
  };
  Status check_seq(int32_t seq, int layer) const;
  // Blocks that appending num_tokens to (s, layer) takes from the free list.
  int64_t blocks_needed(const Sequence& s, int layer, int64_t num_tokens) const;
  // Grows (s, layer)'s host tables by num_tokens (blocks from the free list: the caller checked
  // that enough are free) and returns the view edits that say the same, as (int32 word of the
  // view buffer, value): each new block's table entry, each head's length (its high word only
  // when it changes). *widest: the longest table now.
  std::vector<std::pair<int32_t, int32_t>> grow(Sequence& s, int layer, int64_t num_tokens, int64_t* widest);
  // The whole view of (seq, layer) to the device, in a buffer with room for at least
  // `min_cap` blocks per head (grown to twice the old room or more); waits for the stream.
  Status upload_view(Sequence& s, int layer, int64_t min_cap);
  Status stage(const std::vector<int64_t>& slots);  // -> staging_ (device), grows it
  int32_t take_block();  // the lowest free block id (the caller checked that one is free)
  void free_blocks_of(std::vector<int32_t>& blocks);

  DeviceKvShape shape_;
  int64_t num_blocks_ = 0;
  cudaStream_t stream_ = nullptr;
  __nv_bfloat16* k_ = nullptr;
  __nv_bfloat16* v_ = nullptr;
  int32_t* pos_ = nullptr;
  int64_t* staging_ = nullptr;  // slot lists for the scatter/gather kernels
  size_t staging_count_ = 0;
  int64_t table_uploads_ = 0;
  // A min-heap (std::greater): the lowest free id is taken first, whatever order blocks were
  // freed in, in O(log n) a block (a sort of the whole list after each free cost O(n log n):
  // seconds per request on a GPU pool of millions of blocks).
  std::vector<int32_t> free_;
  int64_t peak_used_ = 0;
  std::vector<Sequence> seqs_;
};

}  // namespace snap
