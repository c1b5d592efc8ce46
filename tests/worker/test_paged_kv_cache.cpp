// PagedKvCache: appends across block boundaries (per head and a whole token-major layer
// chunk), heads of different lengths, position rules, compaction with empty / all / every
// other / last-only keep sets preserving rows and positions, blocks back in the pool after
// compact, free_all and destruction, all-or-nothing appends on exhaustion, exact byte
// accounting per sequence and pool-wide, and attention_paged_cpu over a compacted layer.
// 16-bit pools (bf16, f16): rows read back as the rounded f32 rows, compaction and
// copy_from move them bit for bit, bytes counted at 2 per element, attention over them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/kv_convert.h"
#include "worker/kv/paged_kv_cache.h"

namespace snap {
namespace {

constexpr int k_hd = 8;

std::unique_ptr<BlockPool> make_pool(int block_size, int64_t num_blocks) {
  const int64_t block_bytes = 2LL * block_size * k_hd * 4 + int64_t{block_size} * 4;
  auto pool = BlockPool::create({block_size, k_hd, DType::f32, block_bytes * num_blocks});
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(pool).value();
}

// A distinct, recomputable value for (layer, head, position, dim): K positive, V negative.
float k_value(int layer, int head, int32_t pos, int i) {
  return 1.0f + layer * 1e5f + head * 1e4f + pos * 10.0f + i * 0.5f;
}
float v_value(int layer, int head, int32_t pos, int i) { return -k_value(layer, head, pos, i); }

// The rows of (layer, head) at `pos` into k, v [pos.size(), k_hd].
void make_rows(int layer, int head, const std::vector<int32_t>& pos, std::vector<float>& k, std::vector<float>& v) {
  k.resize(pos.size() * k_hd);
  v.resize(pos.size() * k_hd);
  for (size_t j = 0; j < pos.size(); ++j) {
    for (int i = 0; i < k_hd; ++i) {
      k[j * k_hd + i] = k_value(layer, head, pos[j], i);
      v[j * k_hd + i] = v_value(layer, head, pos[j], i);
    }
  }
}

std::vector<int32_t> range(int32_t first, int32_t n) {
  std::vector<int32_t> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), first);
  return r;
}

Status append_range(PagedKvCache& c, int layer, int head, int32_t first, int32_t n) {
  const std::vector<int32_t> pos = range(first, n);
  std::vector<float> k, v;
  make_rows(layer, head, pos, k, v);
  return c.append(layer, head, pos.data(), k.data(), v.data(), n);
}

// Every entry of (layer, head) holds exactly the rows of `want_positions`, in order.
::testing::AssertionResult holds(const PagedKvCache& c, int layer, int head,
                                 const std::vector<int32_t>& want_positions) {
  if (c.length(layer, head) != static_cast<int64_t>(want_positions.size()))
    return ::testing::AssertionFailure() << "length " << c.length(layer, head) << " want " << want_positions.size();
  const int64_t bs = c.pool().block_size();
  const int64_t want_blocks = (c.length(layer, head) + bs - 1) / bs;
  if (static_cast<int64_t>(c.block_table(layer, head).size()) != want_blocks)
    return ::testing::AssertionFailure() << c.block_table(layer, head).size() << " blocks, want " << want_blocks;
  for (size_t j = 0; j < want_positions.size(); ++j) {
    const int32_t p = want_positions[j];
    if (c.position(layer, head, static_cast<int64_t>(j)) != p)
      return ::testing::AssertionFailure()
             << "entry " << j << " position " << c.position(layer, head, j) << " want " << p;
    for (int i = 0; i < k_hd; ++i) {
      if (c.k_row(layer, head, j)[i] != k_value(layer, head, p, i) ||
          c.v_row(layer, head, j)[i] != v_value(layer, head, p, i))
        return ::testing::AssertionFailure() << "entry " << j << " (position " << p << ") dim " << i << ": k "
                                             << c.k_row(layer, head, j)[i] << " want " << k_value(layer, head, p, i);
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(PagedKvCache, AppendAcrossBlockBoundaries) {
  for (int bs : {1, 16, 32}) {
    auto pool = make_pool(bs, 200);
    PagedKvCache c(*pool, {2, 3, k_hd});
    int32_t next = 0;
    for (int32_t n : {1, 15, 1, 20, 16, 33}) {
      ASSERT_TRUE(append_range(c, 1, 2, next, n).ok());
      next += n;
      EXPECT_TRUE(holds(c, 1, 2, range(0, next))) << "block " << bs << " after " << next;
      EXPECT_EQ(c.next_position(), next);
    }
    EXPECT_EQ(c.length(0, 2), 0);
    EXPECT_EQ(c.length(1, 0), 0);
    EXPECT_EQ(pool->num_used(), (next + bs - 1) / bs);
  }
}

TEST(PagedKvCache, AppendLayerSplitsTokenMajorChunkPerHead) {
  auto pool = make_pool(16, 100);
  const int num_kv_heads = 3;
  PagedKvCache c(*pool, {2, num_kv_heads, k_hd});
  int32_t next = 0;
  for (int32_t n : {7, 30, 1}) {
    const std::vector<int32_t> pos = range(next, n);
    std::vector<float> k(static_cast<size_t>(n) * num_kv_heads * k_hd), v(k.size());
    for (int32_t t = 0; t < n; ++t)
      for (int g = 0; g < num_kv_heads; ++g)
        for (int i = 0; i < k_hd; ++i) {
          k[(t * num_kv_heads + g) * k_hd + i] = k_value(0, g, pos[t], i);
          v[(t * num_kv_heads + g) * k_hd + i] = v_value(0, g, pos[t], i);
        }
    ASSERT_TRUE(c.append_layer(0, pos.data(), k.data(), v.data(), n).ok());
    next += n;
  }
  for (int g = 0; g < num_kv_heads; ++g) EXPECT_TRUE(holds(c, 0, g, range(0, next))) << "head " << g;
  EXPECT_EQ(c.length(1, 0), 0);
  EXPECT_EQ(c.next_position(), next);
}

TEST(PagedKvCache, HeadsHoldDifferentLengths) {
  auto pool = make_pool(16, 100);
  PagedKvCache c(*pool, {1, 3, k_hd});
  ASSERT_TRUE(append_range(c, 0, 0, 0, 40).ok());
  ASSERT_TRUE(append_range(c, 0, 1, 0, 3).ok());
  EXPECT_TRUE(holds(c, 0, 0, range(0, 40)));
  EXPECT_TRUE(holds(c, 0, 1, range(0, 3)));
  EXPECT_TRUE(holds(c, 0, 2, {}));
  EXPECT_EQ(pool->num_used(), 3 + 1);
  EXPECT_EQ(c.next_position(), 40);
}

TEST(PagedKvCache, RejectsPositionsThatDoNotIncrease) {
  auto pool = make_pool(16, 100);
  PagedKvCache c(*pool, {1, 1, k_hd});
  ASSERT_TRUE(append_range(c, 0, 0, 0, 10).ok());
  const int64_t used = pool->num_used();
  const Status again = append_range(c, 0, 0, 9, 1);
  EXPECT_EQ(again.code(), StatusCode::k_invalid_argument) << again.to_string();
  const std::vector<int32_t> unsorted{20, 19};
  std::vector<float> k, v;
  make_rows(0, 0, unsorted, k, v);
  EXPECT_EQ(c.append(0, 0, unsorted.data(), k.data(), v.data(), 2).code(), StatusCode::k_invalid_argument);
  EXPECT_TRUE(holds(c, 0, 0, range(0, 10)));
  EXPECT_EQ(pool->num_used(), used);
}

TEST(PagedKvCache, CompactKeepsChosenEntriesAndFreesBlocks) {
  const int32_t len = 50;
  std::vector<std::pair<const char*, std::vector<int32_t>>> keep_sets;
  keep_sets.push_back({"empty", {}});
  keep_sets.push_back({"all", range(0, len)});
  std::vector<int32_t> every_other;
  for (int32_t j = 0; j < len; j += 2) every_other.push_back(j);
  keep_sets.push_back({"every other", every_other});
  keep_sets.push_back({"last only", {len - 1}});
  keep_sets.push_back({"first block and tail", {0, 1, 2, 15, 16, 47, 48, 49}});
  for (int bs : {1, 16, 32}) {
    for (const auto& [name, keep] : keep_sets) {
      auto pool = make_pool(bs, 200);
      const int64_t free_at_start = pool->num_free();
      PagedKvCache c(*pool, {1, 2, k_hd});
      ASSERT_TRUE(append_range(c, 0, 0, 0, len).ok());
      ASSERT_TRUE(append_range(c, 0, 1, 0, len).ok());
      ASSERT_TRUE(c.compact(0, 0, keep).ok()) << name;
      std::vector<int32_t> want;  // positions equal original indices here
      for (int32_t j : keep) want.push_back(j);
      EXPECT_TRUE(holds(c, 0, 0, want)) << name << " block " << bs;
      EXPECT_TRUE(holds(c, 0, 1, range(0, len))) << "untouched head, " << name;
      const int64_t blocks = (static_cast<int64_t>(keep.size()) + bs - 1) / bs + (len + bs - 1) / bs;
      EXPECT_EQ(pool->num_used(), blocks) << name << " block " << bs;
      EXPECT_EQ(pool->num_free(), free_at_start - blocks);
      // New tokens continue at the sequence's next position, after the kept ones.
      EXPECT_EQ(c.next_position(), len);
      ASSERT_TRUE(append_range(c, 0, 0, len, 3).ok());
      want.push_back(len);
      want.push_back(len + 1);
      want.push_back(len + 2);
      EXPECT_TRUE(holds(c, 0, 0, want)) << name << " then append, block " << bs;
      c.free_all();
      EXPECT_EQ(pool->num_free(), free_at_start);
    }
  }
}

TEST(PagedKvCache, CompactTwiceKeepsOriginalPositions) {
  auto pool = make_pool(16, 100);
  PagedKvCache c(*pool, {1, 1, k_hd});
  ASSERT_TRUE(append_range(c, 0, 0, 0, 100).ok());
  ASSERT_TRUE(c.compact(0, 0, {3, 10, 11, 40, 64, 99}).ok());
  ASSERT_TRUE(c.compact(0, 0, {1, 3, 5}).ok());  // indices into the current contents
  EXPECT_TRUE(holds(c, 0, 0, {10, 40, 99}));
  EXPECT_EQ(c.positions(0, 0), (std::vector<int32_t>{10, 40, 99}));
}

TEST(PagedKvCache, CompactRejectsBadIndicesAndChangesNothing) {
  auto pool = make_pool(16, 100);
  PagedKvCache c(*pool, {1, 1, k_hd});
  ASSERT_TRUE(append_range(c, 0, 0, 0, 20).ok());
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{3, 2}, {4, 4}, {-1, 3}, {5, 20}}) {
    const Status s = c.compact(0, 0, bad);
    EXPECT_EQ(s.code(), StatusCode::k_invalid_argument) << s.to_string();
  }
  EXPECT_TRUE(holds(c, 0, 0, range(0, 20)));
  EXPECT_EQ(pool->num_used(), 2);
}

TEST(PagedKvCache, ExhaustionLeavesCacheConsistent) {
  auto pool = make_pool(16, 7);
  PagedKvCache c(*pool, {1, 3, k_hd});
  // 20 tokens × 3 heads = 6 blocks; then 20 more would need 6 more (2 per head): only 1 left.
  const std::vector<int32_t> pos = range(0, 60);
  std::vector<float> k(40 * 3 * k_hd), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i), v[i] = -static_cast<float>(i);
  ASSERT_TRUE(c.append_layer(0, pos.data(), k.data(), v.data(), 20).ok());
  EXPECT_EQ(pool->num_used(), 6);
  const Status s = c.append_layer(0, pos.data() + 20, k.data() + 20 * 3 * k_hd, v.data() + 20 * 3 * k_hd, 20);
  EXPECT_EQ(s.code(), StatusCode::k_resource_exhausted);
  EXPECT_NE(s.message().find("KV block pool exhausted"), std::string::npos) << s.message();
  for (int g = 0; g < 3; ++g) EXPECT_EQ(c.length(0, g), 20);
  EXPECT_EQ(pool->num_used(), 6);
  EXPECT_EQ(c.num_blocks(), 6);
  EXPECT_EQ(c.next_position(), 20);
  EXPECT_EQ(c.stored_bytes(), 3 * 20 * 2 * k_hd * 4);
  // The per-head append fails the same way, and smaller appends still fit.
  std::vector<float> kk(30 * k_hd, 1.0f), vv(30 * k_hd, 2.0f);
  EXPECT_EQ(c.append(0, 0, pos.data() + 20, kk.data(), vv.data(), 30).code(), StatusCode::k_resource_exhausted);
  EXPECT_EQ(c.length(0, 0), 20);
  EXPECT_EQ(pool->num_used(), 6);
  EXPECT_TRUE(c.append(0, 0, pos.data() + 20, kk.data(), vv.data(), 17).ok());  // 37 tokens: 3 blocks
  EXPECT_EQ(c.length(0, 0), 37);
  EXPECT_EQ(pool->num_used(), 7);
}

TEST(PagedKvCache, FreeAllAndDestructionReturnEveryBlock) {
  auto pool = make_pool(16, 100);
  const int64_t start = pool->num_free();
  {
    PagedKvCache c(*pool, {2, 3, k_hd});
    for (int l = 0; l < 2; ++l)
      for (int g = 0; g < 3; ++g) ASSERT_TRUE(append_range(c, l, g, 0, 10 + 7 * g + l).ok());
    EXPECT_LT(pool->num_free(), start);
    c.free_all();
    EXPECT_EQ(pool->num_free(), start);
    EXPECT_EQ(c.next_position(), 0);
    EXPECT_EQ(c.resident_bytes(), 0);
    ASSERT_TRUE(append_range(c, 1, 1, 0, 40).ok());  // usable again from position 0
    PagedKvCache moved(std::move(c));
    EXPECT_TRUE(holds(moved, 1, 1, range(0, 40)));
  }
  EXPECT_EQ(pool->num_free(), start);
  EXPECT_EQ(pool->stored_bytes(), 0);
  EXPECT_EQ(pool->full_equivalent_bytes(), 0);
}

// A fork: the copy holds the same entries and positions in blocks of its own, then the two
// diverge; accounting doubles; a pool too small for the copy leaves it empty.
TEST(PagedKvCache, CopyFromForksACompactedCache) {
  auto pool = make_pool(16, 40);  // a takes 15 blocks after compaction: room for one copy, not two
  PagedKvCache a(*pool, {2, 3, k_hd});
  for (int l = 0; l < 2; ++l)
    for (int g = 0; g < 3; ++g) ASSERT_TRUE(append_range(a, l, g, 0, 40).ok());
  ASSERT_TRUE(a.compact(0, 1, range(30, 10)).ok());
  std::vector<int32_t> odd;
  for (int32_t j = 1; j < 40; j += 2) odd.push_back(j);
  ASSERT_TRUE(a.compact(1, 2, odd).ok());
  PagedKvCache b(*pool, {2, 3, k_hd});
  const int64_t used = pool->num_used();
  ASSERT_EQ(used, 15);
  ASSERT_TRUE(b.copy_from(a).ok());
  EXPECT_EQ(pool->num_used(), 2 * used);
  EXPECT_EQ(b.next_position(), a.next_position());
  EXPECT_EQ(b.num_blocks(), a.num_blocks());
  EXPECT_EQ(b.stored_bytes(), a.stored_bytes());
  EXPECT_EQ(b.full_equivalent_bytes(), a.full_equivalent_bytes());
  EXPECT_EQ(pool->stored_bytes(), 2 * a.stored_bytes());
  EXPECT_TRUE(holds(b, 0, 1, range(30, 10)));
  EXPECT_TRUE(holds(b, 1, 2, odd));
  EXPECT_TRUE(holds(b, 1, 0, range(0, 40)));
  for (int l = 0; l < 2; ++l)
    for (int g = 0; g < 3; ++g) EXPECT_NE(b.block_table(l, g), a.block_table(l, g)) << "blocks are copied, not shared";
  // They diverge: appending to the copy leaves the source as it was.
  for (int l = 0; l < 2; ++l)
    for (int g = 0; g < 3; ++g) ASSERT_TRUE(append_range(b, l, g, 40, 1).ok());
  EXPECT_EQ(b.next_position(), 41);
  EXPECT_EQ(a.next_position(), 40);
  EXPECT_TRUE(holds(a, 0, 1, range(30, 10)));
  // No room for a third copy: nothing kept, every block back.
  PagedKvCache c(*pool, {2, 3, k_hd});
  const int64_t before = pool->num_free();
  const Status st = c.copy_from(a);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::k_resource_exhausted);
  EXPECT_EQ(pool->num_free(), before);
  EXPECT_EQ(c.next_position(), 0);
  PagedKvCache d(*pool, {2, 3, k_hd});
  ASSERT_TRUE(append_range(d, 0, 0, 0, 1).ok());
  EXPECT_EQ(d.copy_from(a).code(), StatusCode::k_invalid_argument) << "only into an empty cache";
}

TEST(PagedKvCache, AccountingIsExact) {
  const int bs = 16;
  auto pool = make_pool(bs, 400);
  const int64_t token_bytes = 2 * k_hd * 4;
  PagedKvCache a(*pool, {2, 3, k_hd});
  PagedKvCache b(*pool, {2, 3, k_hd});
  for (int l = 0; l < 2; ++l)
    for (int g = 0; g < 3; ++g) {
      ASSERT_TRUE(append_range(a, l, g, 0, 100).ok());
      ASSERT_TRUE(append_range(b, l, g, 0, 33).ok());
    }
  // a: compress layer 0 head 1 to 10 entries, layer 1 head 2 to 17.
  ASSERT_TRUE(a.compact(0, 1, range(90, 10)).ok());
  ASSERT_TRUE(a.compact(1, 2, range(0, 17)).ok());
  const int64_t a_tokens = 4 * 100 + 10 + 17, a_blocks = 4 * 7 + 1 + 2;
  EXPECT_EQ(a.stored_bytes(), a_tokens * token_bytes);
  EXPECT_EQ(a.num_blocks(), a_blocks);
  EXPECT_EQ(a.resident_bytes(), a_blocks * pool->block_bytes());
  // Full-equivalent: the blocks an uncompressed cache would hold, 7 per head for 100 tokens.
  EXPECT_EQ(a.full_equivalent_bytes(), 2 * 3 * 7 * pool->block_bytes());
  const int64_t b_blocks = 6 * 3;
  EXPECT_EQ(b.stored_bytes(), 6 * 33 * token_bytes);
  EXPECT_EQ(b.resident_bytes(), b_blocks * pool->block_bytes());
  EXPECT_EQ(b.full_equivalent_bytes(), 2 * 3 * 3 * pool->block_bytes());
  EXPECT_EQ(b.full_equivalent_bytes(), b.resident_bytes()) << "uncompressed: the same basis, ratio exactly 1";
  EXPECT_EQ(pool->resident_bytes(), (a_blocks + b_blocks) * pool->block_bytes());
  EXPECT_EQ(pool->stored_bytes(), a.stored_bytes() + b.stored_bytes());
  EXPECT_EQ(pool->full_equivalent_bytes(), a.full_equivalent_bytes() + b.full_equivalent_bytes());
  // Decode steps on a: one token in every head each; full-equivalent grows by a block per
  // head when position 112 opens the 8th block.
  for (int p = 100; p < 112; ++p)
    for (int l = 0; l < 2; ++l)
      for (int g = 0; g < 3; ++g) ASSERT_TRUE(append_range(a, l, g, p, 1).ok());
  EXPECT_EQ(a.full_equivalent_bytes(), 2 * 3 * 7 * pool->block_bytes());
  for (int l = 0; l < 2; ++l)
    for (int g = 0; g < 3; ++g) ASSERT_TRUE(append_range(a, l, g, 112, 1).ok());
  EXPECT_EQ(a.full_equivalent_bytes(), 2 * 3 * 8 * pool->block_bytes());
  EXPECT_EQ(pool->full_equivalent_bytes(), a.full_equivalent_bytes() + b.full_equivalent_bytes());
  EXPECT_EQ(a.stored_bytes(), (a_tokens + 6 * 13) * token_bytes);
  b.free_all();
  EXPECT_EQ(pool->stored_bytes(), a.stored_bytes());
  EXPECT_EQ(pool->full_equivalent_bytes(), a.full_equivalent_bytes());
  EXPECT_EQ(pool->resident_bytes(), a.resident_bytes());
}

TEST(PagedKvCache, AttentionOverCompactedLayerMatchesNaive) {
  // 2 KV heads × 3 query heads; head 0 keeps every 3rd of 70 tokens, head 1 the last 5.
  const int bs = 16, num_kv_heads = 2, num_heads = 6;
  auto pool = make_pool(bs, 100);
  PagedKvCache c(*pool, {1, num_kv_heads, k_hd});
  const int32_t len = 70;
  std::vector<float> k(len * num_kv_heads * k_hd), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(0.37f * i), v[i] = std::cos(0.11f * i);
  const std::vector<int32_t> pos = range(0, len);
  ASSERT_TRUE(c.append_layer(0, pos.data(), k.data(), v.data(), len).ok());
  std::vector<int32_t> keep0;
  for (int32_t j = 0; j < len; j += 3) keep0.push_back(j);
  ASSERT_TRUE(c.compact(0, 0, keep0).ok());
  ASSERT_TRUE(c.compact(0, 1, range(len - 5, 5)).ok());

  const std::vector<int32_t> q_pos{len, len + 1};  // two new tokens (their own K/V not needed here)
  std::vector<float> q(q_pos.size() * num_heads * k_hd);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(1.3f * i);
  kernels::AttentionParams p{num_heads, num_kv_heads, k_hd, 0.35f, 0};
  std::vector<float> got(q.size(), -7.0f);
  kernels::attention_paged_cpu(q.data(), q_pos.data(), 2, c.layer_view(0), p, got.data());
  for (size_t t = 0; t < q_pos.size(); ++t) {
    for (int h = 0; h < num_heads; ++h) {
      const int g = h / 3;
      std::vector<double> w;
      for (int64_t j = 0; j < c.length(0, g); ++j) {
        double d = 0;
        for (int i = 0; i < k_hd; ++i) d += double{q[(t * num_heads + h) * k_hd + i]} * c.k_row(0, g, j)[i];
        w.push_back(std::exp(d * p.scale));
      }
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      for (int i = 0; i < k_hd; ++i) {
        double o = 0;
        for (int64_t j = 0; j < c.length(0, g); ++j) o += w[j] / sum * c.v_row(0, g, j)[i];
        const float out = got[(t * num_heads + h) * k_hd + i];
        ASSERT_FALSE(std::isnan(out));
        ASSERT_NEAR(out, o, 1e-5) << "token " << t << " head " << h << " dim " << i;
      }
    }
  }
}

TEST(PagedKvCache, SixteenBitPoolsStoreRoundedRowsAndMoveThemExactly) {
  const int bs = 16, hd = 64, num_kv_heads = 2;
  for (DType dtype : {DType::bf16, DType::f16}) {
    const int64_t block_bytes = bs * (2LL * hd * 2 + 4);
    auto pool = BlockPool::create({bs, hd, dtype, block_bytes * 60}).value();
    ASSERT_EQ(pool->block_bytes(), block_bytes);
    PagedKvCache c(*pool, {2, num_kv_heads, hd});
    const int32_t len = 100;
    // Random rows: distinct even after rounding, so a row moved to the wrong slot shows.
    std::vector<float> k(len * num_kv_heads * hd), v(k.size());
    uint32_t x = 12345;
    for (size_t i = 0; i < k.size(); ++i) {
      x = x * 1664525u + 1013904223u;
      k[i] = static_cast<float>(static_cast<int32_t>(x >> 8) - (1 << 23)) / (1 << 21);  // [-4, 4)
      v[i] = std::sin(0.7f * i) * 3.0f;
    }
    const std::vector<int32_t> pos = range(0, len);
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(c.append_layer(l, pos.data(), k.data(), v.data(), len).ok());
    auto want_row = [&](const std::vector<float>& src, int g, int32_t p) {
      std::vector<uint16_t> h(hd);
      std::vector<float> r(hd);
      kernels::kv_convert_ref(&src[(p * num_kv_heads + g) * hd], dtype, h.data(), hd);
      kernels::kv_to_f32_ref(h.data(), dtype, r.data(), hd);
      return r;
    };
    auto check = [&](const PagedKvCache& cache, int l, int g, const std::vector<int32_t>& want) {
      ASSERT_EQ(cache.length(l, g), static_cast<int64_t>(want.size()));
      for (size_t j = 0; j < want.size(); ++j) {
        ASSERT_EQ(cache.position(l, g, j), want[j]);
        ASSERT_EQ(cache.k_row(l, g, j), want_row(k, g, want[j])) << dtype_name(dtype) << " k entry " << j;
        ASSERT_EQ(cache.v_row(l, g, j), want_row(v, g, want[j])) << dtype_name(dtype) << " v entry " << j;
      }
    };
    check(c, 1, 1, pos);
    EXPECT_EQ(c.stored_bytes(), 2 * num_kv_heads * len * 2LL * hd * 2);
    EXPECT_EQ(c.resident_bytes(), 2 * num_kv_heads * 7 * block_bytes);
    EXPECT_EQ(c.full_equivalent_bytes(), c.resident_bytes());
    std::vector<int32_t> keep;
    for (int32_t j = 1; j < len; j += 3) keep.push_back(j);
    ASSERT_TRUE(c.compact(0, 1, keep).ok());
    check(c, 0, 1, keep);
    check(c, 0, 0, pos);
    EXPECT_EQ(c.stored_bytes(), (3 * len + static_cast<int64_t>(keep.size())) * 2LL * hd * 2);
    PagedKvCache d(*pool, {2, num_kv_heads, hd});
    ASSERT_TRUE(d.copy_from(c).ok());
    check(d, 0, 1, keep);
    check(d, 1, 0, pos);
    EXPECT_EQ(pool->stored_bytes(), 2 * c.stored_bytes());

    // Attention over the compacted 16-bit layer against a naive softmax over the rows read back.
    const std::vector<int32_t> q_pos{len};
    const int num_heads = 6;
    std::vector<float> q(num_heads * hd);
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(1.3f * i);
    kernels::AttentionParams p{num_heads, num_kv_heads, hd, 0.125f, 0};
    std::vector<float> got(q.size(), -7.0f);
    kernels::attention_paged_cpu(q.data(), q_pos.data(), 1, d.layer_view(0), p, got.data());
    for (int h = 0; h < num_heads; ++h) {
      const int g = h / 3;
      std::vector<double> w;
      for (int64_t j = 0; j < d.length(0, g); ++j) {
        const std::vector<float> kr = d.k_row(0, g, j);
        double dot = 0;
        for (int i = 0; i < hd; ++i) dot += double{q[h * hd + i]} * kr[i];
        w.push_back(std::exp(dot * p.scale));
      }
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      for (int i = 0; i < hd; ++i) {
        double o = 0;
        for (int64_t j = 0; j < d.length(0, g); ++j) o += w[j] / sum * d.v_row(0, g, j)[i];
        ASSERT_NEAR(got[h * hd + i], o, 1e-5) << dtype_name(dtype) << " head " << h << " dim " << i;
      }
    }
  }
}

}  // namespace
}  // namespace snap
