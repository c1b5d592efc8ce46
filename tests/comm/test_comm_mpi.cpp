// MPI backend under mpirun (ctest: -np 2, 3, 4; srun: -n 2, 3): every collective on awkward
// sizes and dtypes equals a reference computed locally in the documented rank order, bit
// for bit, on every rank and through both all-reduce algorithms; exact byte counters;
// barrier, world detection, tp sub-groups and argument errors. Every rank runs every test.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "tests/comm/collective_reference.h"

namespace snap::comm {
namespace {

Communicator* g_comm = nullptr;  // made in main, over the whole world

const int64_t k_sizes[] = {1, 7, 4097, 100000};
const DType k_dtypes[] = {DType::f32, DType::bf16, DType::f16};

using namespace reference;  // inputs and the rank-order reference (collective_reference.h)


uint64_t hash_bytes(const std::vector<uint8_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : v) h = (h ^ b) * 1099511628211ull;
  return h;
}

// True when every rank of `comm` holds the same `h`.
bool same_on_all_ranks(Communicator& comm, uint64_t h) {
  bool same = true;
  for (int root = 0; root < comm.group_size(); ++root) {
    uint64_t theirs = h;
    EXPECT_TRUE(comm.broadcast_bytes(&theirs, sizeof theirs, root).ok());
    same = same && theirs == h;
  }
  return same;
}

std::unique_ptr<Communicator> make_mpi(const World& world, int64_t small_bytes) {
  CommOptions options;
  options.mpi_small_all_reduce_bytes = small_bytes;
  Result<std::unique_ptr<Communicator>> made = make_communicator(CommKind::mpi, world, options);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  return made.ok() ? std::move(made.value()) : nullptr;
}

// ---------------------------------------------------------------------------------

// ctest names the launcher it used in SNAP_TEST_EXPECT_LAUNCHER (the srun tests: slurm);
// mpirun when unset.
TEST(MpiWorld, FromEnvironmentMatchesTheLauncher) {
  Result<LaunchInfo> info = launch_from_environment(process_environment());
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  const char* expected = std::getenv("SNAP_TEST_EXPECT_LAUNCHER");
  EXPECT_STREQ(launcher_name(info->launcher), expected != nullptr ? expected : "mpirun");
  int rank = -1;
  int size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(info->world.rank(), rank);
  EXPECT_EQ(info->world.size(), size);
  EXPECT_EQ(info->world.tp_size(), size);
  EXPECT_EQ(g_comm->world(), info->world);
  EXPECT_STREQ(g_comm->backend_name(), "mpi");
}

TEST(MpiWorld, RejectsAWorldThatDisagreesWithMpi) {
  Result<World> wrong = World::make(0, g_comm->world().size() + 1);
  ASSERT_TRUE(wrong.ok());
  Result<std::unique_ptr<Communicator>> made = make_communicator(CommKind::mpi, wrong.value());
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("MPI_COMM_WORLD has rank"), std::string::npos) << made.status().message();
}

// Both algorithms (one-round gather, two-round reduce-scatter/all-gather) and the default
// switch-over, every size and dtype: the documented order, bit for bit, on every rank.
TEST(MpiAllReduceSum, EqualsRankOrderReferenceBitForBit) {
  const World world = g_comm->world();
  const int p = world.size();
  struct Path {
    const char* name;
    int64_t small_bytes;
  };
  const Path paths[] = {{"default", CommOptions().mpi_small_all_reduce_bytes}, {"gather", INT64_MAX}, {"two-round", 0}};
  for (const Path& path : paths) {
    std::unique_ptr<Communicator> comm = make_mpi(world, path.small_bytes);
    ASSERT_NE(comm, nullptr);
    uint64_t salt = 1;
    for (DType dtype : k_dtypes) {
      for (int64_t count : k_sizes) {
        SCOPED_TRACE(std::string(path.name) + " " + dtype_name(dtype) + " count " + std::to_string(count));
        std::vector<uint8_t> buf = make_input(world.rank(), count, dtype, salt);
        ASSERT_TRUE(comm->all_reduce_sum(buf.data(), count, dtype).ok());
        const std::vector<uint8_t> ref = reference_sum(0, p, count, dtype, salt);
        const int64_t bad = first_mismatch(buf, ref, dtype);
        EXPECT_EQ(bad, -1) << "rank " << world.rank() << " element " << bad << ": got " << element(buf, bad, dtype)
                           << ", reference " << element(ref, bad, dtype);
        EXPECT_TRUE(same_on_all_ranks(*comm, hash_bytes(buf)));
        ++salt;
      }
    }
  }
}

// The reference is only worth matching if order matters: with 3+ ranks, the reversed
// order gives different f32 bits somewhere (with 2, a + b == b + a exactly).
TEST(MpiAllReduceSum, ReferenceIsOrderSensitive) {
  const int p = g_comm->world().size();
  if (p < 3) GTEST_SKIP() << "addition of two terms is commutative";
  const auto fwd = reference_sum(0, p, 100000, DType::f32, 99);
  const auto rev = reference_sum(0, p, 100000, DType::f32, 99, /*reversed=*/true);
  EXPECT_NE(first_mismatch(fwd, rev, DType::f32), -1);
}

TEST(MpiAllGather, BlocksArriveInRankOrder) {
  const int p = g_comm->world().size();
  uint64_t salt = 500;
  for (DType dtype : k_dtypes) {
    for (int64_t count : k_sizes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " count " + std::to_string(count));
      const std::vector<uint8_t> mine = make_input(g_comm->world().rank(), count, dtype, salt);
      std::vector<uint8_t> all(p * mine.size(), 0xAB);
      ASSERT_TRUE(g_comm->all_gather(mine.data(), all.data(), count, dtype).ok());
      for (int r = 0; r < p; ++r) {
        const std::vector<uint8_t> expect = make_input(r, count, dtype, salt);
        const std::vector<uint8_t> block(all.begin() + r * expect.size(), all.begin() + (r + 1) * expect.size());
        EXPECT_EQ(first_mismatch(block, expect, dtype), -1) << "block of rank " << r;
      }
      ++salt;
    }
  }
}

TEST(MpiBroadcast, EveryRootReachesEveryRank) {
  const int p = g_comm->world().size();
  uint64_t salt = 900;
  for (int root = 0; root < p; ++root) {
    for (DType dtype : k_dtypes) {
      for (int64_t count : k_sizes) {
        SCOPED_TRACE("root " + std::to_string(root) + " " + dtype_name(dtype) + " count " + std::to_string(count));
        std::vector<uint8_t> buf = make_input(g_comm->world().rank(), count, dtype, salt);
        ASSERT_TRUE(g_comm->broadcast(buf.data(), count, dtype, root).ok());
        EXPECT_EQ(first_mismatch(buf, make_input(root, count, dtype, salt), dtype), -1);
        ++salt;
      }
    }
  }
}

// Files written before the barrier are all visible after it. Rank r waits r × 50 ms
// before writing, so a barrier that returned early would miss the slow ranks' files.
TEST(MpiBarrier, NoRankLeavesBeforeAllArrive) {
  const World world = g_comm->world();
  char dir[256] = {};
  if (world.is_leader()) {
    std::string templ = (std::filesystem::temp_directory_path() / "snap_barrier_XXXXXX").string();
    std::strncpy(dir, templ.c_str(), sizeof dir - 1);
    ASSERT_NE(::mkdtemp(dir), nullptr);
  }
  ASSERT_TRUE(g_comm->broadcast_bytes(dir, sizeof dir, 0).ok());
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50 * world.rank()));
    const std::string mine = std::string(dir) + "/" + std::to_string(round) + "_" + std::to_string(world.rank());
    std::ofstream(mine) << "x";
    ASSERT_TRUE(g_comm->barrier().ok());
    for (int r = 0; r < world.size(); ++r) {
      EXPECT_TRUE(std::filesystem::exists(std::string(dir) + "/" + std::to_string(round) + "_" + std::to_string(r)))
          << "round " << round << ": rank " << r << "'s file missing after the barrier";
    }
  }
  ASSERT_TRUE(g_comm->barrier().ok());
  if (world.is_leader()) std::filesystem::remove_all(dir);
}

// Counters: payload bytes handed in (count × element size), not wire traffic, and the
// same on every rank. A mock decode of 30 layers × 2 all-reduces of hidden 576.
TEST(MpiStats, CountPayloadBytesExactly) {
  std::unique_ptr<Communicator> comm = make_mpi(g_comm->world(), CommOptions().mpi_small_all_reduce_bytes);
  ASSERT_NE(comm, nullptr);
  const int p = comm->world().size();
  const int64_t layers = 30, tokens = 3, hidden = 576;
  std::vector<float> act(tokens * hidden, 1.0f);
  std::vector<uint16_t> act16(100000, 0);
  for (int64_t l = 0; l < layers; ++l) {
    ASSERT_TRUE(comm->all_reduce_sum(act.data(), tokens * hidden, DType::f32).ok());
    ASSERT_TRUE(comm->all_reduce_sum(act.data(), tokens * hidden, DType::f32).ok());
  }
  ASSERT_TRUE(comm->all_reduce_sum(act16.data(), 100000, DType::bf16).ok());
  std::vector<float> gathered(p * 7);
  ASSERT_TRUE(comm->all_gather(act.data(), gathered.data(), 7, DType::f32).ok());
  ASSERT_TRUE(comm->broadcast(act16.data(), 4097, DType::bf16, p - 1).ok());
  ASSERT_TRUE(comm->barrier().ok());
  ASSERT_FALSE(comm->broadcast(act16.data(), 1, DType::bf16, p).ok());  // bad root: not counted
  const CommStats s = comm->stats();
  EXPECT_EQ(s[CommOp::all_reduce_sum].calls, 2 * layers + 1);
  EXPECT_EQ(s[CommOp::all_reduce_sum].bytes, 2 * layers * tokens * hidden * 4 + 100000 * 2);
  EXPECT_EQ(s[CommOp::all_gather].bytes, 7 * 4);
  EXPECT_EQ(s[CommOp::broadcast].calls, 1);
  EXPECT_EQ(s[CommOp::broadcast].bytes, 4097 * 2);
  EXPECT_EQ(s[CommOp::barrier].calls, 1);
  EXPECT_EQ(s[CommOp::barrier].bytes, 0);
}

// tp_size 2 inside a world of 4: each pair {0,1}, {2,3} reduces on its own.
TEST(MpiTpGroups, AllReduceStaysInsideTheGroup) {
  const World whole = g_comm->world();
  if (whole.size() % 2 != 0 || whole.size() < 4) GTEST_SKIP() << "needs an even world of 4+";
  Result<World> world = World::make(whole.rank(), whole.size(), 2, whole.local_rank());
  ASSERT_TRUE(world.ok());
  std::unique_ptr<Communicator> comm = make_mpi(world.value(), 0);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->group_size(), 2);
  for (int64_t count : k_sizes) {
    std::vector<uint8_t> buf = make_input(whole.rank(), count, DType::f32, 4242);
    ASSERT_TRUE(comm->all_reduce_sum(buf.data(), count, DType::f32).ok());
    const auto ref = reference_sum(world->tp_group() * 2, 2, count, DType::f32, 4242);
    EXPECT_EQ(first_mismatch(buf, ref, DType::f32), -1) << "count " << count;
  }
}

TEST(MpiErrors, BadArgumentsFailBeforeAnyTraffic) {
  std::vector<float> f(8);
  EXPECT_EQ(g_comm->all_reduce_sum(f.data(), 8, DType::q8_0).code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(g_comm->broadcast(f.data(), 8, DType::f32, -1).code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(g_comm->all_gather(f.data(), nullptr, 8, DType::f32).code(), StatusCode::k_invalid_argument);
  // The communicator still works afterwards (no rank was left inside a collective).
  std::vector<float> one = {1.0f};
  ASSERT_TRUE(g_comm->all_reduce_sum(std::span<float>(one)).ok());
  EXPECT_EQ(one[0], static_cast<float>(g_comm->world().size()));
}

// Prints this rank's failures (the default printer runs on rank 0 only).
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed()) std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name(), r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace snap::comm

int main(int argc, char** argv) {
  using namespace snap::comm;
  testing::InitGoogleTest(&argc, argv);
  snap::Result<World> world = world_from_environment();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().to_string().c_str());
    return 1;
  }
  snap::Result<std::unique_ptr<Communicator>> comm = make_communicator(CommKind::mpi, world.value());
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().to_string().c_str());
    return 1;
  }
  g_comm = comm.value().get();
  if (!world->is_leader()) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world->rank()));
  }
  const int rc = RUN_ALL_TESTS();
  comm.value().reset();
  return rc;
}
