// SnapKV selection micro-benchmark (Google Benchmark): snapkv_select on one layer at
// SmolLM2-135M shapes (9 query heads, 3 KV heads, head_dim 64), window 32, max pooling
// kernel 7, budget N/4, for N = 1K/4K/8K; plus H2O at N = 1K/4K for comparison (it scores
// with every prompt query: O(N²)). Run: build/bench/bench_kv_selection.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "worker/kv/selection.h"

namespace snap {
namespace {

constexpr int k_heads = 9, k_kv_heads = 3, k_dim = 64, k_window = 32;

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

void BM_SnapKvSelect(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto k = random_floats(k_kv_heads * n * k_dim, 1);
  const auto q = random_floats(k_window * k_heads * k_dim, 2);
  const LayerQk qk{q.data(), k_window, k.data(), n * k_dim, n, k_heads, k_kv_heads, k_dim};
  SnapKvParams p;
  p.budget = n / 4;
  p.window = k_window;
  for (auto _ : state) {
    auto sel = snapkv_select(qk, p);
    benchmark::DoNotOptimize(sel.ok());
  }
  // q·kᵀ: 2·W·N·head_dim flops per query head.
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * k_window * n * k_dim * k_heads * state.iterations(),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_SnapKvSelect)->Arg(1024)->Arg(4096)->Arg(8192)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_H2oSelect(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto k = random_floats(k_kv_heads * n * k_dim, 1);
  const auto q = random_floats(n * k_heads * k_dim, 2);
  const LayerQk qk{q.data(), n, k.data(), n * k_dim, n, k_heads, k_kv_heads, k_dim};
  H2oParams p;
  p.budget = n / 4;
  for (auto _ : state) {
    auto sel = h2o_select(qk, p);
    benchmark::DoNotOptimize(sel.ok());
  }
}
BENCHMARK(BM_H2oSelect)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace snap

BENCHMARK_MAIN();
