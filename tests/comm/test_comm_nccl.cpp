// NCCL backend on device buffers. Exits 77 (skipped) without a GPU. With one GPU: the device
// rank-order sum kernel against the host reference (tests/comm/collective_reference.h) for
// 1-8 blocks, and a group of one, which runs the whole reduce-scatter/all-gather path (the
// copy into the slots and the sum kernel; nothing to send). With 2+ GPUs:
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
#include "comm/nccl_sum.h"
#include "tests/comm/collective_reference.h"
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

// The kernel every NCCL all-reduce ends in, on its own: P blocks at a stride wider than the
// count (the reduce-scatter's slots), every dtype, awkward counts, the documented order.
TEST(NcclSumKernel, MatchesHostRankOrder) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int blocks : {1, 2, 3, 8}) {
      for (int64_t count : {1, 7, 83, 769, 5125}) {
        const int64_t stride = count + 3, elem = dtype_size(dtype);
        const uint64_t salt = static_cast<uint64_t>(blocks * 100000 + count);
        std::vector<uint8_t> host(static_cast<size_t>(blocks * stride * elem), 0xff);
        for (int r = 0; r < blocks; ++r) {
          const std::vector<uint8_t> in = reference::make_input(r, count, dtype, salt);
          std::memcpy(host.data() + r * stride * elem, in.data(), in.size());
        }
        void* dev_blocks = nullptr;
        void* dev_out = nullptr;
        ASSERT_EQ(cudaMalloc(&dev_blocks, host.size()), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dev_out, count * elem), cudaSuccess);
        cudaMemcpy(dev_blocks, host.data(), host.size(), cudaMemcpyHostToDevice);
        const auto type = dtype == DType::f32    ? detail::NcclSumType::f32
                          : dtype == DType::bf16 ? detail::NcclSumType::bf16
                                                 : detail::NcclSumType::f16;
        ASSERT_EQ(detail::nccl_sum_blocks_rank_order(dev_blocks, blocks, stride, count, type, dev_out, nullptr),
                  cudaSuccess);
        std::vector<uint8_t> got(static_cast<size_t>(count * elem));
        ASSERT_EQ(cudaMemcpy(got.data(), dev_out, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(dev_blocks);
        cudaFree(dev_out);
        const std::vector<uint8_t> want = reference::reference_sum(0, blocks, count, dtype, salt);
        const int64_t bad = reference::first_mismatch(got, want, dtype);
        EXPECT_EQ(bad, -1) << dtype_name(dtype) << " blocks " << blocks << " count " << count << ": element " << bad
                           << " is " << (bad >= 0 ? reference::element(got, bad, dtype) : 0.0f) << ", want "
                           << (bad >= 0 ? reference::element(want, bad, dtype) : 0.0f);
      }
    }
  }
}

// A group of one through the all-reduce's whole path: the bytes come back as the rank-order
// sum of one block (the identity, NaN quieted), and the counters count the payload.
TEST(NcclCommunicator, GroupOfOneRunsTheWholePath) {
  CommOptions options;
  options.device = 0;
  auto comm = make_communicator(CommKind::nccl, World(), options);
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  for (int64_t count : {1, 7, 4097, 100000}) {
    const std::vector<uint8_t> in = reference::make_input(0, count, DType::f32, 7);
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, in.size()), cudaSuccess);
    cudaMemcpy(dev, in.data(), in.size(), cudaMemcpyHostToDevice);
    ASSERT_TRUE((*comm)->all_reduce_sum(dev, count, DType::f32).ok());
    std::vector<uint8_t> out(in.size());
    cudaMemcpy(out.data(), dev, out.size(), cudaMemcpyDeviceToHost);
    cudaFree(dev);
    EXPECT_EQ(reference::first_mismatch(out, reference::reference_sum(0, 1, count, DType::f32, 7), DType::f32), -1)
        << "count " << count;
  }
  EXPECT_EQ((*comm)->stats()[CommOp::all_reduce_sum].bytes, 4 * (1 + 7 + 4097 + 100000));
}

TEST(NcclCommunicator, AllReduceMatchesHostRankOrder) {
  const int p = std::min(g_num_devices, 4);
  if (p < 2) GTEST_SKIP() << "needs 2+ GPUs";
  const int port = snap::testing::free_port();
  for (int64_t count : {1, 3, 7, 100000}) {  // fewer elements than ranks too: empty chunks
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
