// Host sampling of a continuous-batching step (coordinator/scheduler/token_stream.h): B rows of
// Llama 3's 128256-token vocabulary, each drawn by its own stream's generator, as serve does for
// every decode step whose rows are not all plain greedy (serve --device cuda copies their logits
// to the host; the CPU engine always samples there). sample_rows over 1 OpenMP thread (what the
// engines did: one row after another on the scheduler thread) and over all of them.
// Logits: N(0, 3²) per entry (a peaked distribution: the 0.9 nucleus holds a small share of the
// vocabulary), or U(-1, 1) (flat: the nucleus holds most of it, the slow case of top_p).
//   bench_sampling [--benchmark_filter=...]
// Args: rows, threads (0: all), params (0: temperature 0.7; 1: + top_p 0.9; 2: + top_k 50;
// 3: flat logits, temperature 0.7 + top_p 0.9).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <memory>
#include <random>
#include <vector>

#include "coordinator/scheduler/token_stream.h"

namespace snap {
namespace {

constexpr int64_t k_vocab = 128256;

void BM_SampleRows(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int threads = state.range(1) > 0 ? static_cast<int>(state.range(1)) : omp_get_num_procs();
  const int64_t params = state.range(2);
  std::mt19937 gen(7);
  std::normal_distribution<float> peaked(0.0f, 3.0f);
  std::uniform_real_distribution<float> flat(-1.0f, 1.0f);
  std::vector<std::unique_ptr<TokenStream>> streams;
  std::vector<TokenStream*> ptrs;
  const std::vector<int32_t> eos;
  EmitContext context;
  context.vocab = k_vocab;
  context.eos = &eos;
  for (int64_t r = 0; r < rows; ++r) {
    auto s = std::make_unique<TokenStream>();
    s->logits.resize(k_vocab);
    for (float& x : s->logits) x = params == 3 ? flat(gen) : peaked(gen);
    s->req.sampling.temperature = 0.7f;
    if (params >= 1) s->req.sampling.top_p = 0.9f;
    if (params == 2) s->req.sampling.top_k = 50;
    s->rng = kernels::Rng(static_cast<uint64_t>(r));
    ptrs.push_back(s.get());
    streams.push_back(std::move(s));
  }
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<SampledToken> out;
  for (auto _ : state) {
    sample_rows(ptrs, context, nullptr, &out);
    benchmark::DoNotOptimize(out.data());
  }
  omp_set_num_threads(before);
  state.counters["threads"] = threads;
  state.counters["us/row"] =
      benchmark::Counter(static_cast<double>(rows) * state.iterations(), benchmark::Counter::kIsRate | benchmark::Counter::kInvert,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_SampleRows)
    ->ArgsProduct({{1, 32}, {1, 0}, {0, 1, 2, 3}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace snap

BENCHMARK_MAIN();
