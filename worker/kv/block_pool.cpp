// BlockPool: one page-aligned allocation carved into K, V and position regions of
// fixed-size blocks, a LIFO free list and an in-use bitmap that turns a double free into a
// CHECK failure.
#include "worker/kv/block_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/check.h"
#include "kernels/kv_convert.h"

namespace snap {

namespace {
constexpr int64_t k_page = 4096;  // each region starts on a page
int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
}  // namespace

Result<DType> kv_dtype_from_name(const std::string& name) {
  if (name.empty()) return k_default_kv_dtype;
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "f16") return DType::f16;
  if (name == "q8_0") return DType::q8_0;
  return invalid_argument("KV dtype '" + name + "': expected f32, bf16, f16 or q8_0");
}

void BlockPool::FreeDeleter::operator()(std::byte* p) const { std::free(p); }

Result<std::unique_ptr<BlockPool>> BlockPool::create(const BlockPoolConfig& cfg) {
  if (cfg.block_size <= 0 || cfg.head_dim <= 0)
    return invalid_argument("block_pool: block_size " + std::to_string(cfg.block_size) + " and head_dim " +
                            std::to_string(cfg.head_dim) + " must be positive");
  if (!kernels::kv_dtype_supported(cfg.kv_dtype))
    return invalid_argument(std::string("block_pool: kv_dtype ") + dtype_name(cfg.kv_dtype) +
                            " (f32, bf16, f16 or q8_0)");
  const int64_t kv_region_bytes = int64_t{cfg.block_size} * kernels::kv_row_bytes(cfg.kv_dtype, cfg.head_dim);  // per block
  const int64_t pos_region_bytes = int64_t{cfg.block_size} * 4;
  const int64_t block_bytes = 2 * kv_region_bytes + pos_region_bytes;
  // The page padding between regions (< 12 KiB, never written, so never committed) is not
  // charged to the budget: a pool sized for N blocks holds N blocks.
  const int64_t num_blocks = cfg.capacity_bytes / block_bytes;
  if (num_blocks < 1)
    return invalid_argument("block_pool: capacity " + std::to_string(cfg.capacity_bytes) +
                            " bytes is less than one block of " + std::to_string(block_bytes) + " bytes");
  if (num_blocks > INT32_MAX)
    return invalid_argument("block_pool: capacity " + std::to_string(cfg.capacity_bytes) +
                            " bytes exceeds 2^31 blocks");
  const int64_t v_offset = round_up(num_blocks * kv_region_bytes, k_page);
  const int64_t pos_offset = v_offset + round_up(num_blocks * kv_region_bytes, k_page);
  const int64_t total = round_up(pos_offset + num_blocks * pos_region_bytes, k_page);
  // Not zeroed: pages are committed by the OS when a block is first written.
  void* data = std::aligned_alloc(k_page, static_cast<size_t>(total));
  if (data == nullptr)
    return resource_exhausted("block_pool: cannot allocate " + std::to_string(total) + " bytes for the KV block pool");
  return std::unique_ptr<BlockPool>(
      new BlockPool(cfg, block_bytes, num_blocks, v_offset, pos_offset, static_cast<std::byte*>(data)));
}

BlockPool::BlockPool(const BlockPoolConfig& cfg, int64_t block_bytes, int64_t num_blocks, int64_t v_offset,
                     int64_t pos_offset, std::byte* data)
    : cfg_(cfg),
      row_bytes_(kernels::kv_row_bytes(cfg.kv_dtype, cfg.head_dim)),
      block_bytes_(block_bytes),
      num_blocks_(num_blocks),
      v_offset_(v_offset),
      pos_offset_(pos_offset),
      data_(data),
      in_use_(static_cast<size_t>(num_blocks), 0) {
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t id = num_blocks - 1; id >= 0; --id) free_.push_back(static_cast<int32_t>(id));  // 0 first
}

Result<int32_t> BlockPool::alloc() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty())
    return resource_exhausted("KV block pool exhausted: " + std::to_string(num_blocks_) + " blocks of " +
                              std::to_string(block_bytes_) + " bytes in use");
  const int32_t id = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(id)] = 1;
  peak_used_ = std::max(peak_used_, num_blocks_ - static_cast<int64_t>(free_.size()));
  return id;
}

void BlockPool::free(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(id >= 0 && id < num_blocks_) << "block_pool: free of block " << id << " outside [0, " << num_blocks_ << ")";
  CHECK(in_use_[static_cast<size_t>(id)]) << "block_pool: double free of block " << id;
  in_use_[static_cast<size_t>(id)] = 0;
  free_.push_back(id);
}

int64_t BlockPool::num_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

int64_t BlockPool::peak_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_used_;
}

int64_t BlockPool::stored_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_bytes_;
}

int64_t BlockPool::full_equivalent_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return full_equivalent_bytes_;
}

void BlockPool::add_accounting(int64_t stored_delta, int64_t full_equivalent_delta) {
  std::lock_guard<std::mutex> lock(mu_);
  stored_bytes_ += stored_delta;
  full_equivalent_bytes_ += full_equivalent_delta;
  CHECK(stored_bytes_ >= 0 && full_equivalent_bytes_ >= 0) << "block_pool: accounting went negative";
}

}  // namespace snap
