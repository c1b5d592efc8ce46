// TCP backend: the test forks P ranks (P = 2, 3, 4) on 127.0.0.1 and each child runs the
// collectives on awkward sizes and dtypes, comparing bit for bit with the documented rank
// order computed locally; exact byte counters; barrier. Failures: a rank killed, exiting
// or calling abort_job mid-loop makes every other rank's collective fail with a message
// naming it, within a bound (a hang check, not a timing); a wrong world size or a missing
// rank is a one-line setup error. Children cannot use gtest (their results would be lost):
// they print what went wrong and report by exit code; the parent asserts on both.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/socket_io.h"
#include "comm/tcp_wire.h"
#include "tests/comm/collective_reference.h"
#include "tests/free_port.h"

namespace snap::comm {
namespace {

using Clock = std::chrono::steady_clock;

// 333333: two ranks' all-reduce in 256 KiB pieces, the last partial. With 3+ ranks the sizes up
// to 5125 go through rank 0 (the star), 100000 and 333333 over the mesh (333333 f32: each rank's
// chunk in two pieces, the chunks one element apart in length).
const int64_t k_sizes[] = {1, 7, 83, 769, 5125, 100000, 333333};
const DType k_dtypes[] = {DType::f32, DType::bf16, DType::f16};

// ------------------------------------------------------------ inputs and the reference

using namespace reference;  // inputs and the rank-order reference (collective_reference.h)


// ------------------------------------------------------------ forking ranks

struct RankOutcome {
  int exit_code = -1;   // -1 when killed by a signal
  int signal = 0;
  bool hung = false;    // still running at the limit (then SIGKILLed)
  std::string output;   // everything the child wrote to stderr
};

// Forks n children; child r runs body(r) with stderr going to a pipe the parent reads,
// and exits with its return value. Children still running after `limit` are killed.
std::vector<RankOutcome> run_ranks(int n, const std::function<int(int)>& body,
                                   std::chrono::seconds limit = std::chrono::seconds(120)) {
  std::vector<pid_t> pids(n, -1);
  std::vector<int> pipes(n, -1);
  std::vector<RankOutcome> out(n);
  std::fflush(stderr);
  for (int r = 0; r < n; ++r) {
    int fds[2];
    if (::pipe(fds) != 0) {
      ADD_FAILURE() << "pipe: " << std::strerror(errno);
      return out;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      for (int q = 0; q < r; ++q) ::close(pipes[q]);
      ::dup2(fds[1], 2);
      ::close(fds[1]);
      const int rc = body(r);
      std::fflush(stderr);
      ::_exit(rc);
    }
    ::close(fds[1]);
    pids[r] = pid;
    pipes[r] = fds[0];
  }
  const auto deadline = Clock::now() + limit;
  int running = n;
  int open_pipes = n;
  while (running > 0 || open_pipes > 0) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int r = 0; r < n; ++r) {
      if (pipes[r] >= 0) {
        fds.push_back({pipes[r], POLLIN, 0});
        who.push_back(r);
      }
    }
    ::poll(fds.data(), fds.size(), 20);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        out[who[i]].output.append(buf, got);
      } else {
        ::close(fds[i].fd);
        pipes[who[i]] = -1;
        --open_pipes;
      }
    }
    for (int r = 0; r < n; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      out[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      out[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      pids[r] = -1;
      --running;
    }
    if (Clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] < 0) continue;
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        out[r].hung = true;
        pids[r] = -1;
        --running;
      }
      for (int r = 0; r < n; ++r) {
        if (pipes[r] >= 0) ::close(pipes[r]);
      }
      break;
    }
  }
  return out;
}

CommOptions loopback_options(int port, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  CommOptions options;
  options.leader_host = "127.0.0.1";
  options.port = port;
  options.rendezvous_timeout = timeout;
  return options;
}

// Child side: counts failed checks, printing each with the rank.
struct Checks {
  int rank;
  int failures = 0;
  bool check(bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      if (failures <= 20) std::fprintf(stderr, "[rank %d] FAILED: %s\n", rank, what.c_str());
    }
    return ok;
  }
  bool ok_status(const Status& s, const std::string& what) { return check(s.ok(), what + ": " + s.to_string()); }
};

// ------------------------------------------------------------ the collectives, per child

void check_all_reduce(Communicator& comm, int p, Checks& c) {
  uint64_t salt = 1;
  for (DType dtype : k_dtypes) {
    for (int64_t count : k_sizes) {
      const std::string what = std::string("all_reduce_sum ") + dtype_name(dtype) + " count " + std::to_string(count);
      std::vector<uint8_t> buf = make_input(c.rank, count, dtype, salt);
      if (c.ok_status(comm.all_reduce_sum(buf.data(), count, dtype), what)) {
        const std::vector<uint8_t> ref = reference_sum(0, p, count, dtype, salt);
        const int64_t bad = first_mismatch(buf, ref, dtype);
        c.check(bad == -1, what + ": element " + std::to_string(bad) + " got " +
                               std::to_string(bad < 0 ? 0 : element(buf, bad, dtype)) + ", reference " +
                               std::to_string(bad < 0 ? 0 : element(ref, bad, dtype)));
      }
      ++salt;
    }
  }
  // The reference is only worth matching if order matters: with 3+ ranks the reversed
  // order gives other f32 bits somewhere (with 2, a + b == b + a exactly).
  if (p >= 3) {
    c.check(first_mismatch(reference_sum(0, p, 100000, DType::f32, 99),
                           reference_sum(0, p, 100000, DType::f32, 99, /*reversed=*/true), DType::f32) != -1,
            "reference is not order-sensitive");
  }
}

void check_all_gather(Communicator& comm, int p, Checks& c) {
  uint64_t salt = 500;
  for (DType dtype : k_dtypes) {
    for (int64_t count : k_sizes) {
      const std::string what = std::string("all_gather ") + dtype_name(dtype) + " count " + std::to_string(count);
      const std::vector<uint8_t> mine = make_input(c.rank, count, dtype, salt);
      std::vector<uint8_t> all(p * mine.size(), 0xAB);
      if (c.ok_status(comm.all_gather(mine.data(), all.data(), count, dtype), what)) {
        for (int r = 0; r < p; ++r) {
          const std::vector<uint8_t> expect = make_input(r, count, dtype, salt);
          const std::vector<uint8_t> block(all.begin() + r * expect.size(), all.begin() + (r + 1) * expect.size());
          c.check(first_mismatch(block, expect, dtype) == -1, what + ": block of rank " + std::to_string(r));
        }
      }
      ++salt;
    }
  }
}

void check_broadcast(Communicator& comm, int p, Checks& c) {
  uint64_t salt = 900;
  for (int root = 0; root < p; ++root) {
    for (DType dtype : k_dtypes) {
      for (int64_t count : {int64_t{1}, int64_t{83}, int64_t{5125}, int64_t{100000}}) {
        const std::string what = "broadcast root " + std::to_string(root) + " " + dtype_name(dtype) + " count " +
                                 std::to_string(count);
        std::vector<uint8_t> buf = make_input(c.rank, count, dtype, salt);
        if (c.ok_status(comm.broadcast(buf.data(), count, dtype, root), what)) {
          c.check(first_mismatch(buf, make_input(root, count, dtype, salt), dtype) == -1, what);
        }
        ++salt;
      }
    }
    // Raw bytes of an odd length, different on every rank before the call.
    std::vector<uint8_t> bytes(1001 + root);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(mix(c.rank * 7919 + i + root));
    std::vector<uint8_t> expect(bytes.size());
    for (size_t i = 0; i < expect.size(); ++i) expect[i] = static_cast<uint8_t>(mix(root * 7919 + i + root));
    const std::string what = "broadcast_bytes root " + std::to_string(root);
    if (c.ok_status(comm.broadcast_bytes(bytes.data(), bytes.size(), root), what)) c.check(bytes == expect, what);
  }
}

// Files written before the barrier are all visible after it. Rank r waits r × 50 ms
// before writing, so a barrier that returned early would miss the slow ranks' files.
void check_barrier(Communicator& comm, int p, Checks& c) {
  char dir[256] = {};
  if (c.rank == 0) {
    const std::string templ = (std::filesystem::temp_directory_path() / "snap_tcp_barrier_XXXXXX").string();
    std::strncpy(dir, templ.c_str(), sizeof dir - 1);
    if (!c.check(::mkdtemp(dir) != nullptr, "mkdtemp")) dir[0] = '\0';
  }
  if (!c.ok_status(comm.broadcast_bytes(dir, sizeof dir, 0), "broadcast of the barrier dir")) return;
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50 * c.rank));
    std::ofstream(std::string(dir) + "/" + std::to_string(round) + "_" + std::to_string(c.rank)) << "x";
    if (!c.ok_status(comm.barrier(), "barrier")) return;
    for (int r = 0; r < p; ++r) {
      c.check(std::filesystem::exists(std::string(dir) + "/" + std::to_string(round) + "_" + std::to_string(r)),
              "round " + std::to_string(round) + ": rank " + std::to_string(r) + "'s file missing after the barrier");
    }
  }
  c.ok_status(comm.barrier(), "final barrier");
  if (c.rank == 0) std::filesystem::remove_all(dir);
}

// Payload bytes handed in (count × element size), not wire traffic, the same on every
// rank: a mock decode of 30 layers × 2 all-reduces of hidden 576, plus one of each op.
void check_stats(Communicator& comm, int p, Checks& c) {
  comm.reset_stats();
  const int64_t layers = 30, tokens = 3, hidden = 576;
  std::vector<float> act(tokens * hidden, 1.0f);
  std::vector<uint16_t> act16(100000, 0);
  for (int64_t l = 0; l < 2 * layers; ++l) {
    std::fill(act.begin(), act.end(), 1.0f);
    c.ok_status(comm.all_reduce_sum(act.data(), tokens * hidden, DType::f32), "stats all_reduce_sum");
  }
  c.check(act[0] == static_cast<float>(p) && act.back() == static_cast<float>(p), "sum of ones is not P");
  c.ok_status(comm.all_reduce_sum(act16.data(), 100000, DType::bf16), "stats bf16 all_reduce_sum");
  std::vector<float> gathered(p * 7);
  c.ok_status(comm.all_gather(act.data(), gathered.data(), 7, DType::f32), "stats all_gather");
  c.ok_status(comm.broadcast(act16.data(), 4097, DType::bf16, p - 1), "stats broadcast");
  uint64_t plan = 42;
  c.ok_status(comm.broadcast_bytes(&plan, sizeof plan, 0), "stats broadcast_bytes");
  c.ok_status(comm.barrier(), "stats barrier");
  // Bad arguments fail on the calling rank before any traffic and are not counted.
  c.check(comm.broadcast(act16.data(), 1, DType::bf16, p).code() == StatusCode::k_invalid_argument, "bad root");
  c.check(comm.all_reduce_sum(act.data(), 8, DType::q8_0).code() == StatusCode::k_invalid_argument, "bad dtype");
  const CommStats s = comm.stats();
  auto expect_eq = [&](int64_t got, int64_t want, const char* what) {
    c.check(got == want, std::string(what) + ": " + std::to_string(got) + " != " + std::to_string(want));
  };
  expect_eq(s[CommOp::all_reduce_sum].calls, 2 * layers + 1, "all_reduce_sum calls");
  expect_eq(s[CommOp::all_reduce_sum].bytes, 2 * layers * tokens * hidden * 4 + 100000 * 2, "all_reduce_sum bytes");
  expect_eq(s[CommOp::all_gather].calls, 1, "all_gather calls");
  expect_eq(s[CommOp::all_gather].bytes, 7 * 4, "all_gather bytes");
  expect_eq(s[CommOp::broadcast].calls, 2, "broadcast calls");
  expect_eq(s[CommOp::broadcast].bytes, 4097 * 2 + 8, "broadcast bytes");
  expect_eq(s[CommOp::barrier].calls, 1, "barrier calls");
  expect_eq(s[CommOp::barrier].bytes, 0, "barrier bytes");
  // Still in step after the refused calls.
  std::vector<float> one = {1.0f};
  c.ok_status(comm.all_reduce_sum(std::span<float>(one)), "all_reduce_sum after bad arguments");
  c.check(one[0] == static_cast<float>(p), "all_reduce_sum after bad arguments");
}

// What each rank puts on the wire (headers included) for one all-reduce: the topology, which
// the bits do not show. 769 f32 (3 KB): a pair swaps one message; 3+ ranks go through rank 0,
// which sends the sum to everyone. 100000 f32 (400 KB): a pair swaps 256 KiB pieces; 3+ ranks
// reduce-scatter and all-gather over the mesh, each rank sending 2(P-1)/P of the block (the
// star through rank 0 sent (P-1)x the block from rank 0).
void check_wire_traffic(Communicator& comm, int p, Checks& c) {
  constexpr int64_t header = 16, piece_floats = (256 << 10) / 4;
  for (int64_t count : {int64_t{769}, int64_t{100000}}) {
    std::vector<float> buf(static_cast<size_t>(count), 1.0f);
    const std::vector<int64_t> before = comm.wire_bytes_sent();
    if (!c.ok_status(comm.all_reduce_sum(std::span<float>(buf)), "wire all_reduce_sum")) return;
    const std::vector<int64_t> after = comm.wire_bytes_sent();
    if (!c.check(before.size() == static_cast<size_t>(p) && after.size() == before.size(), "wire counters per rank"))
      return;
    int64_t sent = 0;
    for (int r = 0; r < p; ++r) sent += after[r] - before[r];
    const int64_t bytes = count * 4;
    int64_t want = 0;
    if (p == 2) {
      want = bytes + (count + piece_floats - 1) / piece_floats * header;
    } else if (bytes <= (64 << 10)) {
      want = c.rank == 0 ? (p - 1) * (bytes + header) : bytes + header;
    } else {
      const auto len = [&](int r) { return count / p + (r < count % p ? 1 : 0); };  // one piece each here
      for (int r = 0; r < p; ++r)
        if (r != c.rank) want += len(r) * 4 + header;  // the reduce-scatter: chunk r to rank r
      want += (p - 1) * (len(c.rank) * 4 + header);    // the all-gather: this rank's summed chunk to everyone
      c.check(want < (p - 1) * bytes, "the mesh's traffic is below the star's at rank 0");
    }
    c.check(sent == want, "all_reduce_sum of " + std::to_string(count) + " floats put " + std::to_string(sent) +
                              " bytes on the wire, expected " + std::to_string(want));
  }
}

int collectives_child(int rank, int p, int port) {
  Checks c{rank};
  Result<World> world = World::make(rank, p);
  if (!world.ok()) return 2;
  Result<std::unique_ptr<Communicator>> made = make_communicator(CommKind::tcp, world.value(), loopback_options(port));
  if (!made.ok()) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, made.status().to_string().c_str());
    return 2;
  }
  Communicator& comm = *made.value();
  c.check(std::string(comm.backend_name()) == "tcp", "backend name");
  c.check(comm.group_size() == p && comm.group_rank() == rank, "group");
  check_all_reduce(comm, p, c);
  check_all_gather(comm, p, c);
  check_broadcast(comm, p, c);
  check_barrier(comm, p, c);
  check_stats(comm, p, c);
  check_wire_traffic(comm, p, c);
  return c.failures == 0 ? 0 : 1;
}

// ------------------------------------------------------------ tests

TEST(TcpCollectives, MatchTheRankOrderReferenceBitForBit) {
  for (int p : {2, 3, 4}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    const int port = snap::testing::free_port();
    const std::vector<RankOutcome> out = run_ranks(p, [&](int rank) { return collectives_child(rank, p, port); });
    for (int r = 0; r < p; ++r) {
      EXPECT_FALSE(out[r].hung) << "rank " << r << " hung\n" << out[r].output;
      EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << " (signal " << out[r].signal << ")\n" << out[r].output;
    }
  }
}

enum class Fault { kill, exit, abort, hang };

constexpr double k_bound_seconds = 10.0;  // a hang check: failures arrive in milliseconds
constexpr int k_fault_round = 50;

// Loops all-reduces (alternating 769 and 100000 f32, so some failures land mid-message);
// `victim` fails at round 50. A survivor prints "error after S s: <message>", then the
// message of one more call (the communicator stays failed), and exits 10.
int fault_child(int rank, int p, int port, int victim, Fault fault) {
  Result<World> world = World::make(rank, p);
  CommOptions options = loopback_options(port);
  options.collective_timeout = std::chrono::seconds(1);  // armed below, as agree_on_load arms it
  Result<std::unique_ptr<Communicator>> made = make_communicator(CommKind::tcp, world.value(), options);
  if (!made.ok()) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, made.status().to_string().c_str());
    return 2;
  }
  Communicator& comm = *made.value();
  comm.arm_collective_timeout();
  for (int round = 0; round < 200; ++round) {
    if (rank == victim && round == k_fault_round) {
      if (fault == Fault::kill) ::raise(SIGKILL);
      if (fault == Fault::exit) ::_exit(3);
      if (fault == Fault::hang) {  // alive, connections open, never answering (a stopped process)
        std::this_thread::sleep_for(std::chrono::seconds(9));
        ::_exit(6);
      }
      comm.abort_job("worker failed on purpose in round " + std::to_string(round), 5);
    }
    std::vector<float> buf(round % 2 ? 100000 : 769, static_cast<float>(rank + 1));
    const auto start = Clock::now();
    const Status s = comm.all_reduce_sum(std::span<float>(buf));
    if (!s.ok()) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      const Status again = comm.barrier();
      std::fprintf(stderr, "error after %.3f s: %s\nthen: %s\n", seconds, s.message().c_str(),
                   again.message().c_str());
      return s.message().find('\n') == std::string::npos ? 10 : 11;
    }
    if (buf[0] != static_cast<float>(p * (p + 1) / 2)) return 4;
  }
  std::fprintf(stderr, "200 rounds done\n");
  return 0;
}

double error_seconds(const std::string& output) {
  const size_t at = output.find("error after ");
  return at == std::string::npos ? -1.0 : std::atof(output.c_str() + at + 12);
}

void expect_survivors_fail(const std::vector<RankOutcome>& out, int victim, const std::string& expected) {
  for (int r = 0; r < static_cast<int>(out.size()); ++r) {
    if (r == victim) continue;
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_FALSE(out[r].hung) << out[r].output;
    EXPECT_EQ(out[r].exit_code, 10) << out[r].output;
    const double seconds = error_seconds(out[r].output);
    EXPECT_GE(seconds, 0.0) << out[r].output;
    EXPECT_LT(seconds, k_bound_seconds) << out[r].output;
    EXPECT_NE(out[r].output.find("error after"), std::string::npos) << out[r].output;
    EXPECT_NE(out[r].output.find(expected), std::string::npos) << "wanted '" << expected << "' in\n" << out[r].output;
    EXPECT_NE(out[r].output.find("then: " + expected), std::string::npos) << out[r].output;
  }
}

TEST(TcpFailure, KilledRankFailsEveryOtherRank) {
  for (int victim : {1, 0, 3}) {
    SCOPED_TRACE("victim " + std::to_string(victim));
    const int p = 4;
    const int port = snap::testing::free_port();
    const auto out = run_ranks(p, [&](int rank) { return fault_child(rank, p, port, victim, Fault::kill); });
    EXPECT_EQ(out[victim].signal, SIGKILL) << out[victim].output;
    expect_survivors_fail(out, victim,
                          "comm/tcp: rank " + std::to_string(victim) + " closed the connection during all_reduce_sum");
  }
}

TEST(TcpFailure, RankExitingMidLoopFailsEveryOtherRank) {
  const int p = 3, victim = 2;
  const int port = snap::testing::free_port();
  const auto out = run_ranks(p, [&](int rank) { return fault_child(rank, p, port, victim, Fault::exit); });
  EXPECT_EQ(out[victim].exit_code, 3) << out[victim].output;
  expect_survivors_fail(out, victim, "comm/tcp: rank 2 closed the connection during all_reduce_sum");
}

TEST(TcpFailure, AbortJobPrintsItsMessageAndFailsEveryOtherRank) {
  for (int victim : {1, 0}) {
    SCOPED_TRACE("victim " + std::to_string(victim));
    const int p = 3;
    const int port = snap::testing::free_port();
    const auto out = run_ranks(p, [&](int rank) { return fault_child(rank, p, port, victim, Fault::abort); });
    EXPECT_EQ(out[victim].exit_code, 5) << out[victim].output;
    const std::string why = "worker failed on purpose in round " + std::to_string(k_fault_round);
    EXPECT_NE(out[victim].output.find("snapserve: rank " + std::to_string(victim) + " aborting the job: " + why),
              std::string::npos)
        << out[victim].output;
    expect_survivors_fail(out, victim, "comm/tcp: rank " + std::to_string(victim) + " aborted the job: " + why);
  }
}

// A rank that hangs (alive, its connections open) inside the all-reduce loop: rank 0 gives up
// after the collective timeout (1 s here) naming it, and its notice fails the others; when rank
// 0 itself hangs, the others give up on it 5 s later (their grace, so that rank 0 could name a
// culprit first), each naming rank 0. Nobody waits for the hung rank's 9 s.
TEST(TcpFailure, HungRankTimesOutNamingIt) {
  for (int victim : {2, 0}) {
    SCOPED_TRACE("victim " + std::to_string(victim));
    const int p = 3;
    const int port = snap::testing::free_port();
    const auto out = run_ranks(p, [&](int rank) { return fault_child(rank, p, port, victim, Fault::hang); });
    EXPECT_EQ(out[victim].exit_code, 6) << out[victim].output;
    for (int r = 0; r < p; ++r) {
      if (r == victim) continue;
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(out[r].exit_code, 10) << out[r].output;
      const double seconds = error_seconds(out[r].output);
      if (victim == 0) {
        EXPECT_NE(out[r].output.find("comm/tcp: rank " + std::to_string(r) + ": all_reduce_sum waited "),
                  std::string::npos) << out[r].output;
        EXPECT_NE(out[r].output.find(" for rank 0 (--collective-timeout 1 s): it died or hangs"), std::string::npos)
            << out[r].output;
        EXPECT_GE(seconds, 5.9) << out[r].output;
        EXPECT_LT(seconds, 8.5) << out[r].output;
      } else {
        EXPECT_NE(out[r].output.find("comm/tcp: rank 0: all_reduce_sum waited "), std::string::npos) << out[r].output;
        EXPECT_NE(out[r].output.find(" for rank 2 (--collective-timeout 1 s): it died or hangs"), std::string::npos)
            << out[r].output;
        EXPECT_LT(seconds, 3.0) << out[r].output;
      }
      EXPECT_NE(out[r].output.find("then: comm/tcp: rank "), std::string::npos) << out[r].output;
    }
  }
}

// Rank `rank` of `p` over TCP, its collective timeout armed as agree_on_load arms it.
Result<std::unique_ptr<Communicator>> armed_communicator(int rank, int p, int port, std::chrono::milliseconds timeout) {
  CommOptions options = loopback_options(port);
  options.collective_timeout = timeout;
  auto made = make_communicator(CommKind::tcp, World::make(rank, p).value(), options);
  if (made.ok()) (*made)->arm_collective_timeout();
  return made;
}

// Broadcasts do not time out unless bound: a worker waits there for an idle leader's next step plan.
TEST(TcpFailure, BroadcastWaitsPastTheCollectiveTimeout) {
  const int p = 2;
  const int port = snap::testing::free_port();
  const auto out = run_ranks(p, [&](int rank) {
    auto made = armed_communicator(rank, p, port, std::chrono::milliseconds(300));
    if (!made.ok()) return 2;
    int32_t plan = rank == 0 ? 42 : 0;
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // an idle leader
    const Status s = (*made)->broadcast_bytes(&plan, sizeof plan, 0);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 3;
    }
    std::vector<float> buf(16, 1.0f);  // and the next step's all-reduce still works
    return plan == 42 && (*made)->all_reduce_sum(std::span<float>(buf)).ok() && buf[0] == 2.0f ? 0 : 4;
  });
  for (int r = 0; r < p; ++r) EXPECT_EQ(out[r].exit_code, 0) << "rank " << r << ": " << out[r].output;
}

// Bounded broadcasts (generate's workers: the leader sends a plan every step): a leader silent
// for longer than the collective timeout (+ the workers' grace) is a hang, named.
TEST(TcpFailure, BoundBroadcastTimesOutNamingTheLeader) {
  const int p = 2;
  const int port = snap::testing::free_port();
  const auto out = run_ranks(p, [&](int rank) {
    auto made = armed_communicator(rank, p, port, std::chrono::milliseconds(300));
    if (!made.ok()) return 2;
    (*made)->bound_broadcasts(Communicator::BroadcastBound::step);
    int32_t plan = rank == 0 ? 42 : 0;
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(8000));  // past 0.3 s + the workers' 5 s grace
      return 0;
    }
    const Status s = (*made)->broadcast_bytes(&plan, sizeof plan, 0);
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return s.ok() ? 4 : 3;
  });
  EXPECT_EQ(out[0].exit_code, 0) << out[0].output;
  EXPECT_EQ(out[1].exit_code, 3) << out[1].output;
  EXPECT_NE(out[1].output.find("comm/tcp: rank 1: broadcast waited "), std::string::npos) << out[1].output;
  EXPECT_NE(out[1].output.find(" for rank 0 (--collective-timeout 0.3 s): it died or hangs"), std::string::npos)
      << out[1].output;
}

// Each child prints "setup error: <message>" and exits 10 when make_communicator fails
// with a one-line message, 11 when the message has several lines, 0 when it succeeds.
int setup_child(int rank, int size, int port, std::chrono::milliseconds timeout) {
  Result<World> world = World::make(rank, size);
  Result<std::unique_ptr<Communicator>> made =
      make_communicator(CommKind::tcp, world.value(), loopback_options(port, timeout));
  if (made.ok()) return 0;
  std::fprintf(stderr, "setup error: %s\n", made.status().message().c_str());
  return made.status().message().find('\n') == std::string::npos ? 10 : 11;
}

TEST(TcpSetup, WrongWorldSizeIsAOneLineError) {
  const int port = snap::testing::free_port();
  const auto start = Clock::now();
  const auto out = run_ranks(3, [&](int rank) {
    return setup_child(rank, rank == 2 ? 4 : 3, port, std::chrono::seconds(5));
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(out[r].hung) << out[r].output;
    EXPECT_EQ(out[r].exit_code, 10) << "rank " << r << "\n" << out[r].output;
  }
  EXPECT_NE(out[0].output.find("comm/tcp: connecting the group at 127.0.0.1:" + std::to_string(port) +
                               " failed: rank 2 says world size 4, rank 0 has 3"),
            std::string::npos)
      << out[0].output;
  EXPECT_NE(out[2].output.find("rank 0 has world size 3, rank 2 has 4"), std::string::npos) << out[2].output;
  EXPECT_NE(out[1].output.find("setup error: comm/tcp: connecting the group at"), std::string::npos) << out[1].output;
  EXPECT_LT(seconds, 5.0 + k_bound_seconds);
}

// With 3+ ranks the ranks connect to each other (the mesh), so a rank that rank 0 can reach
// but another rank cannot is a set-up error naming both and the way out. Rank 1 here is the
// test itself speaking the protocol: its hello names a mesh port where nothing listens, as a
// firewall between the workers would leave it; rank 2 cannot connect there.
TEST(TcpSetup, UnreachableMeshPeerIsAOneLineErrorNamingIt) {
  const int port = snap::testing::free_port(), dead = snap::testing::free_port();
  const auto out = run_ranks(3, [&](int rank) {
    if (rank != 1) return setup_child(rank, 3, port, std::chrono::seconds(5));
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    for (;;) {  // rank 0 may not listen yet
      Result<comm::detail::Socket> c = comm::detail::try_connect("127.0.0.1", port, deadline);
      if (!c.ok()) {
        if (Clock::now() > deadline) return 20;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      const int fd = c.value().fd();
      if (comm::detail::send_words(fd, {tcp_wire::k_magic, 1, 3, static_cast<uint32_t>(dead)}, deadline) != comm::detail::Io::ok)
        return 21;
      uint32_t verdict[3] = {}, table_bytes = 0;
      if (comm::detail::recv_words(fd, verdict, 3, deadline) != comm::detail::Io::ok || verdict[1] != 0) return 22;  // 0: k_verdict_ok
      if (comm::detail::recv_words(fd, &table_bytes, 1, deadline) != comm::detail::Io::ok) return 23;
      std::vector<uint8_t> table(table_bytes);
      if (comm::detail::recv_all(fd, table.data(), table.size(), deadline) != comm::detail::Io::ok) return 24;
      std::this_thread::sleep_for(std::chrono::seconds(1));  // stays connected while rank 2 tries
      return 0;
    }
  });
  EXPECT_EQ(out[1].exit_code, 0) << out[1].output;
  EXPECT_EQ(out[0].exit_code, 0) << out[0].output;  // rank 0 itself connects to no worker
  EXPECT_EQ(out[2].exit_code, 10) << out[2].output;
  EXPECT_NE(out[2].output.find("rank 2 could not connect to rank 1 at 127.0.0.1:" + std::to_string(dead)), std::string::npos)
      << out[2].output;
  EXPECT_NE(out[2].output.find("the ranks connect to each other, not only to rank 0: allow TCP between them"),
            std::string::npos)
      << out[2].output;
}

TEST(TcpSetup, MissingRankTimesOutNamingIt) {
  const int port = snap::testing::free_port();
  // Ranks 0 and 1 of a world of 3; rank 2 never starts.
  const auto out = run_ranks(2, [&](int rank) { return setup_child(rank, 3, port, std::chrono::milliseconds(1500)); });
  EXPECT_EQ(out[0].exit_code, 10) << out[0].output;
  EXPECT_NE(out[0].output.find("timed out after 1.5 s: 2 of 3 ranks joined (missing: 2)"), std::string::npos)
      << out[0].output;
  EXPECT_EQ(out[1].exit_code, 10) << out[1].output;
  EXPECT_NE(out[1].output.find("rank 0 timed out waiting for the others: 2 of 3 ranks joined"), std::string::npos)
      << out[1].output;
}

TEST(TcpSetup, RefusesTpGroupsSmallerThanTheWorld) {
  Result<World> world = World::make(0, 4, 2);
  ASSERT_TRUE(world.ok());
  Result<std::unique_ptr<Communicator>> made = make_communicator(CommKind::tcp, world.value(), loopback_options(1));
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::k_unimplemented);
  EXPECT_NE(made.status().message().find("comm/tcp: tensor-parallel groups smaller than the world"), std::string::npos)
      << made.status().message();
}

TEST(TcpSetup, OneRankNeedsNoNetwork) {
  Result<std::unique_ptr<Communicator>> made = make_communicator(CommKind::tcp, World(), CommOptions{});
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Communicator& comm = *made.value();
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  const std::vector<float> before = x;
  ASSERT_TRUE(comm.all_reduce_sum(std::span<float>(x)).ok());
  EXPECT_EQ(x, before);
  std::vector<float> gathered(3);
  ASSERT_TRUE(comm.all_gather(x.data(), gathered.data(), 3, DType::f32).ok());
  EXPECT_EQ(gathered, before);
  ASSERT_TRUE(comm.broadcast(std::span<float>(x), 0).ok());
  ASSERT_TRUE(comm.barrier().ok());
  EXPECT_EQ(comm.stats()[CommOp::all_reduce_sum].bytes, 12);
}

TEST(TcpSetup, KindParsesAndPrints) {
  Result<CommKind> kind = parse_comm_kind("tcp");
  ASSERT_TRUE(kind.ok()) << kind.status().to_string();
  EXPECT_EQ(kind.value(), CommKind::tcp);
  EXPECT_STREQ(comm_kind_name(CommKind::tcp), "tcp");
}

// The wire checks on hand-made bytes (fuzz/fuzz_tcp_wire.cpp fuzzes the same functions).
TEST(TcpWire, ChecksWhatPeersSend) {
  using namespace tcp_wire;
  uint8_t h[k_header_bytes];
  encode_header(h, kind_of(CommOp::all_gather), 96);
  const Header d = decode_header(h);
  EXPECT_EQ(d.magic, k_magic);
  EXPECT_EQ(d.kind, 2u);
  EXPECT_EQ(d.num_bytes, 96u);
  EXPECT_EQ(check_header(d, CommOp::all_gather, 96), HeaderVerdict::ok);
  EXPECT_EQ(check_header(d, CommOp::all_gather, 95), HeaderVerdict::mismatch);
  EXPECT_EQ(check_header(d, CommOp::all_reduce_sum, 96), HeaderVerdict::mismatch);
  EXPECT_EQ(check_header({k_magic + 1, 2, 96}, CommOp::all_gather, 96), HeaderVerdict::bad_magic);
  EXPECT_EQ(check_header({k_magic, k_kind_abort, 40}, CommOp::barrier, 0), HeaderVerdict::abort_notice);
  EXPECT_EQ(check_header({k_magic, k_kind_abort, k_max_notice + 1}, CommOp::barrier, 0), HeaderVerdict::notice_too_long);
  EXPECT_EQ(kind_name(1), "all_reduce_sum");
  EXPECT_EQ(kind_name(k_kind_abort), "an abort notice");
  EXPECT_EQ(kind_name(17), "kind 17");

  const std::vector<bool> joined = {false, true, false};  // world of 3, rank 1 connected
  const uint32_t ok[3] = {k_magic, 2, 3}, twice[3] = {k_magic, 1, 3}, zero[3] = {k_magic, 0, 3},
                 far[3] = {k_magic, 3, 3}, size[3] = {k_magic, 2, 4}, stray[3] = {0x47455420, 2, 3};
  EXPECT_EQ(check_hello(ok, joined), HelloVerdict::ok);
  EXPECT_EQ(check_hello(twice, joined), HelloVerdict::bad_rank);
  EXPECT_EQ(check_hello(zero, joined), HelloVerdict::bad_rank);
  EXPECT_EQ(check_hello(far, joined), HelloVerdict::bad_rank);
  EXPECT_EQ(check_hello(size, joined), HelloVerdict::bad_size);
  EXPECT_EQ(check_hello(stray, joined), HelloVerdict::not_ours);
}

}  // namespace
}  // namespace snap::comm
