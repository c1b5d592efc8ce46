// all_reduce_sum over the TCP backend (comm/tcp.cpp), the host-staged tensor-parallel path's
// collective when no MPI is there (--rank/--world-size/--leader, LeaderWorkerSet pods, and the
// device check's bench_device_tp): this process forks world_size − 1 ranks on 127.0.0.1, every
// rank runs the same fixed iterations, rank 0 prints the median time and payload GB/s per size.
// Sizes: one decode token's hidden state (SmolLM2 576, Llama-3-8B 4096 floats) and prefill
// chunks (512 x 576, 2048 x 4096 floats = 32 MiB). bytes counted as the comm counters do
// (count x element size).
//   usage: bench_comm_tcp [world_size = 2] [port = 29650]
//          bench_comm_tcp --rank R --world-size P --leader HOST [--port N]: one rank only, the
//          others started apart (bench/run_comm_tcp_netns.sh: one network namespace per rank,
//          each behind its own rate-limited link, as pods on separate hosts)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/bootstrap.h"

namespace {

int run_rank(int rank, int size, int port, const std::string& leader) {
  auto world = snap::comm::World::make(rank, size);
  if (!world.ok()) return 1;
  snap::comm::CommOptions options;
  options.leader_host = leader;
  options.port = port;
  auto made = snap::comm::make_communicator(snap::comm::CommKind::tcp, world.value(), options);
  if (!made.ok()) {
    std::fprintf(stderr, "bench_comm_tcp rank %d: %s\n", rank, made.status().to_string().c_str());
    return 1;
  }
  snap::comm::Communicator& comm = *made.value();
  if (rank == 0) std::printf("bench_comm_tcp: all_reduce_sum f32 over tcp, %d ranks, leader %s\n", size, leader.c_str());
  const struct {
    const char* what;
    int64_t count;
    int iterations;
  } sizes[] = {{"1 token x 576", 576, 2000},
               {"1 token x 4096", 4096, 2000},
               {"512 tokens x 576", 512 * 576, 200},
               {"2048 tokens x 4096", 2048 * 4096, 20}};
  for (const auto& s : sizes) {
    std::vector<float> buf(static_cast<size_t>(s.count), 1.0f + static_cast<float>(rank));
    std::vector<double> us;
    for (int i = 0; i < s.iterations + 2; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const snap::Status st = comm.all_reduce_sum(buf.data(), s.count, snap::DType::f32);
      const auto t1 = std::chrono::steady_clock::now();
      if (!st.ok()) {
        std::fprintf(stderr, "bench_comm_tcp rank %d: %s\n", rank, st.to_string().c_str());
        return 1;
      }
      if (i >= 2) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      std::fill(buf.begin(), buf.end(), 1.0f + static_cast<float>(rank));
    }
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    if (rank == 0)
      std::printf("  %-20s %10.1f us  %7.2f GB/s payload\n", s.what, med, 4.0 * s.count / (med * 1e-6) / 1e9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--rank") {
    int rank = -1, size = 0, port = 29650;
    std::string leader;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--rank") rank = std::atoi(argv[i + 1]);
      else if (flag == "--world-size") size = std::atoi(argv[i + 1]);
      else if (flag == "--leader") leader = argv[i + 1];
      else if (flag == "--port") port = std::atoi(argv[i + 1]);
      else {
        std::fprintf(stderr, "bench_comm_tcp: unknown flag %s\n", flag.c_str());
        return 2;
      }
    }
    if (rank < 0 || size < 2 || rank >= size || leader.empty()) {
      std::fprintf(stderr, "usage: bench_comm_tcp --rank R --world-size P (>= 2) --leader HOST [--port N]\n");
      return 2;
    }
    return run_rank(rank, size, port, leader);
  }
  const int size = argc > 1 ? std::atoi(argv[1]) : 2;
  const int port = argc > 2 ? std::atoi(argv[2]) : 29650;
  if (size < 2) {
    std::fprintf(stderr, "usage: bench_comm_tcp [world_size >= 2] [port]\n");
    return 2;
  }
  std::vector<pid_t> kids;
  for (int r = 1; r < size; ++r) {
    const pid_t pid = fork();
    if (pid == 0) std::_Exit(run_rank(r, size, port, "127.0.0.1"));
    kids.push_back(pid);
  }
  int rc = run_rank(0, size, port, "127.0.0.1");
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}
