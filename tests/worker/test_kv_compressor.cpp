// KvCompressor over a paged cache with a windowed (gemma3-local-style) layer and two global
// layers: the windowed layer keeps its last `window` positions and is never observed (H2O
// scoring there is O(prompt²) work whose result no selection reads: it must read no query at
// all), while the global layers' H2O selection, accumulated over two prefill chunks, equals
// h2o_select on the whole prompt; SnapKV observes a layer only where the prompt exceeds its
// budget, and full / streaming observe nothing.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "worker/kv/compressor.h"
#include "worker/kv/paged_kv_cache.h"

namespace snap {
namespace {

constexpr int k_layers = 3, k_heads = 2, k_kv_heads = 1, k_hd = 8;
constexpr int64_t k_prompt = 24, k_window = 8;

std::unique_ptr<BlockPool> make_pool() {
  auto pool = BlockPool::create({16, k_hd, DType::f32, 1 << 20});
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(pool).value();
}

CompressorShape shape() {
  CompressorShape s;
  s.num_layers = k_layers;
  s.num_heads = k_heads;
  s.num_kv_heads = k_kv_heads;
  s.head_dim = k_hd;
  s.layer_windows = {static_cast<int>(k_window), 0, 0};  // layer 0 local, 1 and 2 global
  return s;
}

struct Prompt {
  std::vector<float> q[k_layers], k[k_layers], v[k_layers];  // token-major
};

Prompt random_prompt() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Prompt p;
  for (int l = 0; l < k_layers; ++l) {
    for (auto* x : {&p.q[l], &p.k[l], &p.v[l]}) {
      const int heads = x == &p.q[l] ? k_heads : k_kv_heads;
      x->resize(static_cast<size_t>(k_prompt * heads * k_hd));
      for (float& f : *x) f = nd(rng);
    }
  }
  return p;
}

// The prompt in two chunks, as chunked prefill shows it: append each layer's K/V, then
// observe its queries; layer 0's queries are given as null (a windowed layer must not read
// them). Then every layer is compressed.
void prefill_and_compress(KvCompressor& comp, PagedKvCache& cache, const Prompt& p) {
  for (int64_t start : {int64_t{0}, int64_t{12}}) {
    const int64_t n = 12;
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), static_cast<int32_t>(start));
    for (int l = 0; l < k_layers; ++l) {
      ASSERT_TRUE(cache.append_layer(l, pos.data(), p.k[l].data() + start * k_kv_heads * k_hd,
                                     p.v[l].data() + start * k_kv_heads * k_hd, n).ok());
      const float* q = l == 0 ? nullptr : p.q[l].data() + start * k_heads * k_hd;
      ASSERT_TRUE(comp.observe(l, q, pos.data(), n, cache).ok());
    }
  }
  for (int l = 0; l < k_layers; ++l) ASSERT_TRUE(comp.compress_layer(l, cache).ok());
}

TEST(KvCompressor, H2oSkipsWindowedLayersAndMatchesTheWholePromptSelection) {
  auto pool = make_pool();
  PagedKvCache cache(*pool, {k_layers, k_kv_heads, k_hd});
  KvPolicy policy;
  policy.kind = KvPolicyKind::h2o;
  policy.budget = 6;
  KvCompressor comp(policy, shape(), k_prompt);
  EXPECT_FALSE(comp.observes(0));
  EXPECT_TRUE(comp.observes(1));
  EXPECT_TRUE(comp.observes(2));
  const Prompt p = random_prompt();
  prefill_and_compress(comp, cache, p);
  std::vector<int32_t> last(k_window);
  std::iota(last.begin(), last.end(), static_cast<int32_t>(k_prompt - k_window));
  EXPECT_EQ(comp.kept(0)[0], last);
  EXPECT_EQ(cache.positions(0, 0), last);
  for (int l = 1; l < k_layers; ++l) {
    // One KV head: the token-major K rows are the head-major layout LayerQk reads.
    const LayerQk qk{.q = p.q[l].data(), .num_queries = k_prompt, .k = p.k[l].data(), .kv_head_stride = k_prompt * k_hd,
                     .num_tokens = k_prompt, .num_heads = k_heads, .num_kv_heads = k_kv_heads, .head_dim = k_hd};
    auto want = h2o_select(qk, {.budget = policy.budget, .aggregation = policy.aggregation});
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    EXPECT_EQ(comp.kept(l)[0], want->kept[0]) << "layer " << l;
    EXPECT_EQ(cache.positions(l, 0), want->kept[0]) << "layer " << l;
  }
}

TEST(KvCompressor, ObservesOnlyWhereASelectionReadsQueries) {
  KvPolicy snap;
  snap.kind = KvPolicyKind::snapkv;
  snap.budget = 16;
  snap.window = 4;
  snap.kernel = 3;
  KvCompressor fits(snap, shape(), 16);  // the prompt fits the budget: everything is kept
  KvCompressor over(snap, shape(), k_prompt);
  for (int l = 0; l < k_layers; ++l) EXPECT_FALSE(fits.observes(l)) << l;
  EXPECT_FALSE(over.observes(0));
  EXPECT_TRUE(over.observes(1));
  KvPolicy stream;
  stream.kind = KvPolicyKind::streaming;
  stream.budget = 16;
  KvPolicy full;
  for (const KvPolicy& pol : {stream, full}) {
    KvCompressor c(pol, shape(), k_prompt);
    for (int l = 0; l < k_layers; ++l) EXPECT_FALSE(c.observes(l)) << kv_policy_name(pol.kind) << " " << l;
  }
}

}  // namespace
}  // namespace snap
