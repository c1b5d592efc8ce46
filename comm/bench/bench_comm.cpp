// all_reduce_sum latency and bandwidth under `mpirun -np N bench_comm`: 576 floats (one
// SmolLM2 decode token's hidden state) and 576 × 512 (a 512-token prefill chunk), f32 and
// bf16, through the default switch-over and each of the two MPI algorithms. Every rank
// runs the same fixed iteration counts (collectives must match); rank 0 reports.
// bytes_per_second counts payload bytes (count × element size), as the comm counters do.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <vector>

#include "comm/bootstrap.h"

namespace {

using snap::comm::CommKind;
using snap::comm::Communicator;

snap::comm::World g_world;
std::unique_ptr<Communicator> g_paths[3];  // default switch-over, gather only, two-round only
const char* const k_path_names[3] = {"default", "gather", "two_round"};

void bm_all_reduce(benchmark::State& state, snap::DType dtype) {
  const int64_t count = state.range(0);
  Communicator& comm = *g_paths[state.range(1)];
  std::vector<uint8_t> buf(count * snap::dtype_size(dtype), 0);
  for (auto _ : state) {
    snap::Status s = comm.all_reduce_sum(buf.data(), count, dtype);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetBytesProcessed(state.iterations() * count * snap::dtype_size(dtype));
  state.SetLabel(std::string(k_path_names[state.range(1)]) + " np=" + std::to_string(g_world.size()));
}

void bm_f32(benchmark::State& state) { bm_all_reduce(state, snap::DType::f32); }
void bm_bf16(benchmark::State& state) { bm_all_reduce(state, snap::DType::bf16); }

void register_all() {
  for (auto* fn : {&bm_f32, &bm_bf16}) {
    const char* name = fn == &bm_f32 ? "all_reduce_f32" : "all_reduce_bf16";
    for (int path = 0; path < 3; ++path) {
      benchmark::RegisterBenchmark(name, fn)->Args({576, path})->Iterations(5000)->UseRealTime()->Unit(
          benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(name, fn)->Args({576 * 512, path})->Iterations(200)->UseRealTime()->Unit(
          benchmark::kMicrosecond);
    }
  }
}

class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  snap::Result<snap::comm::World> world = snap::comm::world_from_environment();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().to_string().c_str());
    return 1;
  }
  g_world = world.value();
  const int64_t thresholds[3] = {snap::comm::CommOptions().mpi_small_all_reduce_bytes, INT64_MAX, 0};
  for (int p = 0; p < 3; ++p) {
    snap::comm::CommOptions options;
    options.mpi_small_all_reduce_bytes = thresholds[p];
    auto made = snap::comm::make_communicator(CommKind::mpi, g_world, options);
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().to_string().c_str());
      return 1;
    }
    g_paths[p] = std::move(made.value());
  }
  benchmark::Initialize(&argc, argv);
  register_all();
  if (g_world.is_leader()) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  for (auto& c : g_paths) c.reset();
  return 0;
}
