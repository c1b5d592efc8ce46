// PagedKvCache: block tables per (layer, KV head), appends that allocate all-or-nothing,
// compaction that moves kept entries to the front and frees the tail blocks, and exact
// byte accounting reported to the pool.
#include "worker/kv/paged_kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/check.h"
#include "kernels/kv_convert.h"

namespace snap {

PagedKvCache::PagedKvCache(BlockPool& pool, KvCacheShape shape)
    : pool_(pool),
      shape_(shape),
      heads_(static_cast<size_t>(shape.num_layers * shape.num_kv_heads)),
      views_(static_cast<size_t>(shape.num_layers), std::vector<kernels::PagedKvHead>(shape.num_kv_heads)) {
  CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0)
      << "paged_kv_cache: shape " << shape.num_layers << " layers, " << shape.num_kv_heads << " KV heads";
  CHECK_EQ(shape.head_dim, pool.head_dim());
}

PagedKvCache::PagedKvCache(PagedKvCache&& other) noexcept
    : pool_(other.pool_),
      shape_(other.shape_),
      heads_(std::move(other.heads_)),
      views_(std::move(other.views_)),
      next_position_(other.next_position_),
      num_blocks_(other.num_blocks_),
      stored_tokens_(other.stored_tokens_) {
  // The moved-from cache owns nothing: its destructor frees nothing and reports no bytes.
  other.heads_.assign(heads_.size(), HeadKv{});
  other.views_.assign(views_.size(), std::vector<kernels::PagedKvHead>(shape_.num_kv_heads));
  other.next_position_ = 0;
  other.num_blocks_ = 0;
  other.stored_tokens_ = 0;
}

PagedKvCache::HeadKv& PagedKvCache::head(int layer, int kv_head) {
  CHECK(layer >= 0 && layer < shape_.num_layers && kv_head >= 0 && kv_head < shape_.num_kv_heads)
      << "paged_kv_cache: layer " << layer << " KV head " << kv_head;
  return heads_[static_cast<size_t>(layer * shape_.num_kv_heads + kv_head)];
}

const PagedKvCache::HeadKv& PagedKvCache::head(int layer, int kv_head) const {
  return const_cast<PagedKvCache*>(this)->head(layer, kv_head);
}

// --- writes ----------------------------------------------------------------------------

Status PagedKvCache::check_positions(const HeadKv& h, const int32_t* positions, int64_t n, int layer,
                                     int kv_head) const {
  if (n < 0) return invalid_argument("paged_kv_cache: append of " + std::to_string(n) + " tokens");
  int64_t last = -1;
  if (h.length > 0) {
    const int64_t j = h.length - 1;
    last = pool_.positions(h.blocks[j / pool_.block_size()])[j % pool_.block_size()];
  }
  for (int64_t i = 0; i < n; ++i) {
    if (positions[i] <= last)
      return invalid_argument("paged_kv_cache: layer " + std::to_string(layer) + " KV head " + std::to_string(kv_head) +
                              ": position " + std::to_string(positions[i]) + " not above previous " +
                              std::to_string(last));
    last = positions[i];
  }
  return Status::ok_status();
}

Status PagedKvCache::grow(HeadKv& h, int64_t new_length, int64_t& added) {
  const int64_t bs = pool_.block_size();
  const int64_t needed = (new_length + bs - 1) / bs;
  while (static_cast<int64_t>(h.blocks.size()) < needed) {
    SNAP_ASSIGN_OR_RETURN(const int32_t id, pool_.alloc());
    h.blocks.push_back(id);
    ++num_blocks_;
    ++added;
  }
  return Status::ok_status();
}

void PagedKvCache::shrink(HeadKv& h, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    pool_.free(h.blocks.back());
    h.blocks.pop_back();
    --num_blocks_;
  }
}

void PagedKvCache::write_rows(HeadKv& h, const int32_t* positions, const float* k, const float* v, int64_t n,
                              int64_t row_stride) {
  const int64_t bs = pool_.block_size();
  const int64_t hd = shape_.head_dim;
  const int64_t row_bytes = pool_.row_bytes();
  const DType dtype = pool_.kv_dtype();
  // Converted on write (f32 → bf16/f16 rounds to nearest even, q8_0 quantizes the row): the pool holds what
  // attention and the compressor will read.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = h.length + i;
    const int32_t blk = h.blocks[static_cast<size_t>(j / bs)];
    const int64_t slot = j % bs;
    kernels::kv_convert_cpu(k + i * row_stride, dtype, pool_.k(blk) + slot * row_bytes, hd);
    kernels::kv_convert_cpu(v + i * row_stride, dtype, pool_.v(blk) + slot * row_bytes, hd);
    pool_.positions(blk)[slot] = positions[i];
  }
  h.length += n;
  stored_tokens_ += n;
  pool_.add_accounting(n * token_bytes(), 0);
}

void PagedKvCache::set_next_position(int32_t next) {
  if (next <= next_position_) return;
  const int64_t delta = full_equivalent_bytes_at(next) - full_equivalent_bytes_at(next_position_);
  next_position_ = next;
  pool_.add_accounting(0, delta);
}

Status PagedKvCache::append(int layer, int kv_head, const int32_t* positions, const float* k, const float* v,
                            int64_t n) {
  HeadKv& h = head(layer, kv_head);
  SNAP_RETURN_IF_ERROR(check_positions(h, positions, n, layer, kv_head));
  if (n == 0) return Status::ok_status();
  int64_t added = 0;
  if (Status s = grow(h, h.length + n, added); !s.ok()) {
    shrink(h, added);
    return s;
  }
  write_rows(h, positions, k, v, n, shape_.head_dim);
  set_next_position(positions[n - 1] + 1);
  return Status::ok_status();
}

Status PagedKvCache::append_layer(int layer, const int32_t* positions, const float* k, const float* v,
                                  int64_t num_tokens) {
  const int num_kv_heads = shape_.num_kv_heads;
  for (int g = 0; g < num_kv_heads; ++g)
    SNAP_RETURN_IF_ERROR(check_positions(head(layer, g), positions, num_tokens, layer, g));
  if (num_tokens == 0) return Status::ok_status();
  std::vector<int64_t> added(static_cast<size_t>(num_kv_heads), 0);
  for (int g = 0; g < num_kv_heads; ++g) {
    HeadKv& h = head(layer, g);
    if (Status s = grow(h, h.length + num_tokens, added[g]); !s.ok()) {
      for (int r = 0; r <= g; ++r) shrink(head(layer, r), added[r]);
      return s;
    }
  }
  const int64_t hd = shape_.head_dim;
  const int64_t row_stride = int64_t{num_kv_heads} * hd;
  for (int g = 0; g < num_kv_heads; ++g)
    write_rows(head(layer, g), positions, k + g * hd, v + g * hd, num_tokens, row_stride);
  set_next_position(positions[num_tokens - 1] + 1);
  return Status::ok_status();
}

Status PagedKvCache::compact(int layer, int kv_head, const std::vector<int32_t>& keep_indices) {
  HeadKv& h = head(layer, kv_head);
  int64_t prev = -1;
  for (const int32_t j : keep_indices) {
    if (j <= prev || j >= h.length)
      return invalid_argument("paged_kv_cache: compact layer " + std::to_string(layer) + " KV head " +
                              std::to_string(kv_head) + ": index " + std::to_string(j) +
                              " not increasing or not below length " + std::to_string(h.length));
    prev = j;
  }
  const int64_t bs = pool_.block_size();
  const int64_t row_bytes = pool_.row_bytes();
  // keep_indices[i] >= i, so moving front to back never overwrites an entry still to be read.
  // Rows move as stored bytes: compaction never re-rounds.
  for (int64_t i = 0; i < static_cast<int64_t>(keep_indices.size()); ++i) {
    const int64_t src = keep_indices[static_cast<size_t>(i)];
    if (src == i) continue;
    const int32_t sb = h.blocks[static_cast<size_t>(src / bs)], db = h.blocks[static_cast<size_t>(i / bs)];
    const int64_t ss = src % bs, ds = i % bs;
    std::memcpy(pool_.k(db) + ds * row_bytes, pool_.k(sb) + ss * row_bytes, row_bytes);
    std::memcpy(pool_.v(db) + ds * row_bytes, pool_.v(sb) + ss * row_bytes, row_bytes);
    pool_.positions(db)[ds] = pool_.positions(sb)[ss];
  }
  const int64_t new_length = static_cast<int64_t>(keep_indices.size());
  const int64_t removed = h.length - new_length;
  h.length = new_length;
  shrink(h, static_cast<int64_t>(h.blocks.size()) - (new_length + bs - 1) / bs);
  stored_tokens_ -= removed;
  pool_.add_accounting(-removed * token_bytes(), 0);
  return Status::ok_status();
}

void PagedKvCache::free_all() {
  for (HeadKv& h : heads_) {
    shrink(h, static_cast<int64_t>(h.blocks.size()));
    h.length = 0;
  }
  pool_.add_accounting(-stored_tokens_ * token_bytes(), -full_equivalent_bytes());
  stored_tokens_ = 0;
  next_position_ = 0;
}

Status PagedKvCache::copy_from(const PagedKvCache& src) {
  CHECK(&src.pool_ == &pool_) << "paged_kv_cache: copy_from another pool";
  CHECK(src.shape_.num_layers == shape_.num_layers && src.shape_.num_kv_heads == shape_.num_kv_heads &&
        src.shape_.head_dim == shape_.head_dim)
      << "paged_kv_cache: copy_from another shape";
  if (next_position_ != 0 || num_blocks_ != 0) return invalid_argument("paged_kv_cache: copy_from into a non-empty cache");
  for (size_t i = 0; i < heads_.size(); ++i) {
    int64_t added = 0;
    if (Status st = grow(heads_[i], src.heads_[i].length, added); !st.ok()) {
      free_all();
      return st;
    }
  }
  const int64_t kv_bytes = pool_.block_size() * pool_.row_bytes();
  for (size_t i = 0; i < heads_.size(); ++i) {
    const HeadKv& from = src.heads_[i];
    HeadKv& to = heads_[i];
    for (size_t b = 0; b < to.blocks.size(); ++b) {
      std::memcpy(pool_.k(to.blocks[b]), pool_.k(from.blocks[b]), kv_bytes);
      std::memcpy(pool_.v(to.blocks[b]), pool_.v(from.blocks[b]), kv_bytes);
      std::memcpy(pool_.positions(to.blocks[b]), pool_.positions(from.blocks[b]), pool_.block_size() * sizeof(int32_t));
    }
    to.length = from.length;
  }
  stored_tokens_ = src.stored_tokens_;
  pool_.add_accounting(stored_tokens_ * token_bytes(), 0);
  set_next_position(src.next_position_);
  return Status::ok_status();
}

// --- reads -----------------------------------------------------------------------------

const std::byte* PagedKvCache::row_address(bool value, int layer, int kv_head, int64_t j) const {
  const HeadKv& h = head(layer, kv_head);
  CHECK(j >= 0 && j < h.length) << "paged_kv_cache: entry " << j << " of " << h.length;
  const int32_t blk = h.blocks[static_cast<size_t>(j / pool_.block_size())];
  const int64_t row_bytes = pool_.row_bytes();
  return (value ? pool_.v(blk) : pool_.k(blk)) + (j % pool_.block_size()) * row_bytes;
}

void PagedKvCache::read_k_row(int layer, int kv_head, int64_t j, float* out) const {
  kernels::kv_to_f32_cpu(row_address(false, layer, kv_head, j), pool_.kv_dtype(), out, shape_.head_dim);
}

void PagedKvCache::read_v_row(int layer, int kv_head, int64_t j, float* out) const {
  kernels::kv_to_f32_cpu(row_address(true, layer, kv_head, j), pool_.kv_dtype(), out, shape_.head_dim);
}

std::vector<float> PagedKvCache::k_row(int layer, int kv_head, int64_t j) const {
  std::vector<float> out(static_cast<size_t>(shape_.head_dim));
  read_k_row(layer, kv_head, j, out.data());
  return out;
}

std::vector<float> PagedKvCache::v_row(int layer, int kv_head, int64_t j) const {
  std::vector<float> out(static_cast<size_t>(shape_.head_dim));
  read_v_row(layer, kv_head, j, out.data());
  return out;
}

int32_t PagedKvCache::position(int layer, int kv_head, int64_t j) const {
  const HeadKv& h = head(layer, kv_head);
  CHECK(j >= 0 && j < h.length) << "paged_kv_cache: entry " << j << " of " << h.length;
  return pool_.positions(h.blocks[static_cast<size_t>(j / pool_.block_size())])[j % pool_.block_size()];
}

std::vector<int32_t> PagedKvCache::positions(int layer, int kv_head) const {
  std::vector<int32_t> out(static_cast<size_t>(length(layer, kv_head)));
  for (size_t j = 0; j < out.size(); ++j) out[j] = position(layer, kv_head, static_cast<int64_t>(j));
  return out;
}

kernels::PagedKv PagedKvCache::layer_view(int layer) {
  CHECK(layer >= 0 && layer < shape_.num_layers) << "paged_kv_cache: layer " << layer;
  std::vector<kernels::PagedKvHead>& v = views_[static_cast<size_t>(layer)];
  for (int g = 0; g < shape_.num_kv_heads; ++g) {
    const HeadKv& h = head(layer, g);
    v[static_cast<size_t>(g)] = {h.blocks.data(), h.length};
  }
  kernels::PagedKv kv;
  kv.dtype = pool_.kv_dtype();
  kv.k_base = pool_.k_base();
  kv.v_base = pool_.v_base();
  kv.pos_base = pool_.pos_base();
  kv.k_block_stride = kv.v_block_stride = pool_.kv_block_stride();
  kv.pos_block_stride = pool_.pos_block_stride();
  kv.block_size = pool_.block_size();
  kv.heads = v.data();
  return kv;
}

}  // namespace snap
