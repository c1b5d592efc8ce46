// `snapserve serve --device cuda:0 --tp 2` end to end over HTTP: two ranks (--rank/--world-size/
// --leader over TCP, as a LeaderWorkerSet starts them) sharing GPU 0 through the host-staged
// exchange, on a random tiny-llama3 model (6 query heads, 2 KV heads: one per rank), against
// one `serve --device cuda:0` process on the same model:
//   - the same greedy texts, for requests alone and batched together, with the full cache and
//     with every compressing policy (each rank compresses its own KV head) — but AdaKV, whose
//     layer budget is shared among one rank's KV heads at tp > 1 (batched equals alone there),
//     and a score-based policy's request whose prompt two processes compress otherwise than one
//     at a near-tie at a head's cut-off (the row-parallel sums add in another order): there
//     `generate --dump-kv-selection` on that prompt, as one process and as two, must show the
//     difference, within 2% of the kept entries, and batched must equal the group alone;
//   - /metrics: every rank's device memory (weights, KV pool used/free/peak), its exchange bytes
//     and seconds, and the KV pool free again once the requests are done;
//   - n > 1 (the fork op: each rank copies its own KV heads) and echo's prompt logprobs (every
//     prompt row through the gathered LM head) through the group;
//   - SIGTERM to rank 0 drains and stops both ranks (exit 0);
//   - a rank that dies: rank 0 fails the group (requests get 503, the server exits 3) instead
//     of hanging; one that hangs (SIGSTOP) with no collective timeout: rank 0's watchdog
//     (--step-timeout) answers the request in flight with 503 and ends the server (exit 3)
//     naming it;
//   - an idle group keeps serving past --collective-timeout; once rank 0 stops, rank 1 names
//     it and exits instead of waiting for ever.
// Built twice: against the CUDA runtime (exits 77 without a GPU) and against the host twin
// (kernels/cuda/host, in CI), where the ranks run worker/device on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda/tp_selection.h"
#include "tests/e2e/http_client.h"
#include "tests/e2e/server_process.h"
#include "tests/free_port.h"
#include "tests/snapserve_binary.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using snap::testing::Reply;
using snap::testing::ServerProcess;

const std::string k_bin = snapserve_binary();

// The value of a /metrics series, -1 when absent: name{labels} value, with every label given.
double metric(const std::string& text, const std::string& name, const std::vector<std::string>& labels) {
  std::string pattern = name + R"(\{)";
  for (const std::string& l : labels) pattern += R"((?=[^}]*)" + l + ")";
  pattern += R"([^}]*\} ([0-9.e+-]+))";
  std::smatch m;
  return std::regex_search(text, m, std::regex(pattern)) ? std::stod(m[1]) : -1.0;
}

std::string words(int n, int seed) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += 'w';
    s += std::to_string((i * 7919 + seed) % 97);
    s += ' ';
  }
  return s;
}

json completion(const std::string& prompt, int max_tokens, const json& kv = nullptr) {
  json b = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
  if (!kv.is_null()) b["kv_compression"] = kv;
  return b;
}

// Rank 1 of a two-rank group, in the background; its exit code when it ends.
class Follower {
 public:
  explicit Follower(std::vector<std::string> argv, const std::string& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      FILE* f = std::fopen(log.c_str(), "w");
      if (f) {
        ::dup2(::fileno(f), 2);
        ::dup2(::fileno(f), 1);
      }
      ::execv(args[0], args.data());
      std::_Exit(127);
    }
  }
  ~Follower() {
    if (pid_ > 0 && wait(0) == -1) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // The exit code (128 + signal when killed), or -1 when still running after wait_seconds.
  int wait(double wait_seconds) {
    if (done_) return rc_;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        done_ = true;
        rc_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return rc_;
      }
      if (std::chrono::steady_clock::now() >= until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  void kill_now() { ::kill(pid_, SIGKILL); }
  void signal(int sig) { ::kill(pid_, sig); }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  int rc_ = -1;
};

class DeviceServeTp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("snap_devservetp_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string cmd = test_python() + " " + test_source_dir() + "/tools/make_random_model.py --shape tiny-llama3 " +
                            "--dtype bf16 --seed 3 --out " + (dir_ / "m").string() + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static std::vector<std::string> args() {
    return {k_bin,         "serve",           "--device", "cuda:0", "--model", (dir_ / "m").string(), "--port", "0",
            "--kv-cache-mib", "1", "--prefill-chunk", "64", "--shutdown-timeout", "30"};
  }
  static std::unique_ptr<ServerProcess> one() { return std::make_unique<ServerProcess>(args()); }

  // Rank 1 first (it waits for rank 0 at the leader's port), then rank 0, which serves.
  struct Group {
    std::unique_ptr<Follower> rank1;
    std::unique_ptr<ServerProcess> rank0;
  };
  static Group group(const std::string& tag, const std::vector<std::string>& extra = {}) {
    const std::string leader = "127.0.0.1:" + std::to_string(snap::testing::free_port());
    std::vector<std::string> a = args();
    a.insert(a.end(), extra.begin(), extra.end());
    for (const char* x : {"--tp", "2", "--tp-comm", "host", "--world-size", "2", "--leader"}) a.emplace_back(x);
    a.push_back(leader);
    Group g;
    std::vector<std::string> r1 = a;
    r1.push_back("--rank");
    r1.push_back("1");
    g.rank1 = std::make_unique<Follower>(r1, (dir_ / (tag + ".rank1.log")).string());
    a.push_back("--rank");
    a.push_back("0");
    g.rank0 = std::make_unique<ServerProcess>(a);
    return g;
  }
  static std::string rank1_log(const std::string& tag) { return snap::testing::slurp_file((dir_ / (tag + ".rank1.log")).string()); }

  // The kept entries in which `generate` on `prompt` under the policy `kv` differs between one
  // process and two ranks run as the group runs (host-staged over TCP on GPU 0), with the
  // servers' prefill chunk and pool (tests/cuda/tp_selection.h).
  static void selection_difference(const std::string& tag, const std::string& prompt, const json& kv, int64_t* total,
                                   int64_t* differ) {
    const fs::path pf = dir_ / (tag + ".prompt.txt"), one = dir_ / (tag + ".sel1.json"), two = dir_ / (tag + ".sel2.json");
    std::ofstream(pf) << prompt;
    std::string common = " generate --device cuda:0 --model " + (dir_ / "m").string() + " --prompt-file " + pf.string() +
                         " --max-tokens 12 --ignore-eos --kv-cache-mib 1 --prefill-chunk 64 --kv-policy " +
                         kv["policy"].get<std::string>() + " --kv-budget " + std::to_string(kv["budget"].get<int>());
    if (kv.contains("window")) common += " --kv-window " + std::to_string(kv["window"].get<int>());
    if (kv.value("layerwise", false)) common += " --kv-layerwise";
    const std::string log1 = (dir_ / (tag + ".gen1.log")).string(), log2 = (dir_ / (tag + ".gen2.log")).string();
    ASSERT_EQ(sh("timeout 300 " + k_bin + common + " --dump-kv-selection " + one.string() + " > " + log1 + " 2>&1"), 0)
        << snap::testing::slurp_file(log1);
    const std::string group = common + " --dump-kv-selection " + two.string() +
                              " --tp 2 --tp-comm host --world-size 2 --leader 127.0.0.1:" +
                              std::to_string(snap::testing::free_port());
    ASSERT_EQ(sh("(timeout 300 " + k_bin + group + " --rank 1 > " + log2 + ".r1 2>&1 & p1=$!; timeout 300 " + k_bin + group +
                 " --rank 0 > " + log2 + " 2>&1; rc=$?; wait $p1 || rc=91; exit $rc)"),
              0)
        << snap::testing::slurp_file(log2) << snap::testing::slurp_file(log2 + ".r1");
    snap::testing::count_selection_difference(one, two, 2, total, differ);
  }

  static int sh(const std::string& cmd) {
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  }

  static std::string text(int port, const json& body) {
    const Reply r = snap::testing::post(port, "/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body << r.error;
    if (r.status != 200) return "<status " + std::to_string(r.status) + ">";
    return r.j()["choices"][0]["text"].get<std::string>();
  }

  static inline fs::path dir_;
};

TEST_F(DeviceServeTp, SameTextsAsOneGpuAloneAndBatched) {
  const std::vector<std::string> prompts = {words(40, 1), words(90, 2), words(15, 3), words(120, 4)};
  const std::vector<json> policies = {nullptr,
                                      {{"policy", "snapkv"}, {"budget", 32}, {"window", 8}},
                                      {{"policy", "adakv"}, {"budget", 32}, {"window", 8}},
                                      {{"policy", "pyramidkv"}, {"budget", 32}, {"window", 8}},
                                      {{"policy", "h2o"}, {"budget", 32}},
                                      {{"policy", "streaming"}, {"budget", 32}},
                                      {{"policy", "snapkv"}, {"budget", 32}, {"window", 8}, {"layerwise", true}}};
  std::vector<std::string> expected;
  const json echo = {{"prompt", prompts[3]}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}};
  json echo_single;
  {
    auto single = one();
    ASSERT_GT(single->port(), 0) << single->log();
    for (const json& kv : policies)
      for (const auto& p : prompts) expected.push_back(text(single->port(), completion(p, 12, kv)));
    const Reply e = snap::testing::post(single->port(), "/v1/completions", echo);
    ASSERT_EQ(e.status, 200) << e.body;
    echo_single = e.j()["choices"][0]["logprobs"]["token_logprobs"];
    EXPECT_EQ(single->terminate(30), 0) << single->log();
  }
  Group g = group("texts");
  ASSERT_GT(g.rank0->port(), 0) << g.rank0->log() << rank1_log("texts");
  const int port = g.rank0->port();
  EXPECT_NE(g.rank0->log().find("tensor parallel 2 ranks, exchange host-staged over tcp"), std::string::npos)
      << g.rank0->log();
  size_t at = 0;
  for (const json& kv : policies) {
    // Alone, then all prompts of the policy at once (continuous batching across the group).
    // AdaKV shares a layer's budget among the KV heads of one rank (no score crosses ranks), so
    // at tp 2 it selects otherwise than one process: there the group's own texts alone are
    // the reference for its batched ones.
    const bool per_rank = !kv.is_null() && kv["policy"] == "adakv";
    // Scores decide what these keep: a near-tie at a head's cut-off may keep another entry.
    const bool scored = !kv.is_null() && (kv["policy"] == "snapkv" || kv["policy"] == "pyramidkv" || kv["policy"] == "h2o");
    for (const auto& p : prompts) {
      const std::string t = text(port, completion(p, 12, kv));
      std::string& want = expected[at + (&p - prompts.data())];
      if (per_rank) {
        EXPECT_EQ(snap::testing::post(port, "/v1/completions", completion(p, 12, kv)).j()["usage"]["completion_tokens"], 12);
        want = t;
      } else if (scored && t != want) {
        std::string tag = "neartie";  // piece by piece (GCC 12's -Wrestrict on "..." + std::string&&)
        tag += std::to_string(at + (&p - prompts.data()));
        int64_t total = 0, differ = 0;
        selection_difference(tag, p, kv, &total, &differ);
        if (HasFatalFailure()) return;
        std::printf("[ info ] %s, prompt %d: the texts part; its selections: %lld of %lld kept entries differ\n",
                    kv.dump().c_str(), static_cast<int>(&p - prompts.data()), static_cast<long long>(differ),
                    static_cast<long long>(total));
        EXPECT_GT(differ, 0) << kv << ": the same entries kept by one process and two, yet the texts differ: " << t
                             << " vs " << want;
        EXPECT_LE(differ, 0.02 * static_cast<double>(total)) << kv;
        want = t;  // the group alone is then the reference for its batched text
      }
      EXPECT_EQ(t, want) << kv;
    }
    std::vector<std::future<std::string>> together;
    for (const auto& p : prompts)
      together.push_back(std::async(std::launch::async, [&, p] { return text(port, completion(p, 12, kv)); }));
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i].get(), expected[at + i]) << "batched " << kv;
    at += prompts.size();
  }
  // n > 1 through the group (each rank copies its KV heads: the fork op), full and compressed:
  // every choice of a greedy request is the group's text alone.
  for (const json& kv : {policies[0], policies[1]}) {
    json body = completion(prompts[3], 12, kv);
    const std::string alone = text(port, body);
    body["n"] = 2;
    const Reply r = snap::testing::post(port, "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json rj = r.j();
    ASSERT_EQ(rj["choices"].size(), 2u) << r.body;
    for (const json& c : rj["choices"]) EXPECT_EQ(c["text"], alone) << kv;
  }
  // echo: every prompt row through the LM head, its vocabulary gathered from both ranks; the
  // prompt logprobs of one process within 0.05. They differ as test_device_tp's logits do (by
  // the order of the row-parallel sums, and through it by which way some bf16 roundings of the
  // GEMM inputs fall; 4.2e-3 measured on the host twin); a row of the wrong position or rank
  // would be off by whole units.
  {
    const Reply e = snap::testing::post(port, "/v1/completions", echo);
    ASSERT_EQ(e.status, 200) << e.body;
    const json lp = e.j()["choices"][0]["logprobs"]["token_logprobs"];
    ASSERT_EQ(lp.size(), echo_single.size()) << e.body;
    ASSERT_GT(lp.size(), 64u) << "more than one prompt chunk";
    double worst = 0;
    for (size_t j = 1; j < lp.size(); ++j)
      worst = std::max(worst, std::abs(lp[j].get<double>() - echo_single[j].get<double>()));
    std::printf("[ info ] echo through the group: prompt logprobs within %.2e of one process's\n", worst);
    EXPECT_LT(worst, 0.05);
  }
  // /metrics: both ranks' device memory and exchange counters (a report about once a second).
  std::string m;
  for (int i = 0; i < 100; ++i) {
    m = snap::testing::call(port, snap::testing::http::verb::get, "/metrics").body;
    if (metric(m, "snapserve_device_memory_bytes", {"rank=\"1\"", "kind=\"kv_pool_used\""}) == 0 &&
        metric(m, "snapserve_device_memory_bytes", {"rank=\"0\"", "kind=\"kv_pool_used\""}) == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (const std::string rank : {"rank=\"0\"", "rank=\"1\""}) {
    EXPECT_GT(metric(m, "snapserve_device_memory_bytes", {rank, "kind=\"weights\""}), 0) << rank << "\n" << m;
    EXPECT_GT(metric(m, "snapserve_device_memory_bytes", {rank, "kind=\"kv_pool_free\""}), 0) << rank << "\n" << m;
    EXPECT_GT(metric(m, "snapserve_device_memory_bytes", {rank, "kind=\"kv_pool_peak\""}), 0) << rank << "\n" << m;
    EXPECT_EQ(metric(m, "snapserve_device_memory_bytes", {rank, "kind=\"kv_pool_used\""}), 0) << rank << "\n" << m;
    EXPECT_GT(metric(m, "snapserve_comm_bytes_total", {rank, "op=\"all_reduce\""}), 0) << rank << "\n" << m;
    EXPECT_GT(metric(m, "snapserve_comm_bytes_total", {rank, "op=\"all_gather\""}), 0) << rank << "\n" << m;
  }
  // Both ranks hold the same pool (same KV heads per rank): the same peak.
  EXPECT_EQ(metric(m, "snapserve_device_memory_bytes", {"rank=\"0\"", "kind=\"kv_pool_peak\""}),
            metric(m, "snapserve_device_memory_bytes", {"rank=\"1\"", "kind=\"kv_pool_peak\""}))
      << m;
  EXPECT_EQ(g.rank0->terminate(30), 0) << g.rank0->log();
  EXPECT_EQ(g.rank1->wait(30), 0) << rank1_log("texts");
}

TEST_F(DeviceServeTp, DeadRankFailsTheGroupInsteadOfHanging) {
  Group g = group("dead");
  ASSERT_GT(g.rank0->port(), 0) << g.rank0->log() << rank1_log("dead");
  const int port = g.rank0->port();
  EXPECT_EQ(snap::testing::call(port, snap::testing::http::verb::get, "/health").status, 200);
  EXPECT_FALSE(text(port, completion(words(30, 5), 4)).empty());
  g.rank1->kill_now();
  g.rank1->wait(10);
  const auto t0 = std::chrono::steady_clock::now();
  const Reply r = snap::testing::post(port, "/v1/completions", completion(words(30, 6), 8));
  EXPECT_EQ(r.status, 503) << r.body << r.error;
  EXPECT_NE(r.body.find("tensor-parallel group failed"), std::string::npos) << r.body;
  EXPECT_EQ(g.rank0->wait(30), 3) << g.rank0->log();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_NE(g.rank0->log().find("the tensor-parallel group failed"), std::string::npos) << g.rank0->log();
}

TEST_F(DeviceServeTp, HungRankEndsTheServerWithinTheStepTimeout) {
  // No collective timeout: only the watchdog bounds the wait (as under mpirun, whose MPI has none).
  Group g = group("hung", {"--step-timeout", "2", "--collective-timeout", "0"});
  ASSERT_GT(g.rank0->port(), 0) << g.rank0->log() << rank1_log("hung");
  const int port = g.rank0->port();
  EXPECT_NE(g.rank0->log().find("tensor-parallel group of 2"), std::string::npos) << g.rank0->log();
  EXPECT_FALSE(text(port, completion(words(30, 7), 4)).empty());
  g.rank1->signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  auto reply = std::async(std::launch::async, [&] { return snap::testing::post(port, "/v1/completions", completion(words(30, 8), 8)); });
  // The request in flight is answered (503, naming the failure) before the server exits, though
  // the scheduler thread is still stuck in the exchange: the watchdog's thread ends it.
  const Reply r = reply.get();
  EXPECT_EQ(r.status, 503) << r.body << r.error << g.rank0->log();
  EXPECT_NE(r.body.find("tensor-parallel group failed"), std::string::npos) << r.body;
  EXPECT_EQ(g.rank0->wait(30), 3) << g.rank0->log();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 15.0);
  EXPECT_NE(g.rank0->log().find("did not finish within its deadline"), std::string::npos) << g.rank0->log();
  EXPECT_NE(g.rank0->log().find(") is stopped"), std::string::npos) << g.rank0->log();  // "rank 1 (pid N) is stopped"
  EXPECT_NE(g.rank0->log().find("the tensor-parallel group failed"), std::string::npos) << g.rank0->log();
  g.rank1->signal(SIGCONT);
  g.rank1->kill_now();
}

// An idle group keeps serving past --collective-timeout (rank 0 sends a report op at least
// once a second); once rank 0 stops (SIGSTOP), rank 1 stops waiting for its next op after
// --collective-timeout, naming it, and exits non-zero instead of waiting for ever.
TEST_F(DeviceServeTp, StoppedIdleLeaderEndsTheFollower) {
  Group g = group("leader", {"--collective-timeout", "2"});
  ASSERT_GT(g.rank0->port(), 0) << g.rank0->log() << rank1_log("leader");
  const int port = g.rank0->port();
  std::this_thread::sleep_for(std::chrono::seconds(5));
  EXPECT_FALSE(text(port, completion(words(30, 9), 4)).empty());
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_EQ(g.rank1->wait(0), -1) << rank1_log("leader");
  ::kill(g.rank0->pid(), SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = g.rank1->wait(30);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(g.rank0->pid(), SIGKILL);
  ::kill(g.rank0->pid(), SIGCONT);
  ASSERT_NE(rc, -1) << "rank 1 still running 30 s after rank 0 stopped\n" << rank1_log("leader");
  EXPECT_NE(rc, 0) << rank1_log("leader");
  EXPECT_LT(took, 15.0);  // the timeout, plus the 5 s a TCP worker leaves rank 0 to explain
  // Idle, rank 0 sends a report op once a second: a plan (broadcast), then the ranks' reports
  // (all_gather). Rank 1 waits in the broadcast for the next op, or, when the stop lands after
  // the plan went out, in the report's all_gather; either way it names rank 0 and the timeout.
  const std::string log1 = rank1_log("leader");
  EXPECT_TRUE(log1.find("broadcast waited") != std::string::npos || log1.find("all_gather waited") != std::string::npos)
      << log1;
  EXPECT_NE(rank1_log("leader").find("for rank 0 (--collective-timeout 2 s): it died or hangs"), std::string::npos)
      << rank1_log("leader");
  std::printf("measured: rank 1 ended %.1f s after rank 0 stopped (--collective-timeout 2)\n", took);
}

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_device_serve_tp: no CUDA device (%s): skipped\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  return RUN_ALL_TESTS();
}
