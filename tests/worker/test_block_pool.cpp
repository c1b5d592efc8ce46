// BlockPool: config validation, block size and count from the byte budget (f32, bf16, f16), distinct and
// non-overlapping blocks in page-aligned regions, LIFO reuse after fragmentation without growth, the peak, the
// exhaustion Status and its message, free-all, double free caught, concurrent alloc/free.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "worker/kv/block_pool.h"

namespace snap {
namespace {

std::unique_ptr<BlockPool> make_pool(int block_size, int head_dim, int64_t num_blocks_wanted) {
  BlockPoolConfig cfg{block_size, head_dim, DType::f32, 0};
  cfg.capacity_bytes = (2LL * block_size * head_dim * 4 + int64_t{block_size} * 4) * num_blocks_wanted;
  auto pool = BlockPool::create(cfg);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(pool).value();
}

TEST(BlockPool, RejectsBadConfig) {
  EXPECT_EQ(BlockPool::create({0, 64, DType::f32, 1 << 20}).status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(BlockPool::create({16, 0, DType::f32, 1 << 20}).status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(BlockPool::create({16, 64, DType::f32, 100}).status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(BlockPool::create({16, 64, DType::q4_1, 1 << 20}).status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(BlockPool::create({16, 64, DType::q4_0, 1 << 20}).status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(kv_dtype_from_name("bf16").value(), DType::bf16);
  EXPECT_EQ(kv_dtype_from_name("f16").value(), DType::f16);
  EXPECT_EQ(kv_dtype_from_name("f32").value(), DType::f32);
  EXPECT_EQ(kv_dtype_from_name("").value(), k_default_kv_dtype);
  EXPECT_EQ(kv_dtype_from_name("q8_0").value(), DType::q8_0);
  const auto bad = kv_dtype_from_name("q4_0");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "KV dtype 'q4_0': expected f32, bf16, f16 or q8_0");
}

TEST(BlockPool, SizesBlocksFromTheByteBudget) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::q8_0}) {
    for (int block_size : {1, 16, 32}) {
      for (int head_dim : {36, 64, 80, 128}) {
        const int64_t capacity = 1000000;
        auto pool = BlockPool::create({block_size, head_dim, dtype, capacity});
        ASSERT_TRUE(pool.ok()) << pool.status().to_string();
        // q8_0: int8 values + one f16 scale per 32 (36 → 40, 64 → 68, 80 → 86, 128 → 136).
        const int64_t row = dtype == DType::q8_0 ? head_dim + 2 * ((head_dim + 31) / 32)
                                                 : int64_t{head_dim} * (dtype == DType::f32 ? 4 : 2);
        const int64_t bb = 2LL * block_size * row + int64_t{block_size} * 4;  // K + V + positions
        EXPECT_EQ((*pool)->row_bytes(), row);
        EXPECT_EQ((*pool)->block_bytes(), bb);
        EXPECT_EQ((*pool)->num_blocks(), capacity / bb);
        EXPECT_EQ((*pool)->num_free(), (*pool)->num_blocks());
        EXPECT_EQ((*pool)->num_used(), 0);
      }
    }
  }
}

TEST(BlockPool, BlocksAreDistinctAlignedAndDoNotOverlap) {
  const int bs = 16, hd = 36;
  auto pool = make_pool(bs, hd, 20);
  ASSERT_EQ(pool->num_blocks(), 20);
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) {
    auto id = pool->alloc();
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()).size(), 20u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->k_base()) % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->v_base()) % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->pos_base()) % 4096, 0u);
  for (int32_t id : ids) {
    for (int i = 0; i < bs * hd; ++i) {
      reinterpret_cast<float*>(pool->k(id))[i] = static_cast<float>(id * 100000 + i);
      reinterpret_cast<float*>(pool->v(id))[i] = static_cast<float>(-id * 100000 - i);
    }
    for (int s = 0; s < bs; ++s) pool->positions(id)[s] = id * 1000 + s;
  }
  for (int32_t id : ids) {
    for (int i = 0; i < bs * hd; ++i) {
      ASSERT_EQ(reinterpret_cast<float*>(pool->k(id))[i], static_cast<float>(id * 100000 + i))
          << "block " << id << " k[" << i << "]";
      ASSERT_EQ(reinterpret_cast<float*>(pool->v(id))[i], static_cast<float>(-id * 100000 - i))
          << "block " << id << " v[" << i << "]";
    }
    for (int s = 0; s < bs; ++s) ASSERT_EQ(pool->positions(id)[s], id * 1000 + s) << "block " << id;
  }
}

TEST(BlockPool, FragmentationReusesExactlyTheFreedIds) {
  auto pool = make_pool(16, 64, 64);
  const int64_t n = pool->num_blocks();
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(pool->alloc().value());
  std::set<int32_t> freed;
  for (size_t i = 0; i < ids.size(); i += 2) {
    pool->free(ids[i]);
    freed.insert(ids[i]);
  }
  EXPECT_EQ(pool->num_free(), static_cast<int64_t>(freed.size()));
  std::set<int32_t> again;
  for (size_t i = 0; i < freed.size(); ++i) {
    auto id = pool->alloc();
    ASSERT_TRUE(id.ok()) << id.status().to_string();
    again.insert(*id);
  }
  EXPECT_EQ(again, freed);
  EXPECT_EQ(pool->num_blocks(), n);  // no growth
  EXPECT_EQ(pool->num_free(), 0);
  EXPECT_FALSE(pool->alloc().ok());
}

TEST(BlockPool, PeakUsedIsTheHighWaterMark) {
  auto pool = make_pool(16, 64, 8);
  EXPECT_EQ(pool->peak_used(), 0);
  std::vector<int32_t> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(pool->alloc().value());
  for (int i = 0; i < 4; ++i) pool->free(ids[i]);
  ASSERT_TRUE(pool->alloc().ok());
  EXPECT_EQ(pool->num_used(), 2);
  EXPECT_EQ(pool->peak_used(), 5);
}

TEST(BlockPool, LifoHandsOutTheMostRecentlyFreedBlock) {
  auto pool = make_pool(16, 64, 8);
  const int32_t a = pool->alloc().value(), b = pool->alloc().value();
  pool->free(a);
  pool->free(b);
  EXPECT_EQ(pool->alloc().value(), b);
  EXPECT_EQ(pool->alloc().value(), a);
}

TEST(BlockPool, ExhaustionIsAStatusWithOneLineMessage) {
  auto pool = make_pool(16, 64, 5);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool->alloc().ok());
  const Result<int32_t> r = pool->alloc();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::k_resource_exhausted);
  EXPECT_EQ(r.status().message(),
            "KV block pool exhausted: 5 blocks of " + std::to_string(pool->block_bytes()) + " bytes in use");
  EXPECT_EQ(pool->num_used(), 5);
}

TEST(BlockPool, FreeAllReturnsEveryBlock) {
  auto pool = make_pool(16, 64, 33);
  std::vector<int32_t> ids;
  while (true) {
    auto id = pool->alloc();
    if (!id.ok()) break;
    ids.push_back(*id);
  }
  EXPECT_EQ(static_cast<int64_t>(ids.size()), pool->num_blocks());
  EXPECT_EQ(pool->resident_bytes(), pool->num_blocks() * pool->block_bytes());
  for (int32_t id : ids) pool->free(id);
  EXPECT_EQ(pool->num_free(), pool->num_blocks());
  EXPECT_EQ(pool->resident_bytes(), 0);
  for (int64_t i = 0; i < pool->num_blocks(); ++i) EXPECT_TRUE(pool->alloc().ok());
}

TEST(BlockPoolDeathTest, DoubleFreeIsCaught) {
  auto pool = make_pool(16, 64, 4);
  const int32_t id = pool->alloc().value();
  pool->free(id);
  EXPECT_DEATH(pool->free(id), "double free of block");
  EXPECT_DEATH(pool->free(99), "outside");
}

TEST(BlockPool, ConcurrentAllocAndFreeKeepCounts) {
  auto pool = make_pool(16, 64, 64);
  auto work = [&] {
    for (int round = 0; round < 2000; ++round) {
      std::vector<int32_t> mine;
      for (int i = 0; i < 8; ++i) mine.push_back(pool->alloc().value());
      for (int32_t id : mine) pool->free(id);
    }
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  EXPECT_EQ(pool->num_free(), pool->num_blocks());
}

}  // namespace
}  // namespace snap
