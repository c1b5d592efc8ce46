// In-process comm tests (no mpirun): World validation, launcher detection from an
// environment map, the single-process backend and its counters, and the TCP rendezvous
// with threads on loopback (success, timeout with a missing rank, no leader, bad size).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/world.h"
#include "tests/free_port.h"

namespace snap::comm {
namespace {

// ---------------------------------------------------------------------------- World

TEST(World, DefaultIsOneProcess) {
  World w;
  EXPECT_EQ(w.rank(), 0);
  EXPECT_EQ(w.size(), 1);
  EXPECT_EQ(w.tp_size(), 1);
  EXPECT_TRUE(w.is_leader());
  EXPECT_TRUE(w.is_single());
}

TEST(World, TpGroupsAreConsecutiveRanks) {
  Result<World> w = World::make(5, 8, 4, 1);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->tp_rank(), 1);
  EXPECT_EQ(w->tp_group(), 1);
  EXPECT_EQ(w->num_tp_groups(), 2);
  EXPECT_FALSE(w->is_leader());
  EXPECT_FALSE(w->is_tp_leader());
  EXPECT_EQ(w->local_rank(), 1);
  Result<World> whole = World::make(2, 3);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->tp_size(), 3);
  EXPECT_EQ(whole->tp_rank(), 2);
}

TEST(World, RejectsBadLayouts) {
  EXPECT_FALSE(World::make(0, 0).ok());
  EXPECT_FALSE(World::make(4, 4).ok());
  EXPECT_FALSE(World::make(-1, 4).ok());
  Result<World> w = World::make(0, 6, 4);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("tp size 4 does not divide world size 6"), std::string::npos)
      << w.status().message();
}

// ----------------------------------------------------------------- launcher detection

TEST(LaunchFromEnvironment, NothingMeansSingleProcess) {
  Result<LaunchInfo> info = launch_from_environment({});
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->launcher, Launcher::single);
  EXPECT_EQ(info->world, World());
}

TEST(LaunchFromEnvironment, Mpirun) {
  Result<LaunchInfo> info = launch_from_environment(
      {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
       {"PMIX_RANK", "2"}});
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->launcher, Launcher::mpirun);
  EXPECT_EQ(info->world.rank(), 2);
  EXPECT_EQ(info->world.size(), 4);
  EXPECT_EQ(info->world.tp_size(), 4);
  EXPECT_TRUE(info->leader_host.empty());
}

TEST(LaunchFromEnvironment, SlurmPmixAndStep) {
  Result<LaunchInfo> pmix = launch_from_environment(
      {{"PMIX_RANK", "1"}, {"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "3"}, {"SLURM_NTASKS", "8"},
       {"SLURM_LOCALID", "1"}});
  ASSERT_TRUE(pmix.ok()) << pmix.status().to_string();
  EXPECT_EQ(pmix->launcher, Launcher::slurm);
  EXPECT_EQ(pmix->world.rank(), 1);
  EXPECT_EQ(pmix->world.size(), 3);
  EXPECT_EQ(pmix->world.local_rank(), 1);
  Result<LaunchInfo> step =
      launch_from_environment({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "2"}});
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  EXPECT_EQ(step->world.size(), 2);
}

TEST(LaunchFromEnvironment, SlurmBatchScriptIsNotALaunch) {
  Result<LaunchInfo> info = launch_from_environment({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}});
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->launcher, Launcher::single);
}

TEST(LaunchFromEnvironment, LeaderWorkerSet) {
  Result<LaunchInfo> info = launch_from_environment(
      {{"LWS_LEADER_ADDRESS", "snap-0.snap"}, {"LWS_GROUP_SIZE", "4"}, {"LWS_WORKER_INDEX", "3"}});
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->launcher, Launcher::lws);
  EXPECT_EQ(info->world.rank(), 3);
  EXPECT_EQ(info->world.size(), 4);
  EXPECT_EQ(info->leader_host, "snap-0.snap");
  EXPECT_EQ(info->port, k_default_rendezvous_port);
  Result<LaunchInfo> port = launch_from_environment({{"LWS_LEADER_ADDRESS", "h"}, {"LWS_GROUP_SIZE", "2"},
                                                     {"LWS_WORKER_INDEX", "0"}, {"SNAP_RENDEZVOUS_PORT", "4000"}});
  ASSERT_TRUE(port.ok());
  EXPECT_EQ(port->port, 4000);
}

TEST(LaunchFromEnvironment, FlagsWinOverEnvironment) {
  WorldFlags flags;
  flags.rank = 1;
  flags.world_size = 2;
  flags.tp_size = 2;
  flags.leader_host = "10.0.0.7";
  flags.port = 5000;
  Result<LaunchInfo> info = launch_from_environment({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, flags);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->launcher, Launcher::flags);
  EXPECT_EQ(info->world.rank(), 1);
  EXPECT_EQ(info->world.size(), 2);
  EXPECT_EQ(info->leader_host, "10.0.0.7");
  EXPECT_EQ(info->port, 5000);
}

TEST(LaunchFromEnvironment, BadValuesNameTheVariable) {
  auto message = [](const Environment& env, const WorldFlags& flags = {}) {
    Result<LaunchInfo> info = launch_from_environment(env, flags);
    EXPECT_FALSE(info.ok());
    return info.ok() ? std::string() : info.status().message();
  };
  EXPECT_NE(message({{"OMPI_COMM_WORLD_RANK", "x1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).find("OMPI_COMM_WORLD_RANK='x1'"),
            std::string::npos);
  EXPECT_NE(message({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).find("rank 3 is outside [0, 2)"),
            std::string::npos);
  EXPECT_NE(message({{"LWS_GROUP_SIZE", "2"}, {"LWS_WORKER_INDEX", "1"}}).find("LWS_LEADER_ADDRESS"),
            std::string::npos);
  WorldFlags half;
  half.rank = 0;
  EXPECT_NE(message({}, half).find("--rank and --world-size"), std::string::npos);
  WorldFlags no_leader;
  no_leader.rank = 0;
  no_leader.world_size = 2;
  EXPECT_NE(message({}, no_leader).find("--leader"), std::string::npos);
  WorldFlags bad_tp;
  bad_tp.tp_size = 3;
  EXPECT_NE(message({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, bad_tp).find("tp size 3"),
            std::string::npos);
}

TEST(CommKind, ParsesNames) {
  EXPECT_EQ(parse_comm_kind("mpi").value(), CommKind::mpi);
  EXPECT_EQ(parse_comm_kind("single").value(), CommKind::single);
  EXPECT_EQ(parse_comm_kind("nccl").value(), CommKind::nccl);
  EXPECT_FALSE(parse_comm_kind("gloo").ok());
}

// ----------------------------------------------------------------- single backend

TEST(SingleCommunicator, CollectivesOverOneRank) {
  Result<std::unique_ptr<Communicator>> made = make_communicator(CommKind::single, World());
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Communicator& comm = *made.value();
  EXPECT_STREQ(comm.backend_name(), "single");
  std::vector<float> x = {1.5f, -2.0f, 3.25f, 1e-30f, 7.0f, -0.0f, 8.5f};
  const std::vector<float> before = x;
  ASSERT_TRUE(comm.all_reduce_sum(x.data(), x.size(), DType::f32).ok());
  EXPECT_EQ(0, std::memcmp(x.data(), before.data(), x.size() * 4));
  std::vector<uint16_t> h = {0x3f80, 0xc000, 0x7f80};
  ASSERT_TRUE(comm.all_reduce_sum(h.data(), h.size(), DType::bf16).ok());
  EXPECT_EQ(h, (std::vector<uint16_t>{0x3f80, 0xc000, 0x7f80}));
  std::vector<float> gathered(x.size(), 0.0f);
  ASSERT_TRUE(comm.all_gather(x.data(), gathered.data(), x.size(), DType::f32).ok());
  EXPECT_EQ(0, std::memcmp(gathered.data(), x.data(), x.size() * 4));
  ASSERT_TRUE(comm.broadcast(std::span<float>(x), 0).ok());
  ASSERT_TRUE(comm.barrier().ok());
}

TEST(SingleCommunicator, CountsPayloadBytesPerOp) {
  auto comm = std::move(make_communicator(CommKind::single, World()).value());
  std::vector<float> f(4097);
  std::vector<uint16_t> b(100000);
  std::vector<float> out(4097);
  for (int layer = 0; layer < 30; ++layer) {
    ASSERT_TRUE(comm->all_reduce_sum(f.data(), 576, DType::f32).ok());
    ASSERT_TRUE(comm->all_reduce_sum(b.data(), 576, DType::bf16).ok());
  }
  ASSERT_TRUE(comm->all_gather(f.data(), out.data(), 7, DType::f32).ok());
  ASSERT_TRUE(comm->broadcast(b.data(), 100000, DType::bf16, 0).ok());
  ASSERT_TRUE(comm->broadcast_bytes(b.data(), 13, 0).ok());
  ASSERT_TRUE(comm->barrier().ok());
  const CommStats s = comm->stats();
  EXPECT_EQ(s[CommOp::all_reduce_sum].calls, 60);
  EXPECT_EQ(s[CommOp::all_reduce_sum].bytes, 30 * 576 * 4 + 30 * 576 * 2);
  EXPECT_EQ(s[CommOp::all_gather].calls, 1);
  EXPECT_EQ(s[CommOp::all_gather].bytes, 7 * 4);
  EXPECT_EQ(s[CommOp::broadcast].calls, 2);
  EXPECT_EQ(s[CommOp::broadcast].bytes, 100000 * 2 + 13);
  EXPECT_EQ(s[CommOp::barrier].calls, 1);
  EXPECT_EQ(s[CommOp::barrier].bytes, 0);
  EXPECT_EQ(s.total_bytes(), 30 * 576 * 6 + 28 + 200013);
  comm->reset_stats();
  EXPECT_EQ(comm->stats().total_bytes(), 0);
}

TEST(SingleCommunicator, BadArgumentsFailAndAreNotCounted) {
  auto comm = std::move(make_communicator(CommKind::single, World()).value());
  std::vector<float> f(8);
  Status q = comm->all_reduce_sum(f.data(), 8, DType::q4_0);
  EXPECT_EQ(q.code(), StatusCode::k_invalid_argument);
  EXPECT_NE(q.message().find("q4_0"), std::string::npos) << q.message();
  EXPECT_FALSE(comm->all_reduce_sum(nullptr, 8, DType::f32).ok());
  EXPECT_FALSE(comm->all_reduce_sum(f.data(), -1, DType::f32).ok());
  Status root = comm->broadcast(f.data(), 8, DType::f32, 1);
  EXPECT_NE(root.message().find("root 1 is outside the group [0, 1)"), std::string::npos) << root.message();
  EXPECT_EQ(comm->stats().total_bytes(), 0);
  EXPECT_EQ(comm->stats()[CommOp::all_reduce_sum].calls, 0);
  EXPECT_FALSE(make_communicator(CommKind::single, World::make(0, 2).value()).ok());
}

TEST(SumBlocksInRankOrder, RoundsOnceAtTheEnd) {
  // Three bf16 blocks: 1 + 2^-8 + 2^-8. Rounding after each add would give 1 twice
  // (1 + 2^-8 is a tie that rounds to even 1); rounding once gives 1 + 2^-7.
  std::vector<uint16_t> blocks = {f32_to_bf16(1.0f), f32_to_bf16(0.00390625f), f32_to_bf16(0.00390625f)};
  uint16_t out = 0;
  sum_blocks_in_rank_order(blocks.data(), 3, 1, 1, DType::bf16, &out);
  EXPECT_EQ(bf16_to_f32(out), 1.0078125f);
  // f32, order matters: (1e20 + -1e20) + 1 = 1, whereas 1e20 + (-1e20 + 1) = 0.
  std::vector<float> f = {1e20f, -1e20f, 1.0f};
  float sum = 0.0f;
  sum_blocks_in_rank_order(f.data(), 3, 1, 1, DType::f32, &sum);
  EXPECT_EQ(sum, 1.0f);
}

TEST(RankChunks, ConsecutiveFirstRanksOneLonger) {
  // 10 over 4: 3, 3, 2, 2 at 0, 3, 6, 8 (the MPI and NCCL reduce-scatter owners).
  const std::vector<RankChunk> c = rank_chunks(10, 4);
  ASSERT_EQ(c.size(), 4u);
  const int64_t want_offset[] = {0, 3, 6, 8}, want_length[] = {3, 3, 2, 2};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(c[r].offset, want_offset[r]) << "rank " << r;
    EXPECT_EQ(c[r].length, want_length[r]) << "rank " << r;
  }
  // Fewer elements than ranks: the last ranks own nothing; every count is covered once.
  for (int64_t count : {0, 1, 2, 7, 576, 4097}) {
    for (int p : {1, 2, 3, 8}) {
      const std::vector<RankChunk> k = rank_chunks(count, p);
      int64_t next = 0;
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(k[r].offset, next) << count << " over " << p << ", rank " << r;
        EXPECT_LE(k[r].length, (count + p - 1) / p);
        EXPECT_GE(k[r].length, count / p);
        next += k[r].length;
      }
      EXPECT_EQ(next, count) << count << " over " << p;
    }
  }
}

// ----------------------------------------------------------------- TCP rendezvous

TEST(TcpRendezvous, ThreeRanksReceiveTheLeadersBlob) {
  const int port = snap::testing::free_port();
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<Result<std::vector<uint8_t>>> got(3, Result<std::vector<uint8_t>>(internal_error("not run")));
  std::vector<std::thread> ranks;
  // Workers first: they must retry until the leader listens.
  for (int r : {2, 1, 0}) {
    ranks.emplace_back([&, r] {
      std::vector<uint8_t> mine = r == 0 ? id : std::vector<uint8_t>{};
      got[r] = tcp_rendezvous("127.0.0.1", port, r, 3, mine, std::chrono::seconds(20));
    });
    if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status().to_string();
    EXPECT_EQ(got[r].value(), id) << "rank " << r;
  }
}

TEST(TcpRendezvous, LeaderTimesOutWhenARankNeverShows) {
  const int port = snap::testing::free_port();
  std::vector<uint8_t> id(128, 7);
  Result<std::vector<uint8_t>> leader(internal_error("not run"));
  Result<std::vector<uint8_t>> worker(internal_error("not run"));
  std::thread t0([&] { leader = tcp_rendezvous("127.0.0.1", port, 0, 4, id, std::chrono::milliseconds(1500)); });
  // The worker waits longer than the leader, so it hears the leader's verdict.
  std::thread t1([&] { worker = tcp_rendezvous("127.0.0.1", port, 1, 4, {}, std::chrono::seconds(10)); });
  t0.join();
  t1.join();
  ASSERT_FALSE(leader.ok());
  EXPECT_EQ(leader.status().message(),
            "comm/rendezvous: rendezvous with 127.0.0.1:" + std::to_string(port) +
                " timed out after 1.5 s: 2 of 4 ranks joined");
  ASSERT_FALSE(worker.ok());
  EXPECT_NE(worker.status().message().find("rank 0 timed out waiting for the others: 2 of 4 ranks joined"),
            std::string::npos)
      << worker.status().message();
}

TEST(TcpRendezvous, WorkerTimesOutWithoutALeader) {
  const int port = snap::testing::free_port();
  Result<std::vector<uint8_t>> worker = tcp_rendezvous("127.0.0.1", port, 2, 3, {}, std::chrono::seconds(1));
  ASSERT_FALSE(worker.ok());
  EXPECT_NE(worker.status().message().find("timed out after 1 s: rank 2 could not connect (Connection refused)"),
            std::string::npos)
      << worker.status().message();
}

TEST(TcpRendezvous, MismatchedWorldSizeFailsOnBothSides) {
  const int port = snap::testing::free_port();
  Result<std::vector<uint8_t>> leader(internal_error("not run"));
  Result<std::vector<uint8_t>> worker(internal_error("not run"));
  std::vector<uint8_t> id(16, 1);
  std::thread t0([&] { leader = tcp_rendezvous("127.0.0.1", port, 0, 2, id, std::chrono::seconds(10)); });
  std::thread t1([&] { worker = tcp_rendezvous("127.0.0.1", port, 1, 3, {}, std::chrono::seconds(10)); });
  t0.join();
  t1.join();
  ASSERT_FALSE(leader.ok());
  EXPECT_NE(leader.status().message().find("rank 1 says world size 3, rank 0 has 2"), std::string::npos)
      << leader.status().message();
  ASSERT_FALSE(worker.ok());
  EXPECT_NE(worker.status().message().find("different world size"), std::string::npos) << worker.status().message();
}

TEST(TcpRendezvous, RejectsBadArguments) {
  EXPECT_FALSE(tcp_rendezvous("127.0.0.1", 0, 0, 2, {}, std::chrono::seconds(1)).ok());
  EXPECT_FALSE(tcp_rendezvous("127.0.0.1", 5000, 2, 2, {}, std::chrono::seconds(1)).ok());
  std::vector<uint8_t> one = {42};
  Result<std::vector<uint8_t>> solo = tcp_rendezvous("unused", 5000, 0, 1, one, std::chrono::seconds(1));
  ASSERT_TRUE(solo.ok());
  EXPECT_EQ(solo.value(), one);
}

}  // namespace
}  // namespace snap::comm
