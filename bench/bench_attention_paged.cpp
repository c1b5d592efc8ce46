// Paged vs contiguous decode attention (1 query token) at SmolLM2-135M shapes (9 heads,
// 3 KV heads, head_dim 64) and kv_len 1K/4K/8K: attention_cpu over a contiguous
// [kv_heads, kv_len, head_dim] cache vs attention_paged_cpu over a PagedKvCache with 16-token
// blocks, filled in 512-token prefill chunks (heads interleaved in the pool) or from a pool
// whose free list was shuffled (worst-case fragmentation). Also a 512-token prefill pair.
// Run: build/bench/bench_attention_paged.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/attention_paged.h"
#include "kernels/kernels.h"
#include "worker/kv/paged_kv_cache.h"

namespace snap {
namespace {

constexpr int k_heads = 9, k_kv_heads = 3, k_hd = 64;
constexpr int64_t k_chunk = 512;

enum Layout : int64_t { contiguous = 0, paged = 1, paged_fragmented = 2 };

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// A pool with room for kv_len tokens of one layer (plus slack), and a cache filled with
// token-major K/V in prefill-sized chunks.
struct PagedSetup {
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<PagedKvCache> cache;

  PagedSetup(int64_t kv_len, bool fragmented, const std::vector<float>& k, const std::vector<float>& v) {
    const int64_t blocks = k_kv_heads * (kv_len / 16 + 2) + 64;
    pool = BlockPool::create({16, k_hd, DType::f32, blocks * (2 * 16 * k_hd * 4 + 16 * 4)}).value();
    if (fragmented) {  // allocate everything, free in random order: the free list is shuffled
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < pool->num_blocks(); ++i) ids.push_back(pool->alloc().value());
      std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
      for (int32_t id : ids) pool->free(id);
    }
    cache = std::make_unique<PagedKvCache>(*pool, KvCacheShape{1, k_kv_heads, k_hd});
    std::vector<int32_t> pos(static_cast<size_t>(kv_len));
    for (int64_t t = 0; t < kv_len; ++t) pos[t] = static_cast<int32_t>(t);
    for (int64_t t0 = 0; t0 < kv_len; t0 += k_chunk) {
      const int64_t n = std::min(k_chunk, kv_len - t0);
      const int64_t off = t0 * k_kv_heads * k_hd;
      const Status s = cache->append_layer(0, pos.data() + t0, k.data() + off, v.data() + off, n);
      CHECK(s.ok()) << s.to_string();
    }
  }
};

// Args: kv_len, layout.
void BM_DecodeAttention(benchmark::State& state) {
  const int64_t kv_len = state.range(0);
  const Layout layout = static_cast<Layout>(state.range(1));
  const kernels::AttentionParams p{k_heads, k_kv_heads, k_hd, 0.125f, 0};
  const std::vector<float> q = random_floats(k_heads * k_hd, 1);
  const std::vector<float> k = random_floats(kv_len * k_kv_heads * k_hd, 2);  // token-major
  const std::vector<float> v = random_floats(kv_len * k_kv_heads * k_hd, 3);
  std::vector<float> out(k_heads * k_hd);
  const int32_t pos = static_cast<int32_t>(kv_len - 1);
  if (layout == contiguous) {
    std::vector<float> kc(k.size()), vc(v.size());  // [kv_heads, kv_len, head_dim]
    for (int64_t t = 0; t < kv_len; ++t)
      for (int g = 0; g < k_kv_heads; ++g)
        for (int i = 0; i < k_hd; ++i) {
          kc[(g * kv_len + t) * k_hd + i] = k[(t * k_kv_heads + g) * k_hd + i];
          vc[(g * kv_len + t) * k_hd + i] = v[(t * k_kv_heads + g) * k_hd + i];
        }
    for (auto _ : state) {
      kernels::attention_cpu(q.data(), &pos, 1, kc.data(), vc.data(), kv_len * k_hd, kv_len, p, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  } else {
    PagedSetup setup(kv_len, layout == paged_fragmented, k, v);
    const kernels::PagedKv view = setup.cache->layer_view(0);
    for (auto _ : state) {
      kernels::attention_paged_cpu(q.data(), &pos, 1, view, p, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * k_kv_heads * kv_len * k_hd * 4 * state.iterations(),
                                              benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{1024, 4096, 8192}, {contiguous, paged, paged_fragmented}})
    ->ArgNames({"kv_len", "layout"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Args: layout (contiguous or paged); 512 causal queries over themselves.
void BM_PrefillAttention(benchmark::State& state) {
  const int64_t n = 512;
  const Layout layout = static_cast<Layout>(state.range(0));
  const kernels::AttentionParams p{k_heads, k_kv_heads, k_hd, 0.125f, 0};
  const std::vector<float> q = random_floats(n * k_heads * k_hd, 1);
  const std::vector<float> k = random_floats(n * k_kv_heads * k_hd, 2), v = random_floats(n * k_kv_heads * k_hd, 3);
  std::vector<float> out(q.size());
  std::vector<int32_t> pos(n);
  for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(t);
  if (layout == contiguous) {
    std::vector<float> kc(k.size()), vc(v.size());
    for (int64_t t = 0; t < n; ++t)
      for (int g = 0; g < k_kv_heads; ++g)
        for (int i = 0; i < k_hd; ++i) {
          kc[(g * n + t) * k_hd + i] = k[(t * k_kv_heads + g) * k_hd + i];
          vc[(g * n + t) * k_hd + i] = v[(t * k_kv_heads + g) * k_hd + i];
        }
    for (auto _ : state) {
      kernels::attention_cpu(q.data(), pos.data(), n, kc.data(), vc.data(), n * k_hd, n, p, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  } else {
    PagedSetup setup(n, false, k, v);
    const kernels::PagedKv view = setup.cache->layer_view(0);
    for (auto _ : state) {
      kernels::attention_paged_cpu(q.data(), pos.data(), n, view, p, out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
}
BENCHMARK(BM_PrefillAttention)
    ->Arg(contiguous)
    ->Arg(paged)
    ->ArgName("layout")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace snap

BENCHMARK_MAIN();
