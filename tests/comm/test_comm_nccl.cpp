// NCCL backend on device buffers. Exits 77 (skipped) without a GPU. With one GPU: a
// group of one (collectives leave the data as the documented order says). With 2+ GPUs:
// one thread per GPU, ids exchanged through the TCP rendezvous on loopback, all-reduce
// bits equal the host rank-order reference (the same bits the MPI backend gives).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "tests/free_port.h"

namespace snap::comm {
namespace {

int g_num_devices = 0;

float input_value(int rank, int64_t i) {
  const uint64_t h = (static_cast<uint64_t>(rank) * 2654435761u + i * 40503u) % 1000003u;
  return std::ldexp(1.0f + static_cast<float>(h % 1024) / 1024.0f, static_cast<int>(h % 17) - 8) *
         ((h & 1) ? -1.0f : 1.0f);
}

std::vector<uint16_t> bf16_input(int rank, int64_t count) {
  std::vector<uint16_t> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = f32_to_bf16(input_value(rank, i));
  return v;
}

// One rank: device all-reduce of bf16 `count`, copied back to host.
Status run_rank(const World& world, const CommOptions& options, int64_t count, std::vector<uint16_t>* out) {
  SNAP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, make_communicator(CommKind::nccl, world, options));
  std::vector<uint16_t> host = bf16_input(world.rank(), count);
  void* dev = nullptr;
  if (cudaMalloc(&dev, count * 2) != cudaSuccess) return internal_error("cudaMalloc");
  cudaMemcpy(dev, host.data(), count * 2, cudaMemcpyHostToDevice);
  Status s = comm->all_reduce_sum(dev, count, DType::bf16);
  out->resize(count);
  cudaMemcpy(out->data(), dev, count * 2, cudaMemcpyDeviceToHost);
  cudaFree(dev);
  return s;
}

TEST(NcclCommunicator, GroupOfOneKeepsTheData) {
  CommOptions options;
  options.device = 0;
  for (int64_t count : {1, 7, 4097, 100000}) {
    std::vector<uint16_t> out;
    ASSERT_TRUE(run_rank(World(), options, count, &out).ok());
    EXPECT_EQ(out, bf16_input(0, count)) << "count " << count;
  }
}

TEST(NcclCommunicator, AllReduceMatchesHostRankOrder) {
  const int p = std::min(g_num_devices, 4);
  if (p < 2) GTEST_SKIP() << "needs 2+ GPUs";
  const int port = snap::testing::free_port();
  for (int64_t count : {7, 100000}) {
    std::vector<std::vector<uint16_t>> outs(p);
    std::vector<Status> statuses(p);
    std::vector<std::thread> threads;
    for (int r = 0; r < p; ++r) {
      threads.emplace_back([&, r] {
        CommOptions options;
        options.leader_host = "127.0.0.1";
        options.port = port;
        options.device = r;
        options.rendezvous_timeout = std::chrono::seconds(60);
        statuses[r] = run_rank(World::make(r, p).value(), options, count, &outs[r]);
      });
    }
    for (auto& t : threads) t.join();
    std::vector<uint16_t> blocks;
    for (int r = 0; r < p; ++r) {
      auto in = bf16_input(r, count);
      blocks.insert(blocks.end(), in.begin(), in.end());
    }
    std::vector<uint16_t> ref(count);
    sum_blocks_in_rank_order(blocks.data(), p, count, count, DType::bf16, ref.data());
    for (int r = 0; r < p; ++r) {
      ASSERT_TRUE(statuses[r].ok()) << statuses[r].to_string();
      EXPECT_EQ(outs[r], ref) << "rank " << r << " count " << count;
    }
  }
}

}  // namespace
}  // namespace snap::comm

int main(int argc, char** argv) {
  const cudaError_t e = cudaGetDeviceCount(&snap::comm::g_num_devices);
  if (e != cudaSuccess || snap::comm::g_num_devices == 0) {
    std::printf("no CUDA device (%s): skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
