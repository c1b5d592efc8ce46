// The device KV block pool (worker/device/device_kv_pool.h) on a GPU: appends in awkward
// chunks land bit-exactly (bf16 of the f32 rows, positions) in the slots the host tables
// name; the pool's view drives attention_paged_cuda to the CPU reference's output;
// compaction keeps exactly the listed entries in order and frees exactly the blocks it no
// longer needs; resident/full-equivalent bytes are exact; running out of blocks or bad lists
// are refused with one-line errors and change nothing; the device view stays equal to the host
// tables through appends that edit it in place, capacity growth and compaction, and decode-sized
// appends upload no view (no wait for the GPU); a fork (n > 1) copies every head into fresh
// blocks, independent of its source from then on. Exits 77 without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/attention_paged.h"
#include "tests/kernels/kernel_test_util.h"
#include "worker/device/device_kv_pool.h"

namespace snap {
namespace {

constexpr int k_layers = 2, k_kv_heads = 3, k_head_dim = 64, k_block = 16, k_heads = 6;

template <typename T>
std::vector<T> download(const T* p, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
template <typename T>
T* upload(const std::vector<T>& h) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

// What the cache should hold: per (layer, head) the bf16 K/V rows and positions, in order.
struct Expected {
  std::vector<uint16_t> k, v;  // [n][head_dim]
  std::vector<int32_t> pos;
};

class DeviceKvPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    DeviceKvShape shape{k_layers, k_kv_heads, k_head_dim, k_block};
    const int64_t block_bytes = int64_t{k_block} * (2 * k_head_dim * 2 + 4);
    auto p = DeviceKvPool::create(shape, 100 * block_bytes + 5, stream_);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    pool_ = std::move(*p);
    expected_.assign(k_layers, std::vector<Expected>(k_kv_heads));
  }
  void TearDown() override {
    pool_.reset();
    cudaStreamDestroy(stream_);
  }

  // Appends n tokens at positions first..first+n−1 to (seq, layer), recording the expectation.
  Status append(int32_t seq, int layer, int64_t n, int32_t first, uint32_t seed) {
    const auto k = kernels::test::random_floats(n * k_kv_heads * k_head_dim, seed, -2.0f, 2.0f);
    const auto v = kernels::test::random_floats(n * k_kv_heads * k_head_dim, seed + 1, -2.0f, 2.0f);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) pos[t] = first + static_cast<int32_t>(t);
    float* dk = upload(k);
    float* dv = upload(v);
    int32_t* dp = upload(pos);
    const Status st = pool_->append(seq, layer, dk, dv, dp, n);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dp);
    if (st.ok() && seq == 0) {
      for (int64_t t = 0; t < n; ++t)
        for (int g = 0; g < k_kv_heads; ++g) {
          Expected& e = expected_[layer][g];
          for (int d = 0; d < k_head_dim; ++d) {
            e.k.push_back(f32_to_bf16(k[(t * k_kv_heads + g) * k_head_dim + d]));
            e.v.push_back(f32_to_bf16(v[(t * k_kv_heads + g) * k_head_dim + d]));
          }
          e.pos.push_back(pos[t]);
        }
    }
    return st;
  }

  // Every entry of `seq` read back through the host tables equals the expectation (seq 0's).
  void expect_contents(int32_t seq = 0) {
    const size_t slots = static_cast<size_t>(pool_->num_blocks()) * k_block;
    const auto k = download(reinterpret_cast<const uint16_t*>(pool_->k_slab()), slots * k_head_dim);
    const auto v = download(reinterpret_cast<const uint16_t*>(pool_->v_slab()), slots * k_head_dim);
    const auto pos = download(pool_->pos_slab(), slots);
    for (int l = 0; l < k_layers; ++l)
      for (int g = 0; g < k_kv_heads; ++g) {
        const Expected& e = expected_[l][g];
        ASSERT_EQ(pool_->length(seq, l, g), static_cast<int64_t>(e.pos.size())) << "layer " << l << " head " << g;
        for (size_t j = 0; j < e.pos.size(); ++j) {
          const int64_t s = pool_->slot(seq, l, g, static_cast<int64_t>(j));
          ASSERT_EQ(pos[s], e.pos[j]) << "layer " << l << " head " << g << " entry " << j;
          for (int d = 0; d < k_head_dim; ++d) {
            ASSERT_EQ(k[s * k_head_dim + d], e.k[j * k_head_dim + d]) << "K layer " << l << " head " << g << " entry " << j;
            ASSERT_EQ(v[s * k_head_dim + d], e.v[j * k_head_dim + d]) << "V layer " << l << " head " << g << " entry " << j;
          }
        }
      }
  }

  // attention_paged_cuda through the pool's view equals attention_paged_ref on the expectation.
  void expect_attention(int layer) {
    auto view = pool_->view(0, layer);
    ASSERT_TRUE(view.ok()) << view.status().to_string();
    // The reference reads the expectation as a paged cache of f32 with one block per entry.
    std::vector<float> kf, vf;
    std::vector<int32_t> pf;
    std::vector<std::vector<int32_t>> tables(k_kv_heads);
    std::vector<kernels::PagedKvHead> heads;
    int32_t max_pos = 0;
    for (int g = 0; g < k_kv_heads; ++g) {
      const Expected& e = expected_[layer][g];
      for (size_t j = 0; j < e.pos.size(); ++j) {
        tables[g].push_back(static_cast<int32_t>(pf.size()));
        for (int d = 0; d < k_head_dim; ++d) {
          kf.push_back(bf16_to_f32(e.k[j * k_head_dim + d]));
          vf.push_back(bf16_to_f32(e.v[j * k_head_dim + d]));
        }
        pf.push_back(e.pos[j]);
        max_pos = std::max(max_pos, e.pos[j]);
      }
    }
    for (int g = 0; g < k_kv_heads; ++g) heads.push_back({tables[g].data(), static_cast<int64_t>(tables[g].size())});
    kernels::PagedKv ref;
    ref.k_base = kf.data();
    ref.v_base = vf.data();
    ref.pos_base = pf.data();
    ref.k_block_stride = ref.v_block_stride = k_head_dim;
    ref.pos_block_stride = 1;
    ref.block_size = 1;
    ref.heads = heads.data();
    kernels::AttentionParams p{k_heads, k_kv_heads, k_head_dim, 0.125f, 0};
    for (int64_t n : {1, 9}) {
      std::vector<int32_t> qpos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) qpos[i] = max_pos - static_cast<int32_t>(n - 1 - i) + (n == 1 ? 1 : 0);
      const auto q = kernels::test::random_floats(n * k_heads * k_head_dim, 77, -2.0f, 2.0f);
      std::vector<float> want(q.size());
      kernels::attention_paged_ref(q.data(), qpos.data(), n, ref, p, want.data());
      float* dq = upload(q);
      int32_t* dp = upload(qpos);
      float* dout = upload(std::vector<float>(q.size()));
      const size_t ws_bytes = kernels::attention_paged_cuda_workspace_bytes(n, p, view->max_length);
      char* ws = upload(std::vector<char>(std::max<size_t>(ws_bytes, 1)));
      ASSERT_EQ(kernels::attention_paged_cuda(dq, dp, n, *view, p, dout, ws, ws_bytes, stream_), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const auto got = download(dout, q.size());
      EXPECT_TRUE(kernels::test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-4))
          << "layer " << layer << ", " << n << " queries";
      cudaFree(dq);
      cudaFree(dp);
      cudaFree(dout);
      cudaFree(ws);
    }
  }

  // Compacts (seq, layer) to `kept` and the expectation of seq 0 with it.
  void compact(int32_t seq, int layer, const std::vector<std::vector<int32_t>>& kept) {
    ASSERT_TRUE(pool_->compact(seq, layer, kept).ok());
    for (int g = 0; g < k_kv_heads; ++g) {
      Expected& e = expected_[layer][g];
      Expected c;
      for (int32_t j : kept[g]) {
        c.k.insert(c.k.end(), e.k.begin() + j * k_head_dim, e.k.begin() + (j + 1) * k_head_dim);
        c.v.insert(c.v.end(), e.v.begin() + j * k_head_dim, e.v.begin() + (j + 1) * k_head_dim);
        c.pos.push_back(e.pos[j]);
      }
      e = std::move(c);
    }
  }

  // The device view of (seq, layer), read back, names the blocks and lengths the host holds.
  void expect_view_is_host(int32_t seq, int layer) {
    auto view = pool_->view(seq, layer);
    ASSERT_TRUE(view.ok()) << view.status().to_string();
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const auto heads = download(view->heads, k_kv_heads);
    int64_t max_len = 0;
    for (int g = 0; g < k_kv_heads; ++g) {
      const int64_t len = pool_->length(seq, layer, g);
      max_len = std::max(max_len, len);
      ASSERT_EQ(heads[g].length, len) << "seq " << seq << " layer " << layer << " head " << g;
      const auto table = download(heads[g].block_table, static_cast<size_t>((len + k_block - 1) / k_block));
      for (int64_t j = 0; j < len; j += k_block)
        ASSERT_EQ(int64_t{table[j / k_block]} * k_block, pool_->slot(seq, layer, g, j))
            << "seq " << seq << " layer " << layer << " head " << g << " block " << j / k_block;
    }
    EXPECT_EQ(view->max_length, max_len);
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceKvPool> pool_;
  std::vector<std::vector<Expected>> expected_;  // [layer][g]
};

TEST_F(DeviceKvPoolTest, AppendViewCompactAccount) {
  ASSERT_EQ(pool_->num_blocks(), 100);
  const int32_t seq = pool_->add_sequence();
  ASSERT_EQ(seq, 0);
  int32_t first = 0;
  for (int64_t n : {1, 17, 5, 40}) {  // 63 tokens: 4 blocks per (layer, head)
    for (int l = 0; l < k_layers; ++l) ASSERT_TRUE(append(seq, l, n, first, static_cast<uint32_t>(first * 10 + l)).ok());
    first += static_cast<int32_t>(n);
  }
  const int64_t bb = pool_->block_bytes();
  EXPECT_EQ(pool_->used_blocks(), k_layers * k_kv_heads * 4);
  EXPECT_EQ(pool_->resident_bytes(seq), k_layers * k_kv_heads * 4 * bb);
  EXPECT_EQ(pool_->full_equivalent_bytes(seq), k_layers * k_kv_heads * 4 * bb);
  expect_contents();
  expect_attention(0);
  expect_attention(1);

  // Compaction of layer 0: head 0 keeps 10 scattered entries, head 1 all 63, head 2 none.
  std::mt19937 gen(3);
  std::vector<int32_t> all(63);
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> some = all;
  std::shuffle(some.begin(), some.end(), gen);
  some.resize(10);
  std::sort(some.begin(), some.end());
  const std::vector<std::vector<int32_t>> kept{some, all, {}};
  compact(seq, 0, kept);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(pool_->used_blocks(), (1 + 4 + 0) + k_kv_heads * 4) << "compaction must free the blocks it emptied";
  EXPECT_EQ(pool_->resident_bytes(seq), ((1 + 4 + 0) + k_kv_heads * 4) * bb);
  EXPECT_EQ(pool_->full_equivalent_bytes(seq), k_layers * k_kv_heads * 4 * bb) << "the uncompressed size stays";
  expect_contents();
  expect_attention(0);

  // Decode after compaction continues each head at its own length.
  ASSERT_TRUE(append(seq, 0, 3, 63, 999).ok());
  expect_contents();
  expect_attention(0);

  // Refusals change nothing.
  const int64_t used = pool_->used_blocks();
  const int32_t other = pool_->add_sequence();
  const Status big = append(other, 0, 10000, 0, 5);
  EXPECT_EQ(big.code(), StatusCode::k_resource_exhausted);
  EXPECT_NE(big.message().find("blocks"), std::string::npos) << big.message();
  EXPECT_EQ(pool_->used_blocks(), used);
  const Status bad = pool_->compact(seq, 1, {{5, 3}, {}, {}});
  EXPECT_EQ(bad.code(), StatusCode::k_invalid_argument);
  EXPECT_NE(bad.message().find("out of order"), std::string::npos) << bad.message();
  EXPECT_EQ(pool_->compact(seq, 1, {{}, {}}).code(), StatusCode::k_invalid_argument);
  expect_contents();

  ASSERT_TRUE(pool_->release(seq).ok());
  ASSERT_TRUE(pool_->release(other).ok());
  EXPECT_EQ(pool_->used_blocks(), 0);
  EXPECT_EQ(pool_->append(seq, 0, nullptr, nullptr, nullptr, 1).code(), StatusCode::k_invalid_argument);
}

// n > 1: a fork holds a copy of every layer and head (compacted heads of different lengths
// included) in fresh blocks, its device views name them, the accounting is the source's; the
// two grow apart without touching each other; a fork that does not fit is refused and changes
// nothing.
TEST_F(DeviceKvPoolTest, ForkCopiesEveryHeadIntoFreshBlocks) {
  const int32_t seq = pool_->add_sequence();
  ASSERT_EQ(seq, 0);
  for (int l = 0; l < k_layers; ++l) ASSERT_TRUE(append(seq, l, 37, 0, static_cast<uint32_t>(40 + l)).ok());
  std::vector<int32_t> some{0, 3, 4, 15, 16, 17, 30, 36};
  std::vector<int32_t> all(37);
  std::iota(all.begin(), all.end(), 0);
  compact(seq, 1, {some, {}, all});  // layer 1: heads of 8, 0 and 37 entries
  ASSERT_TRUE(append(seq, 1, 2, 37, 77).ok());
  const int64_t used = pool_->used_blocks();
  auto fork = pool_->fork(seq);
  ASSERT_TRUE(fork.ok()) << fork.status().to_string();
  ASSERT_NE(*fork, seq);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(pool_->used_blocks(), 2 * used);
  EXPECT_EQ(pool_->resident_bytes(*fork), pool_->resident_bytes(seq));
  EXPECT_EQ(pool_->full_equivalent_bytes(*fork), pool_->full_equivalent_bytes(seq));
  for (int l = 0; l < k_layers; ++l) {
    EXPECT_EQ(pool_->appended(*fork, l), pool_->appended(seq, l));
    for (int g = 0; g < k_kv_heads; ++g) {
      if (pool_->length(seq, l, g) > 0) {
        EXPECT_NE(pool_->slot(*fork, l, g, 0) / k_block, pool_->slot(seq, l, g, 0) / k_block);
      }
    }
    expect_view_is_host(*fork, l);
  }
  expect_contents(*fork);
  expect_contents(seq);

  // They grow apart: the fork's appends (not recorded) leave the source as it was.
  ASSERT_TRUE(append(*fork, 0, 20, 37, 5).ok());
  ASSERT_TRUE(append(*fork, 1, 1, 39, 6).ok());
  expect_contents(seq);
  expect_attention(0);
  expect_attention(1);
  // Released, the source takes nothing of the fork with it; a released sequence: refused.
  ASSERT_TRUE(pool_->release(*fork).ok());
  EXPECT_EQ(pool_->used_blocks(), used);
  expect_contents(seq);
  EXPECT_EQ(pool_->fork(*fork).status().code(), StatusCode::k_invalid_argument);

  // Too few free blocks: refused, nothing allocated.
  const int32_t big = pool_->add_sequence();
  EXPECT_EQ(big, *fork) << "the released id is opened again";
  const int64_t take = (100 - used - (used - k_kv_heads)) / k_kv_heads;  // 16-token rows of 3 blocks each
  ASSERT_TRUE(append(big, 0, 16 * take, 0, 9).ok());
  ASSERT_LT(pool_->free_blocks(), used);
  const int64_t before = pool_->used_blocks();
  auto refused = pool_->fork(seq);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::k_resource_exhausted);
  EXPECT_NE(refused.status().message().find("blocks"), std::string::npos) << refused.status().message();
  EXPECT_EQ(pool_->used_blocks(), before);
  expect_contents(seq);
}

// Reuse: blocks are taken lowest id first whatever order they were freed in (so that which
// blocks a request gets depends only on which are free), and add_sequence opens the lowest id
// not open, so a long-running server holds as many sequence slots as it ever had open at once.
TEST_F(DeviceKvPoolTest, ReleasedBlocksAndSequencesAreReusedLowestFirst) {
  const auto blocks_of = [&](int32_t s, int layer) {  // every block of (s, layer), head by head
    std::vector<int64_t> b;
    for (int g = 0; g < k_kv_heads; ++g)
      for (int64_t j = 0; j < pool_->length(s, layer, g); j += k_block) b.push_back(pool_->slot(s, layer, g, j) / k_block);
    return b;
  };
  // Three sequences of 2 blocks per head in layer 0: blocks 0-5, 6-11, 12-17, in head order.
  std::vector<int32_t> seqs;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(pool_->add_sequence());
    EXPECT_EQ(seqs.back(), i);
    ASSERT_TRUE(append(seqs.back(), 0, 2 * k_block, 0, static_cast<uint32_t>(i)).ok());
    const std::vector<int64_t> want{6 * i, 6 * i + 1, 6 * i + 2, 6 * i + 3, 6 * i + 4, 6 * i + 5};
    EXPECT_EQ(blocks_of(seqs.back(), 0), want);
  }
  // Freed in the order 2 then 0: the next request takes 0-5 first, then 12-17, then 18 on.
  ASSERT_TRUE(pool_->release(seqs[2]).ok());
  ASSERT_TRUE(pool_->release(seqs[0]).ok());
  expected_.assign(k_layers, std::vector<Expected>(k_kv_heads));  // id 0's contents, from here on
  const int32_t again = pool_->add_sequence();
  EXPECT_EQ(again, 0) << "the lowest released id";
  EXPECT_EQ(pool_->add_sequence(), 2);
  EXPECT_EQ(pool_->add_sequence(), 3) << "no id free below: a new one";
  ASSERT_TRUE(append(again, 0, 5 * k_block, 0, 9).ok());  // 15 blocks
  std::vector<int64_t> got = blocks_of(again, 0);
  std::sort(got.begin(), got.end());
  std::vector<int64_t> want{0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  EXPECT_EQ(got, want);
  // Compaction frees the old blocks; the copies took the lowest free ones first.
  const int64_t used = pool_->used_blocks();
  compact(again, 0, {{0, 1, 2}, {}, {70, 71}});
  EXPECT_EQ(pool_->used_blocks(), used - 15 + 2);
  EXPECT_EQ(pool_->slot(again, 0, 0, 0) / k_block, 21);
  EXPECT_EQ(pool_->slot(again, 0, 2, 0) / k_block, 22);
  // Many requests through one slot: the same id each time, every block back.
  ASSERT_TRUE(pool_->release(3).ok());
  ASSERT_TRUE(pool_->release(2).ok());
  const int64_t before = pool_->used_blocks();
  for (int r = 0; r < 200; ++r) {
    const int32_t s = pool_->add_sequence();
    ASSERT_EQ(s, 2) << "request " << r;
    ASSERT_TRUE(append(s, r % k_layers, 1 + r % 40, 0, static_cast<uint32_t>(r)).ok());
    ASSERT_TRUE(pool_->release(s).ok());
    ASSERT_FALSE(pool_->is_open(s));
  }
  EXPECT_EQ(pool_->used_blocks(), before);
  EXPECT_TRUE(pool_->is_open(again));
  EXPECT_TRUE(pool_->is_open(seqs[1]));
  expect_view_is_host(again, 0);
  expect_view_is_host(seqs[1], 0);
  expect_contents(again);
}

// Decode: one token at a time edits the resident view in place — no upload, no wait — until a
// head outgrows the view's room (which doubles); two sequences interleave without disturbing
// each other; compaction uploads once and later appends edit again, also in more edits than
// one launch carries.
TEST_F(DeviceKvPoolTest, DecodeAppendsEditTheResidentView) {
  {
    auto p = DeviceKvPool::create(DeviceKvShape{k_layers, k_kv_heads, k_head_dim, k_block},
                                  400 * pool_->block_bytes(), stream_);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    pool_ = std::move(*p);
  }
  const int32_t seq = pool_->add_sequence();
  const int32_t other = pool_->add_sequence();
  ASSERT_TRUE(append(seq, 0, 5, 0, 1).ok());  // the layer's first: uploads its view
  ASSERT_TRUE(append(other, 0, 3, 0, 2).ok());
  const int64_t after_first = pool_->table_uploads();
  EXPECT_EQ(after_first, 2);
  int64_t growths = 0, room = 8;  // the first view has room for 8 blocks per head
  for (int32_t t = 5; t < 5 + 9 * k_block; ++t) {  // 149 tokens: 10 blocks, one growth (8 -> 16)
    ASSERT_TRUE(append(seq, 0, 1, t, static_cast<uint32_t>(100 + t)).ok());
    if ((t + 1 + k_block - 1) / k_block > room) {
      ++growths;
      room *= 2;
    }
    ASSERT_EQ(pool_->table_uploads(), after_first + growths) << "token " << t;
    if (t % 7 == 0) {
      ASSERT_TRUE(append(other, 0, 1, 3 + t / 7, static_cast<uint32_t>(t)).ok());
    }
    if (t % 23 == 0) expect_view_is_host(seq, 0);
  }
  EXPECT_EQ(growths, 1);
  EXPECT_EQ(pool_->table_uploads(), after_first + 1);
  expect_view_is_host(seq, 0);
  expect_view_is_host(other, 0);
  expect_contents();
  expect_attention(0);

  // Compaction: one upload; the appends after it edit the new tables.
  std::vector<std::vector<int32_t>> kept(k_kv_heads);
  for (int g = 0; g < k_kv_heads; ++g)
    for (int32_t j = g; j < pool_->length(seq, 0, g); j += 3 + g) kept[g].push_back(j);
  compact(seq, 0, kept);
  const int64_t after_compact = pool_->table_uploads();
  EXPECT_EQ(after_compact, after_first + 2);
  expect_view_is_host(seq, 0);
  for (int32_t t = 149; t < 149 + 40; ++t) ASSERT_TRUE(append(seq, 0, 1, t, static_cast<uint32_t>(t)).ok());
  EXPECT_EQ(pool_->table_uploads(), after_compact);
  expect_view_is_host(seq, 0);
  expect_contents();
  expect_attention(0);

  // Layer 1: a prompt of 1300 tokens (82 blocks per head, uploaded), compacted to every 50th
  // entry (2 blocks per head), then a chunk of 1280 more: 80 new blocks per head, 243 edits in
  // the room the prompt left, so two launches of edits and no upload.
  ASSERT_TRUE(append(seq, 1, 1300, 0, 7).ok());
  kept.assign(k_kv_heads, {});
  for (int g = 0; g < k_kv_heads; ++g)
    for (int32_t j = g; j < 1300; j += 50) kept[g].push_back(j);
  compact(seq, 1, kept);
  const int64_t before_chunk = pool_->table_uploads();
  ASSERT_TRUE(append(seq, 1, 1280, 1300, 8).ok());
  EXPECT_EQ(pool_->table_uploads(), before_chunk);
  expect_view_is_host(seq, 1);
  expect_contents();
  expect_attention(1);
}

// A continuous-batching step: append_rows puts one row into each of 50 sequences in as few
// launches as the arguments hold (150 slots: two), and leaves the cache and the views exactly as
// one append per sequence does on a twin of each sequence: the same lengths, bf16 rows and
// positions, views equal to the host tables, and the same uploads (row 0 outgrows its view's
// room of 8 blocks per head once). Refusals (a duplicate, a closed sequence, too few blocks)
// change nothing.
TEST_F(DeviceKvPoolTest, AppendRowsIsAppendPerSequence) {
  {
    auto p = DeviceKvPool::create(DeviceKvShape{k_layers, k_kv_heads, k_head_dim, k_block},
                                  2000 * pool_->block_bytes(), stream_);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    pool_ = std::move(*p);
  }
  constexpr int n = 50, steps = 40;
  std::vector<int32_t> rows(n), twins(n), next(n);
  for (int b = 0; b < n; ++b) {
    rows[b] = pool_->add_sequence();
    twins[b] = pool_->add_sequence();
    // Prompts of 1..40 tokens; row 0's 128 fill its first view's room exactly.
    const int64_t prompt = b == 0 ? 128 : (b * 7) % 40 + 1;
    for (int32_t s : {rows[b], twins[b]}) ASSERT_TRUE(append(s, 0, prompt, 0, static_cast<uint32_t>(b)).ok());
    next[b] = static_cast<int32_t>(prompt);
  }
  const int64_t uploads0 = pool_->table_uploads();
  for (int step = 0; step < steps; ++step) {
    const auto k = kernels::test::random_floats(int64_t{n} * k_kv_heads * k_head_dim, 500 + step, -2.0f, 2.0f);
    const auto v = kernels::test::random_floats(int64_t{n} * k_kv_heads * k_head_dim, 900 + step, -2.0f, 2.0f);
    float* dk = upload(k);
    float* dv = upload(v);
    int32_t* dp = upload(next);
    const int64_t before = pool_->table_uploads();
    ASSERT_TRUE(pool_->append_rows(rows.data(), n, 0, dk, dv, dp).ok()) << "step " << step;
    const int64_t by_rows = pool_->table_uploads() - before;
    for (int b = 0; b < n; ++b) {
      const int64_t off = int64_t{b} * k_kv_heads * k_head_dim;
      ASSERT_TRUE(pool_->append(twins[b], 0, dk + off, dv + off, dp + b, 1).ok()) << "step " << step << " twin " << b;
    }
    EXPECT_EQ(pool_->table_uploads() - before, 2 * by_rows) << "step " << step;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dp);
    for (int b = 0; b < n; ++b) ++next[b];
  }
  EXPECT_EQ(pool_->table_uploads() - uploads0, 2) << "row 0 (and its twin) outgrew the room once";
  const size_t slots = static_cast<size_t>(pool_->num_blocks()) * k_block;
  const auto ks = download(reinterpret_cast<const uint16_t*>(pool_->k_slab()), slots * k_head_dim);
  const auto vs = download(reinterpret_cast<const uint16_t*>(pool_->v_slab()), slots * k_head_dim);
  const auto ps = download(pool_->pos_slab(), slots);
  for (int b = 0; b < n; ++b) {
    expect_view_is_host(rows[b], 0);
    for (int g = 0; g < k_kv_heads; ++g) {
      ASSERT_EQ(pool_->length(rows[b], 0, g), pool_->length(twins[b], 0, g));
      ASSERT_EQ(pool_->length(rows[b], 0, g), next[b]);
      for (int64_t j = 0; j < next[b]; ++j) {
        const int64_t a = pool_->slot(rows[b], 0, g, j), t = pool_->slot(twins[b], 0, g, j);
        ASSERT_EQ(ps[a], ps[t]) << "row " << b << " head " << g << " entry " << j;
        for (int d = 0; d < k_head_dim; ++d) {
          ASSERT_EQ(ks[a * k_head_dim + d], ks[t * k_head_dim + d]) << "K row " << b << " head " << g << " entry " << j;
          ASSERT_EQ(vs[a * k_head_dim + d], vs[t * k_head_dim + d]) << "V row " << b << " head " << g << " entry " << j;
        }
      }
    }
  }
  // Refusals: a sequence twice, a closed one, more blocks than are free.
  const int64_t used = pool_->used_blocks();
  const int32_t dup[2] = {rows[1], rows[1]};
  EXPECT_EQ(pool_->append_rows(dup, 2, 0, nullptr, nullptr, nullptr).code(), StatusCode::k_invalid_argument);
  const int32_t closed[1] = {9999};
  EXPECT_EQ(pool_->append_rows(closed, 1, 0, nullptr, nullptr, nullptr).code(), StatusCode::k_invalid_argument);
  std::vector<int32_t> hungry;
  while (pool_->free_blocks() >= k_kv_heads) {  // fill the pool with sequences whose next row opens blocks
    const int32_t s = pool_->add_sequence();
    ASSERT_TRUE(append(s, 0, k_block, 0, 11).ok());
    hungry.push_back(s);
  }
  const int64_t full = pool_->used_blocks();
  const Status st = pool_->append_rows(hungry.data(), static_cast<int64_t>(hungry.size()), 0, nullptr, nullptr, nullptr);
  EXPECT_EQ(st.code(), StatusCode::k_resource_exhausted) << st.to_string();
  EXPECT_NE(st.message().find("blocks"), std::string::npos) << st.message();
  EXPECT_EQ(pool_->used_blocks(), full);
  EXPECT_GT(full, used);
  for (int32_t s : hungry) EXPECT_EQ(pool_->length(s, 0, 0), k_block);
}

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_device_kv_pool: no usable GPU (%s); skipping\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  return RUN_ALL_TESTS();
}
