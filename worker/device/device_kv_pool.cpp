// DeviceKvPool (device_kv_pool.h): host-side block accounting over device slabs; appends and
// compaction enqueue kernels/cuda/kv_cache.cu on the pool's stream.
#include "worker/device/device_kv_pool.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace snap {

namespace {
std::string cuda_message(const char* what, cudaError_t e) {
  return std::string("device KV pool: ") + what + ": " + cudaGetErrorString(e);
}
int64_t blocks_for(int64_t n, int bs) { return (n + bs - 1) / bs; }
// int32 words of a view buffer ([nkv] PagedKvHead, then nkv tables of `cap` ids): head g's
// length (low word; the high word follows) and entry i of its table.
static_assert(sizeof(kernels::PagedKvHead) % 4 == 0 && offsetof(kernels::PagedKvHead, length) % 4 == 0);
int32_t view_length_word(int g) {
  return static_cast<int32_t>((sizeof(kernels::PagedKvHead) * g + offsetof(kernels::PagedKvHead, length)) / 4);
}
int32_t view_table_word(int nkv, int64_t cap, int g, int64_t i) {
  return static_cast<int32_t>(sizeof(kernels::PagedKvHead) * nkv / 4 + g * cap + i);
}
// A view's edits (int32 word of its buffer, value) as (device address, value).
using Edits = std::vector<std::pair<int32_t*, int32_t>>;
Edits at_words(int32_t* words, const std::vector<std::pair<int32_t, int32_t>>& edits) {
  Edits out;
  for (const auto& [w, value] : edits) out.emplace_back(words + w, value);
  return out;
}
// edits[at, at + WordEdits::k_max) as one launch's arguments.
kernels::WordEdits pack_edits(const Edits& edits, size_t at) {
  kernels::WordEdits e;
  for (size_t i = at; i < edits.size() && e.count < kernels::WordEdits::k_max; ++i, ++e.count) {
    e.word[e.count] = edits[i].first;
    e.value[e.count] = edits[i].second;
  }
  return e;
}
}  // namespace

Result<std::unique_ptr<DeviceKvPool>> DeviceKvPool::create(const DeviceKvShape& shape, int64_t bytes,
                                                           cudaStream_t stream) {
  if (shape.num_layers < 1 || shape.num_kv_heads < 1 || shape.head_dim < 1 || shape.block_size < 1)
    return invalid_argument("device KV pool: layers, KV heads, head_dim and block_size must be positive");
  const int64_t per_block = int64_t{shape.block_size} * (2 * shape.head_dim * 2 + 4);
  const int64_t n = bytes / per_block;
  if (n < 1)
    return invalid_argument("device KV pool: " + std::to_string(bytes) + " bytes hold no block of " +
                            std::to_string(per_block) + " bytes");
  std::unique_ptr<DeviceKvPool> pool(new DeviceKvPool(shape, n, stream));
  const size_t elems = static_cast<size_t>(n) * shape.block_size * shape.head_dim;
  cudaError_t e = cudaMalloc(&pool->k_, elems * 2);
  if (e == cudaSuccess) e = cudaMalloc(&pool->v_, elems * 2);
  if (e == cudaSuccess) e = cudaMalloc(&pool->pos_, static_cast<size_t>(n) * shape.block_size * 4);
  if (e != cudaSuccess)
    return resource_exhausted(cuda_message(("allocating " + std::to_string(n) + " blocks").c_str(), e));
  return pool;
}

DeviceKvPool::DeviceKvPool(const DeviceKvShape& shape, int64_t num_blocks, cudaStream_t stream)
    : shape_(shape), num_blocks_(num_blocks), stream_(stream) {
  free_.resize(static_cast<size_t>(num_blocks));
  std::iota(free_.begin(), free_.end(), 0);  // ascending ids: already a min-heap
}

DeviceKvPool::~DeviceKvPool() {
  cudaStreamSynchronize(stream_);
  for (Sequence& s : seqs_)
    for (void* p : s.view_buf) cudaFree(p);
  cudaFree(staging_);
  cudaFree(pos_);
  cudaFree(v_);
  cudaFree(k_);
}

int64_t DeviceKvPool::block_bytes() const { return int64_t{shape_.block_size} * (2 * shape_.head_dim * 2 + 4); }

int32_t DeviceKvPool::add_sequence() {
  // The lowest released slot, else a new one: a long-running server holds as many slots as
  // it ever had sequences open at once, and ranks whose pools hold the same open sequences
  // open the same id next whatever their histories.
  size_t i = 0;
  while (i < seqs_.size() && seqs_[i].live) ++i;
  if (i == seqs_.size()) seqs_.emplace_back();
  Sequence& s = seqs_[i];
  s.live = true;
  s.tables.assign(shape_.num_layers, std::vector<std::vector<int32_t>>(shape_.num_kv_heads));
  s.lengths.assign(shape_.num_layers, std::vector<int64_t>(shape_.num_kv_heads, 0));
  s.appended.assign(shape_.num_layers, 0);
  s.view_buf.assign(shape_.num_layers, nullptr);
  s.table_cap.assign(shape_.num_layers, 0);
  return static_cast<int32_t>(i);
}

Status DeviceKvPool::check_seq(int32_t seq, int layer) const {
  if (seq < 0 || seq >= static_cast<int32_t>(seqs_.size()) || !seqs_[seq].live)
    return invalid_argument("device KV pool: no live sequence " + std::to_string(seq));
  if (layer < 0 || layer >= shape_.num_layers)
    return invalid_argument("device KV pool: layer " + std::to_string(layer) + " not in [0, " +
                            std::to_string(shape_.num_layers) + ")");
  return Status::ok_status();
}

int32_t DeviceKvPool::take_block() {
  std::pop_heap(free_.begin(), free_.end(), std::greater<int32_t>());
  const int32_t id = free_.back();
  free_.pop_back();
  return id;
}

void DeviceKvPool::free_blocks_of(std::vector<int32_t>& blocks) {
  for (const int32_t b : blocks) {
    free_.push_back(b);
    std::push_heap(free_.begin(), free_.end(), std::greater<int32_t>());
  }
  blocks.clear();
}

Status DeviceKvPool::release(int32_t seq) {
  SNAP_RETURN_IF_ERROR(check_seq(seq, 0));
  Sequence& s = seqs_[seq];
  for (auto& layer : s.tables)
    for (auto& t : layer) free_blocks_of(t);
  cudaStreamSynchronize(stream_);  // the view buffers may still be read by queued kernels
  for (void*& p : s.view_buf) {
    cudaFree(p);
    p = nullptr;
  }
  s = Sequence{};  // not live; its host tables freed, the slot reusable (add_sequence)
  return Status::ok_status();
}

Status DeviceKvPool::stage(const std::vector<int64_t>& slots) {
  if (slots.size() > staging_count_) {
    cudaStreamSynchronize(stream_);  // queued kernels may still read the old list
    cudaFree(staging_);
    staging_ = nullptr;
    staging_count_ = 0;
    const cudaError_t e = cudaMalloc(&staging_, slots.size() * sizeof(int64_t));
    if (e != cudaSuccess) return resource_exhausted(cuda_message("staging slot list", e));
    staging_count_ = slots.size();
  }
  // Stream-ordered after every earlier kernel that read the previous list.
  const cudaError_t e =
      cudaMemcpyAsync(staging_, slots.data(), slots.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream_);
  if (e == cudaSuccess) cudaStreamSynchronize(stream_);  // `slots` is pageable host memory we return from
  return e == cudaSuccess ? Status::ok_status() : internal_error(cuda_message("uploading slots", e));
}

int64_t DeviceKvPool::blocks_needed(const Sequence& s, int layer, int64_t num_tokens) const {
  int64_t need = 0;
  for (int g = 0; g < shape_.num_kv_heads; ++g)
    need += blocks_for(s.lengths[layer][g] + num_tokens, shape_.block_size) - static_cast<int64_t>(s.tables[layer][g].size());
  return need;
}

std::vector<std::pair<int32_t, int32_t>> DeviceKvPool::grow(Sequence& s, int layer, int64_t num_tokens, int64_t* widest) {
  const int bs = shape_.block_size, nkv = shape_.num_kv_heads;
  std::vector<std::pair<int32_t, int32_t>> edits;  // (int32 word of the view buffer, value)
  const int64_t cap = s.table_cap[layer];
  *widest = 0;
  for (int g = 0; g < nkv; ++g) {
    std::vector<int32_t>& table = s.tables[layer][g];
    const int64_t len = s.lengths[layer][g];
    while (static_cast<int64_t>(table.size()) < blocks_for(len + num_tokens, bs)) {
      table.push_back(take_block());
      edits.emplace_back(view_table_word(nkv, cap, g, static_cast<int64_t>(table.size()) - 1), table.back());
    }
    const int64_t length = len + num_tokens;
    s.lengths[layer][g] = length;
    *widest = std::max(*widest, static_cast<int64_t>(table.size()));
    edits.emplace_back(view_length_word(g), static_cast<int32_t>(length & 0xffffffff));
    if (length >> 32 != len >> 32) edits.emplace_back(view_length_word(g) + 1, static_cast<int32_t>(length >> 32));
  }
  s.appended[layer] += num_tokens;
  peak_used_ = std::max(peak_used_, used_blocks());
  return edits;
}

Status DeviceKvPool::append(int32_t seq, int layer, const float* k, const float* v, const int32_t* positions,
                            int64_t num_tokens) {
  SNAP_RETURN_IF_ERROR(check_seq(seq, layer));
  if (num_tokens <= 0) return Status::ok_status();
  Sequence& s = seqs_[seq];
  const int bs = shape_.block_size, nkv = shape_.num_kv_heads;
  const int64_t need = blocks_needed(s, layer, num_tokens);
  if (need > free_blocks())
    return resource_exhausted("device KV pool: appending " + std::to_string(num_tokens) + " tokens needs " +
                              std::to_string(need) + " blocks, " + std::to_string(free_blocks()) + " free");
  // The host tables first; the device view then gets the same new block ids and lengths.
  int64_t widest = 0;
  const std::vector<std::pair<int32_t, int32_t>> words = grow(s, layer, num_tokens, &widest);
  if (widest > s.table_cap[layer]) {
    SNAP_RETURN_IF_ERROR(upload_view(s, layer, widest));  // the edits are in it
  } else if (const Edits edits = at_words(static_cast<int32_t*>(s.view_buf[layer]), words);
             num_tokens * nkv <= kernels::KvSlots::k_max && static_cast<int64_t>(edits.size()) <= kernels::WordEdits::k_max) {
    // A decode step's few rows: their slots from the host tables, rows and edits in one launch.
    kernels::KvSlots slots;
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int g = 0; g < nkv; ++g) {
        const int64_t j = s.lengths[layer][g] - num_tokens + t;
        slots.slot[slots.count++] = int64_t{s.tables[layer][g][j / bs]} * bs + j % bs;
      }
    kernels::kv_append_slots_cuda(k, v, positions, nkv, shape_.head_dim, slots, pack_edits(edits, 0), k_, v_, pos_,
                                  stream_);
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? Status::ok_status() : internal_error(cuda_message("kv_append_slots_cuda", err));
  } else {
    for (size_t at = 0; at < edits.size(); at += kernels::WordEdits::k_max)
      kernels::word_edits_cuda(pack_edits(edits, at), stream_);
  }
  kernels::kv_append_cuda(k, v, positions, num_tokens, nkv, shape_.head_dim,
                          static_cast<const kernels::PagedKvHead*>(s.view_buf[layer]), bs, k_, v_, pos_, stream_);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? Status::ok_status() : internal_error(cuda_message("kv_append_cuda", e));
}

Status DeviceKvPool::append_rows(const int32_t* seqs, int64_t num_rows, int layer, const float* k, const float* v,
                                 const int32_t* positions) {
  if (num_rows <= 0) return Status::ok_status();
  int64_t need = 0;
  for (int64_t b = 0; b < num_rows; ++b) {
    SNAP_RETURN_IF_ERROR(check_seq(seqs[b], layer));
    for (int64_t a = 0; a < b; ++a)
      if (seqs[a] == seqs[b])
        return invalid_argument("device KV pool: sequence " + std::to_string(seqs[b]) + " twice in one decode step");
    need += blocks_needed(seqs_[seqs[b]], layer, 1);
  }
  if (need > free_blocks())
    return resource_exhausted("device KV pool: a decode step of " + std::to_string(num_rows) + " sequences needs " +
                              std::to_string(need) + " blocks, " + std::to_string(free_blocks()) + " free");
  const int bs = shape_.block_size, nkv = shape_.num_kv_heads, hd = shape_.head_dim;
  // Per row: its nkv slots and its view's edits as (word, value), from the grown host tables. A
  // view that outgrows its room is uploaded whole (edits in it) before anything is launched.
  std::vector<int64_t> slots(static_cast<size_t>(num_rows * nkv));
  std::vector<Edits> row_edits(static_cast<size_t>(num_rows));
  for (int64_t b = 0; b < num_rows; ++b) {
    Sequence& s = seqs_[seqs[b]];
    int64_t widest = 0;
    const std::vector<std::pair<int32_t, int32_t>> words = grow(s, layer, 1, &widest);
    if (widest > s.table_cap[layer])
      SNAP_RETURN_IF_ERROR(upload_view(s, layer, widest));
    else
      row_edits[b] = at_words(static_cast<int32_t*>(s.view_buf[layer]), words);
    for (int g = 0; g < nkv; ++g) {
      const int64_t j = s.lengths[layer][g] - 1;
      slots[b * nkv + g] = int64_t{s.tables[layer][g][j / bs]} * bs + j % bs;
    }
  }
  // As many rows per launch as their slots and edits allow (rows r = b · nkv + g of k and v).
  for (int64_t b0 = 0; b0 < num_rows;) {
    kernels::KvSlots ks;
    kernels::WordEdits we;
    int64_t b = b0;
    for (; b < num_rows && ks.count + nkv <= kernels::KvSlots::k_max &&
           we.count + static_cast<int64_t>(row_edits[b].size()) <= kernels::WordEdits::k_max;
         ++b) {
      for (int g = 0; g < nkv; ++g) ks.slot[ks.count++] = slots[b * nkv + g];
      for (const auto& [word, value] : row_edits[b]) {
        we.word[we.count] = word;
        we.value[we.count++] = value;
      }
    }
    if (b == b0) {  // one row too wide for a launch (very many KV heads): edits, then the view's slots
      for (size_t at = 0; at < row_edits[b].size(); at += kernels::WordEdits::k_max)
        kernels::word_edits_cuda(pack_edits(row_edits[b], at), stream_);
      kernels::kv_append_cuda(k + b * nkv * hd, v + b * nkv * hd, positions + b, 1, nkv, hd,
                              static_cast<const kernels::PagedKvHead*>(seqs_[seqs[b]].view_buf[layer]), bs, k_, v_,
                              pos_, stream_);
      b0 = b + 1;
    } else {
      kernels::kv_append_slots_cuda(k + b0 * nkv * hd, v + b0 * nkv * hd, positions + b0, nkv, hd, ks, we, k_, v_,
                                    pos_, stream_);
      b0 = b;
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return internal_error(cuda_message("appending decode rows", e));
  }
  return Status::ok_status();
}

Status DeviceKvPool::compact(int32_t seq, int layer, const std::vector<std::vector<int32_t>>& kept) {
  SNAP_RETURN_IF_ERROR(check_seq(seq, layer));
  Sequence& s = seqs_[seq];
  const int bs = shape_.block_size, nkv = shape_.num_kv_heads;
  if (static_cast<int>(kept.size()) != nkv)
    return invalid_argument("device KV pool: compaction lists " + std::to_string(kept.size()) + " heads, layer has " +
                            std::to_string(nkv));
  int64_t need = 0, total = 0;
  for (int g = 0; g < nkv; ++g) {
    const std::vector<int32_t>& k = kept[g];
    for (size_t i = 0; i < k.size(); ++i)
      if (k[i] < 0 || k[i] >= s.lengths[layer][g] || (i > 0 && k[i] <= k[i - 1]))
        return invalid_argument("device KV pool: head " + std::to_string(g) + " kept entry " + std::to_string(k[i]) +
                                " is out of range or out of order");
    need += blocks_for(static_cast<int64_t>(k.size()), bs);
    total += static_cast<int64_t>(k.size());
  }
  if (need > free_blocks())  // old and new blocks coexist during the copy
    return resource_exhausted("device KV pool: compaction needs " + std::to_string(need) + " fresh blocks, " +
                              std::to_string(free_blocks()) + " free");
  std::vector<int64_t> slots(static_cast<size_t>(2 * total));  // [src..., dst...]
  std::vector<std::vector<int32_t>> fresh(static_cast<size_t>(nkv));
  int64_t at = 0;
  for (int g = 0; g < nkv; ++g) {
    const std::vector<int32_t>& k = kept[g];
    const std::vector<int32_t>& old = s.tables[layer][g];
    for (size_t i = 0; i < k.size(); ++i) {
      if (i % bs == 0) {
        fresh[g].push_back(take_block());
      }
      slots[at] = int64_t{old[k[i] / bs]} * bs + k[i] % bs;
      slots[total + at] = int64_t{fresh[g].back()} * bs + static_cast<int64_t>(i % bs);
      ++at;
    }
  }
  peak_used_ = std::max(peak_used_, used_blocks());  // old and new blocks, both held for the copy
  SNAP_RETURN_IF_ERROR(stage(slots));
  kernels::kv_gather_cuda(staging_, staging_ + total, total, shape_.head_dim, k_, v_, pos_, stream_);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return internal_error(cuda_message("kv_gather_cuda", e));
  for (int g = 0; g < nkv; ++g) {
    free_blocks_of(s.tables[layer][g]);  // reusable by later work on the stream
    s.tables[layer][g] = std::move(fresh[g]);
    s.lengths[layer][g] = static_cast<int64_t>(kept[g].size());
  }
  // The new tables are never longer than the old: the room there is suffices.
  return upload_view(s, layer, 0);
}

Result<int32_t> DeviceKvPool::fork(int32_t seq) {
  SNAP_RETURN_IF_ERROR(check_seq(seq, 0));
  const int bs = shape_.block_size, nkv = shape_.num_kv_heads;
  int64_t need = 0, total = 0;
  for (int l = 0; l < shape_.num_layers; ++l)
    for (int g = 0; g < nkv; ++g) {
      need += blocks_for(seqs_[seq].lengths[l][g], bs);
      total += seqs_[seq].lengths[l][g];
    }
  if (need > free_blocks())
    return resource_exhausted("device KV pool: a copy of sequence " + std::to_string(seq) + " needs " +
                              std::to_string(need) + " blocks, " + std::to_string(free_blocks()) + " free");
  Sequence copy;
  copy.live = true;
  copy.lengths = seqs_[seq].lengths;
  copy.appended = seqs_[seq].appended;
  copy.tables.assign(shape_.num_layers, std::vector<std::vector<int32_t>>(nkv));
  copy.view_buf.assign(shape_.num_layers, nullptr);
  copy.table_cap.assign(shape_.num_layers, 0);
  std::vector<int64_t> slots(static_cast<size_t>(2 * total));  // [src..., dst...]
  int64_t at = 0;
  for (int l = 0; l < shape_.num_layers; ++l)
    for (int g = 0; g < nkv; ++g) {
      const std::vector<int32_t>& old = seqs_[seq].tables[l][g];
      std::vector<int32_t>& fresh = copy.tables[l][g];
      for (int64_t j = 0; j < copy.lengths[l][g]; ++j, ++at) {
        if (j % bs == 0) {
          fresh.push_back(take_block());
        }
        slots[at] = int64_t{old[j / bs]} * bs + j % bs;
        slots[total + at] = int64_t{fresh.back()} * bs + j % bs;
      }
    }
  if (total > 0) {
    if (Status st = stage(slots); !st.ok()) {  // nothing kept: the blocks go back
      for (auto& layer : copy.tables)
        for (auto& t : layer) free_blocks_of(t);
      return st;
    }
  }
  peak_used_ = std::max(peak_used_, used_blocks());
  const int32_t id = add_sequence();
  seqs_[id] = std::move(copy);
  if (total > 0) {
    kernels::kv_gather_cuda(staging_, staging_ + total, total, shape_.head_dim, k_, v_, pos_, stream_);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return internal_error(cuda_message("kv_gather_cuda", e));
  }
  Sequence& s = seqs_[id];
  for (int l = 0; l < shape_.num_layers; ++l) {
    int64_t widest = 0;
    for (const auto& t : s.tables[l]) widest = std::max(widest, static_cast<int64_t>(t.size()));
    if (widest > 0) SNAP_RETURN_IF_ERROR(upload_view(s, l, widest));
  }
  return id;
}

int64_t DeviceKvPool::length(int32_t seq, int layer, int g) const { return seqs_.at(seq).lengths.at(layer).at(g); }
int64_t DeviceKvPool::appended(int32_t seq, int layer) const { return seqs_.at(seq).appended.at(layer); }

int64_t DeviceKvPool::slot(int32_t seq, int layer, int g, int64_t j) const {
  const std::vector<int32_t>& t = seqs_.at(seq).tables.at(layer).at(g);
  return int64_t{t.at(static_cast<size_t>(j / shape_.block_size))} * shape_.block_size + j % shape_.block_size;
}

int64_t DeviceKvPool::resident_bytes(int32_t seq) const {
  int64_t blocks = 0;
  for (const auto& layer : seqs_.at(seq).tables)
    for (const auto& t : layer) blocks += static_cast<int64_t>(t.size());
  return blocks * block_bytes();
}

int64_t DeviceKvPool::full_equivalent_bytes(int32_t seq) const {
  int64_t blocks = 0;
  for (int64_t n : seqs_.at(seq).appended) blocks += blocks_for(n, shape_.block_size) * shape_.num_kv_heads;
  return blocks * block_bytes();
}

Status DeviceKvPool::upload_view(Sequence& s, int layer, int64_t min_cap) {
  const int nkv = shape_.num_kv_heads;
  int64_t cap = s.table_cap[layer];
  if (s.view_buf[layer] == nullptr || min_cap > cap) {
    cap = std::max({min_cap, 2 * cap, int64_t{8}});
    cudaStreamSynchronize(stream_);  // queued kernels may still read the old buffer
    cudaFree(s.view_buf[layer]);
    s.view_buf[layer] = nullptr;
    s.table_cap[layer] = 0;
    const size_t bytes = sizeof(kernels::PagedKvHead) * nkv + sizeof(int32_t) * static_cast<size_t>(nkv * cap);
    const cudaError_t e = cudaMalloc(&s.view_buf[layer], bytes);
    if (e != cudaSuccess) return resource_exhausted(cuda_message("block-table view", e));
    s.table_cap[layer] = cap;
  }
  char* dev = static_cast<char*>(s.view_buf[layer]);
  auto* dev_tables = reinterpret_cast<int32_t*>(dev + sizeof(kernels::PagedKvHead) * nkv);
  const size_t bytes = sizeof(kernels::PagedKvHead) * nkv + sizeof(int32_t) * static_cast<size_t>(nkv * cap);
  std::vector<char> host(bytes);
  auto* heads = reinterpret_cast<kernels::PagedKvHead*>(host.data());
  auto* tables = reinterpret_cast<int32_t*>(host.data() + sizeof(kernels::PagedKvHead) * nkv);
  for (int g = 0; g < nkv; ++g) {
    const std::vector<int32_t>& t = s.tables[layer][g];
    std::copy(t.begin(), t.end(), tables + g * cap);
    heads[g].block_table = dev_tables + g * cap;
    heads[g].length = s.lengths[layer][g];
  }
  ++table_uploads_;
  cudaError_t e = cudaMemcpyAsync(dev, host.data(), bytes, cudaMemcpyHostToDevice, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);  // `host` goes out of scope
  return e == cudaSuccess ? Status::ok_status() : internal_error(cuda_message("uploading block tables", e));
}

Result<kernels::PagedKvCuda> DeviceKvPool::view(int32_t seq, int layer) {
  SNAP_RETURN_IF_ERROR(check_seq(seq, layer));
  Sequence& s = seqs_[seq];
  if (s.view_buf[layer] == nullptr) SNAP_RETURN_IF_ERROR(upload_view(s, layer, 0));
  int64_t max_len = 0;
  for (int64_t len : s.lengths[layer]) max_len = std::max(max_len, len);
  kernels::PagedKvCuda v;
  v.k_base = k_;
  v.v_base = v_;
  v.pos_base = pos_;
  v.k_block_stride = v.v_block_stride = int64_t{shape_.block_size} * shape_.head_dim;
  v.pos_block_stride = shape_.block_size;
  v.block_size = shape_.block_size;
  v.heads = static_cast<const kernels::PagedKvHead*>(s.view_buf[layer]);
  v.max_length = max_len;
  return v;
}

}  // namespace snap
