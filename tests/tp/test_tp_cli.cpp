// `snapserve generate --tp N` under mpirun, as a user runs it (ctest label mpi):
//   - TP=3 prints the same text as one process (snapkv), and its stderr report's
//     all-reduce bytes equal 2 x layers x tokens x hidden x 4;
//   - a --tp that does not match the launcher, or does not divide the model's heads, is a
//     one-line error, not a hang;
//   - killing one rank mid-generation ends the whole job non-zero, with mpirun naming the
//     rank, within k_bound_seconds (a `timeout` at 120 s would show up as exit 124); stopping
//     one (SIGSTOP) ends it after --collective-timeout, naming the rank; one stuck loading
//     its shard ends it after --load-timeout, naming the rank;
//   - without MPI (as under a Kubernetes LeaderWorkerSet): three processes started with
//     --rank/--world-size/--leader form the group over TCP and print the same text.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "tests/snapserve_binary.h"
#include "tests/free_port.h"
#include "tests/mpi_stop.h"

namespace {

namespace fs = std::filesystem;

const std::string k_bin = snapserve_binary();
const std::string k_mpirun = std::string(SNAP_MPIEXEC) + " --allow-run-as-root --oversubscribe";
constexpr double k_bound_seconds = 30.0;

std::string model_path() {
  if (const char* env = std::getenv("SNAP_MODEL"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CmdResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs `cmd` with stdout and stderr captured to files.
CmdResult run(const std::string& cmd) {
  const std::string base = (fs::temp_directory_path() / ("snap_tp_cli_" + std::to_string(::getpid()))).string();
  const int status = std::system((cmd + " > " + base + ".out 2> " + base + ".err").c_str());
  CmdResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  return r;
}

class TpCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(model_path())) GTEST_FAIL() << model_path() << " missing (run scripts/setup.sh)";
    dir_ = (fs::temp_directory_path() / ("snap_tp_cli_dir_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
    prompt_ = dir_ + "/prompt.txt";
    std::ofstream(prompt_) << "Write a short story about a lighthouse keeper who finds a message in a bottle. "
                              "Describe the storm, the bottle, the message and what the keeper does next.";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string generate_args(int64_t max_tokens) const {
    return " generate --model " + model_path() + " --prompt-file " + prompt_ + " --max-tokens " +
           std::to_string(max_tokens) + " --threads 1 --ignore-eos";
  }

  std::string dir_, prompt_;
};

int64_t find_int(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return -1;
  return std::stoll(m[1].str());
}

TEST_F(TpCli, SameTextAsOneProcessAndExactBytes) {
  const std::string args = generate_args(40) + " --chat --kv-policy snapkv --kv-budget 32 --kv-window 8";
  const CmdResult one = run(k_bin + args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const CmdResult tp = run(k_mpirun + " -np 3 " + k_bin + args + " --tp 3");
  ASSERT_EQ(tp.exit_code, 0) << tp.err;
  EXPECT_GT(one.out.size(), 40u);
  EXPECT_EQ(tp.out, one.out);
  // The report: "prompt tokens P", "generated tokens G", "all_reduce_sum C calls, B bytes".
  const int64_t prompt = find_int(tp.err, R"(prompt tokens (\d+))");
  const int64_t generated = find_int(tp.err, R"(generated tokens (\d+))");
  const int64_t bytes = find_int(tp.err, R"(all_reduce_sum \d+ calls, (\d+) bytes)");
  const int64_t calls = find_int(tp.err, R"(all_reduce_sum (\d+) calls)");
  ASSERT_GT(prompt, 0) << tp.err;
  EXPECT_EQ(generated, 40);
  const int64_t layers = 30, hidden = 576;
  EXPECT_EQ(bytes, 2 * layers * (prompt + generated - 1) * hidden * 4) << tp.err;
  EXPECT_EQ(calls % (2 * layers), 0) << tp.err;
  EXPECT_NE(tp.err.find("tensor parallel 3 ranks (mpi)"), std::string::npos) << tp.err;
  EXPECT_EQ(find_int(tp.err, R"(per decoded token: all_reduce_sum (\d+) bytes)"), 2 * layers * hidden * 4) << tp.err;
  // The vocab-parallel LM head: one row of 49152 / 3 logits gathered per sampled token.
  EXPECT_EQ(find_int(tp.err, R"(per decoded token: .* all_gather (\d+) bytes)"), 49152 / 3 * 4) << tp.err;
  EXPECT_EQ(find_int(tp.err, R"(all_gather (\d+) bytes\n)"), generated * 49152 / 3 * 4) << tp.err;
}

// `snapserve batch --tp 3` under mpirun: rank 0 reads and writes, every rank computes; the
// records (sampled lines included, with their custom_id seeds; one with SnapKV) equal one
// process's, and a rerun finds nothing left to do.
TEST_F(TpCli, BatchRecordsEqualOneProcess) {
  const std::string in = dir_ + "/corpus.jsonl";
  {
    std::ofstream f(in);
    for (int k = 1; k <= 6; ++k) {
      std::string body = k % 2 ? R"({"messages": [{"role": "user", "content": "Name a color and say why you like it."}])"
                               : R"({"prompt": "The lighthouse keeper opened the bottle and read")";
      body += R"(, "max_tokens": 12, "ignore_eos": true, "temperature": )" + std::string(k <= 3 ? "0" : "0.8");
      if (k == 2) body += R"(, "kv_compression": {"policy": "snapkv", "budget": 8, "window": 4})";
      body += "}";
      f << R"({"custom_id": "c)" << k << R"(", "url": ")" << (k % 2 ? "/v1/chat/completions" : "/v1/completions")
        << R"(", "body": )" << body << "}\n";
    }
  }
  const std::string args = " batch --model " + model_path() + " --input " + in + " --threads 1 --max-num-seqs 2";
  const CmdResult one = run(k_bin + args + " --output " + dir_ + "/one.jsonl");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const CmdResult tp = run(k_mpirun + " -np 3 " + k_bin + args + " --output " + dir_ + "/tp.jsonl --tp 3");
  ASSERT_EQ(tp.exit_code, 0) << tp.err;
  // Records come in completion order; compare each line's choices.
  auto choices_by_line = [](const std::string& path) {
    std::map<int64_t, std::string> m;
    std::ifstream f(path);
    std::string text;
    const std::regex line_re(R"("line":(\d+))"), choices_re(R"("choices":(\[.*?\]),"created")");
    while (std::getline(f, text)) {
      std::smatch a, b;
      if (std::regex_search(text, a, line_re) && std::regex_search(text, b, choices_re)) m[std::stoll(a[1])] = b[1];
    }
    return m;
  };
  const auto want = choices_by_line(dir_ + "/one.jsonl");
  ASSERT_EQ(want.size(), 6u) << slurp(dir_ + "/one.jsonl");
  EXPECT_EQ(choices_by_line(dir_ + "/tp.jsonl"), want);
  const CmdResult again = run(k_mpirun + " -np 3 " + k_bin + args + " --output " + dir_ + "/tp.jsonl --tp 3");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("0 records written this run"), std::string::npos) << again.err;
}

TEST_F(TpCli, TpMustMatchTheLauncher) {
  const CmdResult r = run(k_bin + generate_args(4) + " --tp 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--tp 2 but the launcher started 1 process(es)"), std::string::npos) << r.err;
}

TEST_F(TpCli, IndivisibleHeadsEndEveryRank) {
  const auto start = std::chrono::steady_clock::now();
  const CmdResult r = run("timeout 120 " + k_mpirun + " -np 2 " + k_bin + generate_args(4) + " --tp 2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 124) << "hung until timeout\n" << r.err;
  EXPECT_LT(seconds, k_bound_seconds);
  EXPECT_NE(r.err.find("--tp 2 does not divide the model's 9 query heads"), std::string::npos) << r.err;
}

TEST_F(TpCli, KilledRankEndsTheJob) {
  const std::string out = dir_ + "/job.out", err = dir_ + "/job.err", rc = dir_ + "/job.rc";
  const std::string job = "timeout 120 " + k_mpirun + " -np 3 " + k_bin + generate_args(4000) + " --tp 3 > " + out +
                          " 2> " + err + "; echo $? > " + rc;
  ASSERT_EQ(std::system(("(" + job + ") &").c_str()), 0);
  // Wait until rank 0 streams generated text: the ranks are decoding together.
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  while (slurp(out).size() < 20 && elapsed() < 60 && !fs::exists(rc)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(slurp(out).size(), 20u) << "generation never started\n" << slurp(err);
  const pid_t victim = snap::testing::find_mpi_rank(1, prompt_);
  ASSERT_GT(victim, 0) << "rank 1 not found";
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  while (!fs::exists(rc) || slurp(rc).empty()) {
    if (elapsed() > 150) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  const std::string code = slurp(rc);
  ASSERT_FALSE(code.empty()) << "job still running " << seconds << " s after the kill";
  const int exit_code = std::stoi(code);
  EXPECT_NE(exit_code, 0);
  EXPECT_NE(exit_code, 124) << "mpirun hung until timeout killed it\n" << slurp(err);
  EXPECT_LT(seconds, k_bound_seconds);
  const std::string log = slurp(err);
  EXPECT_NE(log.find("rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find("signal 9"), std::string::npos) << log;
  EXPECT_EQ(log.find("generated tokens 4000"), std::string::npos) << log;
}

// A rank that stops (SIGSTOP: alive, never answering) mid-generation under mpirun: MPI has no
// collective timeout of its own, so the MPI backend's --collective-timeout must end the job,
// naming the rank, instead of it hanging until `timeout` (exit 124). Each live rank names the
// ranks whose transfers it still waits for: in the second round of a large all-reduce that may
// include a live rank still stuck in the first, but at least one live rank names the stopped
// one alone. Rank 2 (a worker): named from an all-reduce or the LM head's gather. Rank 0 (the
// leader): named from a collective or, between two steps, from the broadcast of the next plan
// (generate bounds its workers' broadcasts).
void expect_stopped_rank_ends_the_job(const std::string& dir, const std::string& job_args, const std::string& prompt,
                                      int victim_rank, const std::string& expected) {
  const snap::testing::StoppedJob r =
      snap::testing::stop_rank_of_job("timeout 120 " + k_mpirun + " -np 3 " + k_bin + job_args, dir, prompt, victim_rank);
  ASSERT_TRUE(r.setup_error.empty()) << r.setup_error;
  ASSERT_NE(r.exit_code, -1) << "job still running " << r.seconds << " s after rank " << victim_rank << " stopped";
  EXPECT_NE(r.exit_code, 0) << r.log;
  EXPECT_NE(r.exit_code, 124) << "mpirun hung until timeout killed it\n" << r.log;
  EXPECT_LT(r.seconds, k_bound_seconds) << r.log;
  EXPECT_TRUE(std::regex_search(r.log, std::regex(expected))) << expected << "\n" << r.log;
  EXPECT_EQ(r.log.find("generated tokens 4000"), std::string::npos) << r.log;
  std::printf("measured: the job ended %.1f s after rank %d stopped (--collective-timeout 2)\n", r.seconds, victim_rank);
}

TEST_F(TpCli, StoppedMpiRankEndsTheJobNamingIt) {
  expect_stopped_rank_ends_the_job(dir_, generate_args(4000) + " --tp 3 --collective-timeout 2", prompt_, 2,
                                   "comm/mpi: rank [01]: (all_reduce_sum|all_gather) waited [0-9.]+ s for rank 2 "
                                   "\\(--collective-timeout 2 s\\): it died or hangs");
}

TEST_F(TpCli, StoppedMpiLeaderEndsTheJobNamingIt) {
  expect_stopped_rank_ends_the_job(dir_, generate_args(4000) + " --tp 3 --collective-timeout 2", prompt_, 0,
                                   "comm/mpi: rank [12]: (all_reduce_sum|all_gather|broadcast) waited [0-9.]+ s for "
                                   "rank 0 \\(--collective-timeout 2 s\\): it died or hangs");
}

// A rank stuck reading its shard (its --model a FIFO no one writes: open() blocks, as on a hung
// network file system) while the others have loaded: they give up in agree_on_load after
// --load-timeout naming it, instead of waiting for ever, and the job ends through MPI_Abort,
// which also kills the stuck rank.
TEST_F(TpCli, RankStuckLoadingEndsTheJobNamingIt) {
  const std::string fifo = dir_ + "/stuck.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string args = generate_args(8) + " --tp 3 --load-timeout 2";
  args.replace(args.find(model_path()), model_path().size(), "\"$m\"");
  const std::string rank_cmd = "if [ \"$OMPI_COMM_WORLD_RANK\" = 2 ]; then m=" + fifo + "; else m=" + model_path() +
                               "; fi; exec " + k_bin + args;
  const auto start = std::chrono::steady_clock::now();
  const CmdResult r = run("timeout 120 " + k_mpirun + " -np 3 sh -c '" + rank_cmd + "'");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.exit_code, 124) << "mpirun hung until timeout killed it\n" << r.err;
  EXPECT_LT(seconds, k_bound_seconds) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex("the ranks did not all load their shards: comm/mpi: rank [01]: "
                                                  "all_reduce_sum waited [0-9.]+ s for rank 2 \\(--load-timeout 2 s\\): "
                                                  "it died or hangs")))
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  std::printf("measured: the job ended %.1f s after its start (--load-timeout 2)\n", seconds);
}

// The same over TCP (a LeaderWorkerSet): rank 0 names the stuck rank, rank 1 ends on its notice.
TEST_F(TpCli, TcpRankStuckLoadingEndsTheGroupNamingIt) {
  const std::string fifo = dir_ + "/stuck.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int port = snap::testing::free_port();
  ASSERT_GT(port, 0);
  const std::string flags = " --tp 3 --world-size 3 --load-timeout 2 --leader 127.0.0.1:" + std::to_string(port);
  std::string stuck_args = generate_args(8);
  stuck_args.replace(stuck_args.find(model_path()), model_path().size(), fifo);
  ASSERT_EQ(std::system(("(" + k_bin + stuck_args + flags + " --rank 2 > " + dir_ + "/r2.log 2>&1 & echo $! > " + dir_ +
                         "/r2.pid)").c_str()),
            0);
  std::string cmd = "(timeout 120 " + k_bin + generate_args(8) + flags + " --rank 1 > " + dir_ + "/r1.log 2>&1 & p1=$!; ";
  cmd += "timeout 120 " + k_bin + generate_args(8) + flags + " --rank 0; rc=$?; wait $p1; echo $? > " + dir_ + "/r1.rc; exit $rc)";
  const auto start = std::chrono::steady_clock::now();
  const CmdResult r = run(cmd);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const pid_t stuck = static_cast<pid_t>(std::atoi(slurp(dir_ + "/r2.pid").c_str()));
  if (stuck > 0) ::kill(stuck, SIGKILL);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.exit_code, 124) << "rank 0 hung until timeout killed it\n" << r.err;
  EXPECT_LT(seconds, k_bound_seconds) << r.err;
  EXPECT_NE(r.err.find("the ranks did not all load their shards: comm/tcp: rank 0: all_reduce_sum waited"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("for rank 2 (--load-timeout 2 s): it died or hangs"), std::string::npos) << r.err;
  const std::string rank1_rc = slurp(dir_ + "/r1.rc");
  EXPECT_FALSE(rank1_rc.empty() || std::atoi(rank1_rc.c_str()) == 0 || std::atoi(rank1_rc.c_str()) == 124)
      << rank1_rc << slurp(dir_ + "/r1.log");
}

TEST_F(TpCli, TcpGroupWithoutMpiMatchesOneProcess) {
  const std::string args = generate_args(24) + " --kv-policy snapkv --kv-budget 16 --kv-window 4";
  const CmdResult one = run(k_bin + args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const int port = snap::testing::free_port();
  ASSERT_GT(port, 0);
  // Ranks 1 and 2 in the background, rank 0 in the foreground; all three must exit 0.
  std::string cmd = "(";
  for (int r = 1; r < 3; ++r) {
    cmd += "timeout 120 " + k_bin + args + " --tp 3 --rank " + std::to_string(r) + " --world-size 3 --leader 127.0.0.1:" +
           std::to_string(port) + " > " + dir_ + "/rank" + std::to_string(r) + ".log 2>&1 & p" + std::to_string(r) +
           "=$!; ";
  }
  cmd += "timeout 120 " + k_bin + args + " --tp 3 --rank 0 --world-size 3 --leader 127.0.0.1:" + std::to_string(port) +
         "; rc=$?; wait $p1 || rc=91; wait $p2 || rc=92; exit $rc)";
  const CmdResult tp = run(cmd);
  EXPECT_EQ(tp.exit_code, 0) << tp.err << slurp(dir_ + "/rank1.log") << slurp(dir_ + "/rank2.log");
  EXPECT_EQ(tp.out, one.out);
  EXPECT_NE(tp.err.find("tensor parallel 3 ranks (tcp)"), std::string::npos) << tp.err;
}

// A TCP rank that stops (SIGSTOP: alive, its connections open) mid-generation: rank 0 gives up
// after --collective-timeout and ends non-zero naming it, instead of waiting for ever, and the
// other worker ends on rank 0's notice. In the three-rank mesh rank 1 may itself be stuck behind
// rank 2 in the same all-reduce, so rank 0's line may name both ("for ranks 1, 2": the fresh-clone
// CI at 44bfc6e); it must name rank 2.
TEST_F(TpCli, StoppedTcpRankEndsTheJobNamingIt) {
  const int port = snap::testing::free_port();
  ASSERT_GT(port, 0);
  const std::string args = generate_args(4000) + " --tp 3 --world-size 3 --collective-timeout 2 --leader 127.0.0.1:" +
                           std::to_string(port);
  const std::string out = dir_ + "/r0.out", err = dir_ + "/r0.err", rc = dir_ + "/r0.rc";
  // Ranks 1 and 2 started directly (their pids are the processes to stop and clean up), rank 0 under timeout.
  for (int r = 1; r < 3; ++r) {
    const std::string n = std::to_string(r);
    ASSERT_EQ(std::system(("(" + k_bin + args + " --rank " + n + " > " + dir_ + "/r" + n + ".log 2>&1 & echo $! > " + dir_ +
                           "/r" + n + ".pid)").c_str()),
              0);
  }
  ASSERT_EQ(std::system(("(timeout 120 " + k_bin + args + " --rank 0 > " + out + " 2> " + err + "; echo $? > " + rc + ") &").c_str()), 0);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  while (slurp(out).size() < 20 && elapsed() < 60 && !fs::exists(rc)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t other = static_cast<pid_t>(std::atoi(slurp(dir_ + "/r1.pid").c_str()));
  const pid_t victim = static_cast<pid_t>(std::atoi(slurp(dir_ + "/r2.pid").c_str()));
  ASSERT_GT(victim, 0);
  ASSERT_GT(other, 0);
  if (slurp(out).size() < 20) {
    ::kill(victim, SIGKILL);
    ::kill(other, SIGKILL);
    FAIL() << "generation never started\n" << slurp(err) << slurp(dir_ + "/r2.log");
  }
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  const auto stopped = std::chrono::steady_clock::now();
  while ((!fs::exists(rc) || slurp(rc).empty()) && elapsed() < 150) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  ::kill(victim, SIGKILL);
  ::kill(victim, SIGCONT);
  for (int i = 0; i < 100 && ::kill(other, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool other_left = ::kill(other, 0) != 0;  // rank 1 ended on rank 0's notice (or is a zombie)
  ::kill(other, SIGKILL);
  const std::string code = slurp(rc), log = slurp(err);
  EXPECT_TRUE(other_left) << "rank 1 still running 10 s after rank 0 ended:\n" << slurp(dir_ + "/r1.log");
  ASSERT_FALSE(code.empty()) << "rank 0 still running " << seconds << " s after rank 1 stopped";
  EXPECT_NE(std::stoi(code), 0) << log;
  EXPECT_NE(std::stoi(code), 124) << "rank 0 hung until timeout killed it\n" << log;
  EXPECT_LT(seconds, 15.0) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex(R"(for (rank 2 \(--collective-timeout 2 s\): it died or hangs|)"
                                                R"(ranks ([0-9]+, )*2(, [0-9]+)* \(--collective-timeout 2 s\): they died or hang))")))
      << log;
  EXPECT_EQ(log.find("generated tokens 4000"), std::string::npos) << log;
}

}  // namespace
