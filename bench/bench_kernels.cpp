// Kernel micro-benchmarks (Google Benchmark): a STREAM-like triad (the memory-bandwidth
// floor), matmul (f32, f16, q8_0, q4_1, q4_0 weights) at SmolLM2-135M shapes for decode
// (1 token: GB/s of weights streamed) and prefill (512 tokens: GFLOP/s), each path separately for the threshold choice,
// attention decode at kv_len 1K/8K, rms_norm. Run: build/bench/bench_kernels.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/kernels.h"

namespace snap::kernels {
namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// --- the floor: a[i] = b[i] + s·c[i] over 3 × 64 MiB, OpenMP like the kernels ------
void BM_StreamTriad(benchmark::State& state) {
  const int64_t n = int64_t{16} << 20;
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(3 * n * 4) * state.iterations(),
                                              benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_StreamTriad)->UseRealTime()->Unit(benchmark::kMillisecond);

// --- matmul ----------------------------------------------------------------------
// Weight dtypes by benchmark argument: 0 f32, 1 f16, 2 q8_0, 3 q4_1, 4 q4_0.
constexpr DType k_bench_dtypes[] = {DType::f32, DType::f16, DType::q8_0, DType::q4_1, DType::q4_0};

// Weight storage for a benchmark: floats converted, or random blocks with small f16 scales
// (the timing does not depend on the values).
std::vector<uint8_t> bench_weight(DType dtype, int64_t rows, int64_t cols) {
  std::vector<uint8_t> data(static_cast<size_t>(rows * dtype_row_bytes(dtype, cols)));
  if (!dtype_is_quantized(dtype)) {
    const std::vector<float> wf = random_floats(rows * cols, 1);
    for (size_t i = 0; i < wf.size(); ++i) {
      if (dtype == DType::f32) {
        std::memcpy(&data[4 * i], &wf[i], 4);
      } else {
        const uint16_t h = f32_to_f16(wf[i]);
        std::memcpy(&data[2 * i], &h, 2);
      }
    }
    return data;
  }
  std::mt19937 gen(1);
  for (uint8_t& b : data) b = static_cast<uint8_t>(gen());
  const uint16_t d = f32_to_f16(0.01f), m = f32_to_f16(-0.05f);
  for (size_t off = 0; off < data.size(); off += static_cast<size_t>(dtype_block_bytes(dtype))) {
    std::memcpy(&data[off], &d, 2);
    if (dtype == DType::q4_1) std::memcpy(&data[off + 2], &m, 2);
  }
  return data;
}

// Args: rows, cols, num_tokens, dtype (k_bench_dtypes), path (0 dispatcher, 1 matvec, 2 gemm).
void BM_Matmul(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), num_tokens = state.range(2);
  const DType dtype = k_bench_dtypes[state.range(3)];
  const std::vector<uint8_t> wd = bench_weight(dtype, rows, cols);
  const WeightView w{dtype, wd.data(), rows, cols};
  const std::vector<float> x = random_floats(num_tokens * cols, 2);
  std::vector<float> y(static_cast<size_t>(num_tokens * rows));
  auto fn = state.range(4) == 1 ? matmul_matvec_cpu : state.range(4) == 2 ? matmul_gemm_cpu : matmul_cpu;
  for (auto _ : state) {
    fn(x.data(), w, nullptr, y.data(), num_tokens);
    benchmark::DoNotOptimize(y.data());
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(wd.size()) * it, benchmark::Counter::kIsRate,
                                              benchmark::Counter::kIs1000);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * num_tokens * it / 1e9, benchmark::Counter::kIsRate);
}

void matmul_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols", "tokens", "dtype", "path"});
  for (int64_t tokens : {1, 512}) {
    for (int dt : {0, 1, 2, 3, 4}) {
      for (auto [r, c] : {std::pair<int64_t, int64_t>{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}})
        b->Args({r, c, tokens, dt, 0});
    }
  }
  // Threshold sweep: matvec vs gemm for small batches on the MLP up-projection.
  for (int64_t tokens : {2, 4, 8, 16, 32}) {
    for (int dt : {0, 1, 2, 3, 4}) {
      b->Args({1536, 576, tokens, dt, 1});
      b->Args({1536, 576, tokens, dt, 2});
    }
  }
}
BENCHMARK(BM_Matmul)->Apply(matmul_shapes)->UseRealTime()->Unit(benchmark::kMicrosecond);

// --- attention decode: SmolLM2 heads (9 query, 3 KV, head_dim 64) ------------------
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t kv_len = state.range(0);
  const AttentionParams p{9, 3, 64, 0.125f, 0};
  const std::vector<float> q = random_floats(9 * 64, 1);
  const std::vector<float> k = random_floats(3 * kv_len * 64, 2), v = random_floats(3 * kv_len * 64, 3);
  std::vector<float> out(9 * 64);
  const int32_t pos = static_cast<int32_t>(kv_len - 1);
  for (auto _ : state) {
    attention_cpu(q.data(), &pos, 1, k.data(), v.data(), kv_len * 64, kv_len, p, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * 3 * kv_len * 64 * 4 * state.iterations(),
                                              benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_AttentionDecode)->Arg(1024)->Arg(8192)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_AttentionPrefill(benchmark::State& state) {
  const int64_t n = state.range(0);
  const AttentionParams p{9, 3, 64, 0.125f, 0};
  const std::vector<float> q = random_floats(n * 9 * 64, 1);
  const std::vector<float> k = random_floats(3 * n * 64, 2), v = random_floats(3 * n * 64, 3);
  std::vector<float> out(q.size());
  std::vector<int32_t> pos(n);
  for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(t);
  for (auto _ : state) {
    attention_cpu(q.data(), pos.data(), n, k.data(), v.data(), n * 64, n, p, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  // Causal: n²/2 (q·k + p·v) × 9 heads × 64 dims × 2 FLOPs.
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * 9 * 64 * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionPrefill)->Arg(512)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_RmsNorm(benchmark::State& state) {
  const int64_t num_tokens = state.range(0), hidden = 576;
  const std::vector<float> x = random_floats(num_tokens * hidden, 1), w = random_floats(hidden, 2);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    rms_norm_cpu(x.data(), w.data(), y.data(), num_tokens, hidden, 1e-5f);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * num_tokens * hidden * 4 * state.iterations(),
                                              benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_RmsNorm)->Arg(1)->Arg(512)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_Sample(benchmark::State& state) {
  const std::vector<float> logits = random_floats(49152, 1);
  const SamplingParams p{0.8f, static_cast<int>(state.range(0)), state.range(1) ? 0.95f : 1.0f, 0.0f, 0};
  Rng rng(1);
  for (auto _ : state) benchmark::DoNotOptimize(sample_cpu(logits.data(), 49152, p, rng));
}
BENCHMARK(BM_Sample)->Args({0, 0})->Args({40, 1})->Args({0, 1})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace snap::kernels

BENCHMARK_MAIN();
