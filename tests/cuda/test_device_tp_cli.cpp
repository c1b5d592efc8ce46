// `snapserve generate --device cuda --tp 2` as two PROCESSES sharing one GPU through the
// host-staged exchange (--tp-comm host over the launcher's TCP group: NCCL refuses two ranks on
// one device), against one process on that GPU (--tp 1), on a random tiny-llama3 model
// (6 query heads, 2 KV heads: one per rank):
//   - every rank exits 0;
//   - the prompt logits (--dump-logits) within 0.1 of one process's at each position's top 5;
//   - the same generated text (greedy; the full cache);
//   - each rank's SnapKV selection (--dump-kv-selection FILE -> FILE.rank<r>) equals one
//     process's for the same KV head, up to 2% of entries (near-ties at the cut-off);
//   - the same text with the same SnapKV selections; where a near-tie at a head's cut-off makes
//     two processes keep another entry than one (the row-parallel sums differ in order), the
//     texts may part, and the selections must show it;
//   - the exchange's exact bytes: 2 all-reduces of hidden f32 per layer and token, and the
//     vocabulary-parallel LM head's gather of 1000/2 f32 per sampled token;
//   - --tp-exchange-dtype bf16: half the all-reduce bytes, the same text;
//   - --weight-dtype q8_0: each rank holds its shard's Q8_0 weights on the device (the report
//     says so) and two processes give one process's text and logits;
//   - `batch --device cuda:0 --tp 2` (the serving engine's lockstep under the batch runner):
//     every record's choices equal one process's, except a SnapKV record whose prompt's
//     selections differ as above (checked through `generate` on that prompt);
//   - under mpirun (host-staged over MPI), a stopped rank ends the job after
//     --collective-timeout, naming it.
// Built twice: against the CUDA runtime (exits 77 without a GPU) and against the host twin
// (kernels/cuda/host, in CI): there the two processes run worker/device on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/cuda/tp_selection.h"
#include "tests/free_port.h"
#include "tests/mpi_stop.h"
#include "tests/snapserve_binary.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string k_bin = snapserve_binary();
constexpr double k_logit_tol = 0.1;
constexpr double k_selection_mismatch = 0.02;
constexpr int64_t k_layers = 2, k_hidden = 192, k_vocab = 1000;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

int64_t find_int(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return -1;
  return std::stoll(m[1].str());
}

// A --dump-logits file (coordinator/engine/logits_dump.h): [positions][vocab] f32.
std::vector<float> read_logits(const fs::path& p, int64_t* positions, int64_t want_vocab = k_vocab) {
  std::ifstream in(p, std::ios::binary);
  char magic[8] = {};
  uint32_t version = 0, dtype = 0;
  int64_t n = 0, vocab = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&version), 4);
  in.read(reinterpret_cast<char*>(&dtype), 4);
  in.read(reinterpret_cast<char*>(&n), 8);
  in.read(reinterpret_cast<char*>(&vocab), 8);
  if (!in || std::memcmp(magic, "SNAPLGT1", 8) != 0 || vocab != want_vocab || n <= 0) return {};
  in.seekg(static_cast<std::streamoff>(n * 4), std::ios::cur);  // the token ids
  std::vector<float> rows(static_cast<size_t>(n * vocab));
  in.read(reinterpret_cast<char*>(rows.data()), static_cast<std::streamsize>(rows.size() * 4));
  if (!in) return {};
  *positions = n;
  return rows;
}

// Every prompt position's top-5 logits of dump a (by a's order) within 0.1 + (the row's largest
// |logit|) / 64 of dump b's: bf16 weights and activations in the device's prompt GEMMs against
// the CPU's f32. Returns the largest difference.
double expect_top5_close(const fs::path& a_path, const fs::path& b_path, int64_t vocab, const std::string& tag) {
  int64_t na = 0, nb = 0;
  const std::vector<float> a = read_logits(a_path, &na, vocab), b = read_logits(b_path, &nb, vocab);
  EXPECT_FALSE(a.empty()) << a_path;
  EXPECT_EQ(na, nb) << tag;
  if (a.empty() || na != nb) return 1e9;
  double worst = 0;
  std::vector<int> idx(static_cast<size_t>(vocab));
  for (int64_t p = 0; p < na; ++p) {
    const float* x = a.data() + p * vocab;
    const float* y = b.data() + p * vocab;
    double scale = 0;
    for (int64_t v = 0; v < vocab; ++v) scale = std::max(scale, std::abs(static_cast<double>(x[v])));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int i, int j) { return x[i] > x[j]; });
    for (int k = 0; k < 5; ++k) {
      const double d = std::abs(static_cast<double>(x[idx[k]]) - y[idx[k]]);
      worst = std::max(worst, std::isnan(d) ? 1e9 : d);
      EXPECT_LE(d, 0.1 + scale / 64) << tag << " position " << p << " id " << idx[k];
    }
  }
  return worst;
}

struct Outcome {
  int rc = -1;
  std::string out, err;
};

class DeviceTpCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("snap_devtpcli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string cmd = test_python() + " " + test_source_dir() + "/tools/make_random_model.py --shape tiny-llama3 " +
                            "--dtype bf16 --seed 12 --out " + (dir_ / "m").string() + " >/dev/null 2>&1";
    ASSERT_EQ(sh(cmd), 0) << cmd;
    std::ofstream prompt(dir_ / "prompt.txt");
    for (int i = 0; i < 90; ++i) prompt << "w" << (i * 7919 + 5) % 97 << ' ';
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static std::string args(const std::string& tag, const std::string& extra, const fs::path& prompt = {}) {
    return " generate --device cuda:0 --model " + (dir_ / "m").string() + " --prompt-file " +
           (prompt.empty() ? dir_ / "prompt.txt" : prompt).string() + " --max-tokens 12 --ignore-eos --dump-logits " +
           (dir_ / (tag + ".logits")).string() + extra;
  }

  static Outcome one(const std::string& tag, const std::string& extra, const fs::path& prompt = {}) {
    Outcome r;
    r.rc = sh("timeout 300 " + k_bin + args(tag, extra, prompt) + " > " + (dir_ / (tag + ".out")).string() + " 2> " +
              (dir_ / (tag + ".err")).string());
    r.out = slurp(dir_ / (tag + ".out"));
    r.err = slurp(dir_ / (tag + ".err"));
    return r;
  }

  // Two ranks over TCP on GPU 0, host-staged; rank 1 in the background. rc: rank 0's, or 91
  // when rank 1 failed.
  static Outcome two(const std::string& tag, const std::string& extra, const fs::path& prompt = {}) {
    const int port = snap::testing::free_port();
    const std::string common = args(tag, extra, prompt) + " --tp 2 --tp-comm host --world-size 2 --leader 127.0.0.1:" +
                               std::to_string(port);
    const std::string cmd = "(timeout 300 " + k_bin + common + " --rank 1 > " + (dir_ / (tag + ".r1")).string() +
                            " 2>&1 & p1=$!; timeout 300 " + k_bin + common + " --rank 0 > " +
                            (dir_ / (tag + ".out")).string() + " 2> " + (dir_ / (tag + ".err")).string() +
                            "; rc=$?; wait $p1 || rc=91; exit $rc)";
    Outcome r;
    r.rc = sh(cmd);
    r.out = slurp(dir_ / (tag + ".out"));
    r.err = slurp(dir_ / (tag + ".err")) + slurp(dir_ / (tag + ".r1"));
    return r;
  }

  static void compare_logits(const std::string& a, const std::string& b) {
    int64_t na = 0, nb = 0;
    const std::vector<float> la = read_logits(dir_ / (a + ".logits"), &na), lb = read_logits(dir_ / (b + ".logits"), &nb);
    ASSERT_FALSE(la.empty());
    ASSERT_EQ(na, nb);
    double worst = 0;
    for (int64_t p = 0; p < na; ++p) {
      const float* x = la.data() + p * k_vocab;
      const float* y = lb.data() + p * k_vocab;
      std::vector<int> idx(static_cast<size_t>(k_vocab));
      for (int64_t i = 0; i < k_vocab; ++i) idx[i] = static_cast<int>(i);
      std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int i, int j) { return x[i] > x[j]; });
      for (int k = 0; k < 5; ++k) {
        const double d = std::abs(static_cast<double>(x[idx[k]]) - y[idx[k]]);
        worst = std::max(worst, std::isnan(d) ? 1e9 : d);
        EXPECT_LE(d, k_logit_tol) << "position " << p << " id " << idx[k];
      }
    }
    std::printf("[ info ] %s vs %s: %lld prompt positions, worst top-5 logit difference %.4f\n", a.c_str(), b.c_str(),
                static_cast<long long>(na), worst);
  }

  // SnapKV (budget 32, window 8) on `prompt` by one process and by two: each rank's kept
  // entries (--dump-kv-selection FILE -> FILE.rank<r>, one KV head each) against one process's
  // for that KV head. Adds to *total the kept entries and to *differ those not kept by both.
  static void compare_selections(const std::string& tag, const fs::path& prompt, int64_t* total, int64_t* differ,
                                 Outcome* a, Outcome* b) {
    const std::string kv = " --kv-policy snapkv --kv-budget 32 --kv-window 8 --dump-kv-selection ";
    *a = one(tag + "1", kv + (dir_ / (tag + "1.sel.json")).string(), prompt);
    ASSERT_EQ(a->rc, 0) << a->err;
    *b = two(tag + "2", kv + (dir_ / (tag + "2.sel.json")).string(), prompt);
    ASSERT_EQ(b->rc, 0) << b->err;
    snap::testing::count_selection_difference(dir_ / (tag + "1.sel.json"), dir_ / (tag + "2.sel.json"), 2, total, differ);
  }

  static inline fs::path dir_;
};

TEST_F(DeviceTpCli, TwoProcessesOnOneGpuMatchOne) {
  const Outcome a = one("full1", "");
  ASSERT_EQ(a.rc, 0) << a.err;
  const Outcome b = two("full2", "");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_GT(a.out.size(), 6u);
  EXPECT_EQ(b.out, a.out);
  compare_logits("full1", "full2");
  EXPECT_NE(b.err.find("tensor parallel 2 ranks (tcp)"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("host-staged"), std::string::npos) << b.err;
  // Rank 0's report: the exchange's bytes, as on the CPU (tests/tp/test_tp_cli.cpp).
  const int64_t prompt = find_int(b.err, R"(prompt tokens (\d+))");
  const int64_t generated = find_int(b.err, R"(generated tokens (\d+))");
  ASSERT_GT(prompt, 40) << b.err;
  EXPECT_EQ(generated, 12);
  EXPECT_EQ(find_int(b.err, R"(all_reduce_sum \d+ calls, (\d+) bytes)"),
            2 * k_layers * (prompt + generated - 1) * k_hidden * 4)
      << b.err;
  EXPECT_EQ(find_int(b.err, R"(per decoded token: all_reduce_sum (\d+) bytes)"), 2 * k_layers * k_hidden * 4) << b.err;
  EXPECT_EQ(find_int(b.err, R"(per decoded token: .* all_gather (\d+) bytes)"), k_vocab / 2 * 4) << b.err;
}

// --tp-exchange-dtype bf16: the all-reduces carry bf16, half the bytes (exactly: 2 B per element
// in the report), and the answer stays one process's within the same bounds.
TEST_F(DeviceTpCli, BfloatExchangeHalvesTheBytes) {
  const Outcome a = one("bf1", "");
  ASSERT_EQ(a.rc, 0) << a.err;
  const Outcome b = two("bf2", " --tp-exchange-dtype bf16");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(b.out, a.out);
  compare_logits("bf1", "bf2");
  const int64_t prompt = find_int(b.err, R"(prompt tokens (\d+))");
  const int64_t generated = find_int(b.err, R"(generated tokens (\d+))");
  ASSERT_GT(prompt, 40) << b.err;
  EXPECT_EQ(find_int(b.err, R"(all_reduce_sum \d+ calls, (\d+) bytes)"),
            2 * k_layers * (prompt + generated - 1) * k_hidden * 2)
      << b.err;
  EXPECT_NE(b.err.find("hidden x 2 B"), std::string::npos) << b.err;
  EXPECT_EQ(find_int(b.err, R"(per decoded token: all_reduce_sum (\d+) bytes)"), 2 * k_layers * k_hidden * 2) << b.err;
  EXPECT_EQ(find_int(b.err, R"(per decoded token: .* all_gather (\d+) bytes)"), k_vocab / 2 * 4) << b.err;  // logits stay f32
}

// --weight-dtype q8_0 on the device: each rank's shard in Q8_0 (o_proj's 96-column slices are
// whole blocks; down_proj's 164 are not and stay bf16), the same text and logits as one process.
TEST_F(DeviceTpCli, QuantizedWeightsTwoProcessesMatchOne) {
  const Outcome a = one("q81", " --weight-dtype q8_0");
  ASSERT_EQ(a.rc, 0) << a.err;
  const Outcome b = two("q82", " --weight-dtype q8_0");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_GT(a.out.size(), 6u);
  EXPECT_EQ(b.out, a.out);
  compare_logits("q81", "q82");
  EXPECT_NE(a.err.find("MiB q8_0"), std::string::npos) << a.err;
  EXPECT_NE(b.err.find("MiB q8_0"), std::string::npos) << b.err;
}

TEST_F(DeviceTpCli, SnapKvPerRankSelectsWhatOneProcessSelects) {
  int64_t total = 0, differ = 0;
  Outcome a, b;
  compare_selections("snap", dir_ / "prompt.txt", &total, &differ, &a, &b);
  if (HasFatalFailure()) return;
  compare_logits("snap1", "snap2");  // the prompt's logits come before any selection
  std::printf("[ info ] snapkv per rank: %lld of %lld kept entries differ\n", static_cast<long long>(differ),
              static_cast<long long>(total));
  ASSERT_GT(total, 0);
  EXPECT_LE(differ, k_selection_mismatch * total);
  // The same cache gives the same text. A near-tie at a head's cut-off (the two sum the
  // row-parallel products in a different order) keeps another entry, and from there the texts
  // may legitimately part.
  if (differ == 0) {
    EXPECT_EQ(b.out, a.out);
  }
}

// A real checkpoint (SmolLM2-135M-Instruct Q4_1, SNAP_MODEL; skipped without it): 9 query and 3
// KV heads of 64 dims, tied embeddings, a 49152-token vocabulary. With --weight-dtype bf16
// (dequantized to bf16 at load), the device at tp 1 and at tp 3 (three processes, one KV head
// each) against the CPU engine on the same bf16 weights and bf16 KV cache; with auto, the
// device holding the file's own Q4_1/Q8_0 blocks against the CPU engine on the same blocks
// (SNAP_MATVEC=f32act: the same weight values, f32 activations). Each: the same 16 greedy
// tokens, and every prompt position's CPU top 5 within 0.1 + 1/64 of the row's largest |logit|.
// Thirty layers compound the device's bf16 GEMM inputs: measured on the host twin, 0.22 at tp 1
// and 0.29 at tp 3 on rows whose largest logit is ~29 (0.8% and 1%); for scale, the CPU engine's
// own switch from Q4_1 to bf16 weights moves the same logits by 0.14.
TEST_F(DeviceTpCli, RealModelMatchesTheCpuEngine) {
  const char* env = std::getenv("SNAP_MODEL");
  const std::string model = env && *env ? env : std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no " << model;
  const std::string args = " generate --model " + model + " --prompt-file " + (dir_ / "prompt.txt").string() +
                           " --max-tokens 16 --ignore-eos --threads 2 --dump-logits ";
  const auto run = [&](const std::string& tag, const std::string& how) {
    return sh("timeout 300 " + k_bin + args + (dir_ / (tag + ".logits")).string() + how + " > " +
              (dir_ / (tag + ".out")).string() + " 2> " + (dir_ / (tag + ".err")).string());
  };
  ASSERT_EQ(run("cpu", " --weight-dtype bf16 --kv-dtype bf16"), 0) << slurp(dir_ / "cpu.err");
  ASSERT_EQ(run("dev", " --device cuda:0 --weight-dtype bf16"), 0) << slurp(dir_ / "dev.err");
  ASSERT_EQ(sh("SNAP_MATVEC=f32act timeout 300 " + k_bin + args + (dir_ / "cpu_q4.logits").string() +
               " --kv-dtype bf16 > " + (dir_ / "cpu_q4.out").string() + " 2> " + (dir_ / "cpu_q4.err").string()),
            0)
      << slurp(dir_ / "cpu_q4.err");
  ASSERT_EQ(run("dev_q4", " --device cuda:0"), 0) << slurp(dir_ / "dev_q4.err");
  EXPECT_NE(slurp(dir_ / "dev_q4.err").find("q4_1"), std::string::npos) << slurp(dir_ / "dev_q4.err");
  const int port = snap::testing::free_port();
  std::string cmd = "(";
  for (int r = 1; r < 3; ++r)
    cmd += "timeout 300 " + k_bin + args + (dir_ / "tp3.logits.unused").string() + " --device cuda:0 --weight-dtype bf16 --tp 3 --tp-comm host --world-size 3 --leader 127.0.0.1:" +
           std::to_string(port) + " --rank " + std::to_string(r) + " > /dev/null 2>> " + (dir_ / "tp3.workers").string() + " & ";
  cmd += "timeout 300 " + k_bin + args + (dir_ / "tp3.logits").string() + " --device cuda:0 --weight-dtype bf16 --tp 3 --tp-comm host --world-size 3 --leader 127.0.0.1:" +
         std::to_string(port) + " --rank 0 > " + (dir_ / "tp3.out").string() + " 2> " + (dir_ / "tp3.err").string() + "; rc=$?; wait; exit $rc)";
  ASSERT_EQ(sh(cmd), 0) << slurp(dir_ / "tp3.err") << slurp(dir_ / "tp3.workers");
  EXPECT_GT(slurp(dir_ / "cpu.out").size(), 16u);
  EXPECT_EQ(slurp(dir_ / "dev.out"), slurp(dir_ / "cpu.out"));
  EXPECT_EQ(slurp(dir_ / "tp3.out"), slurp(dir_ / "cpu.out"));
  EXPECT_GT(slurp(dir_ / "cpu_q4.out").size(), 16u);
  EXPECT_EQ(slurp(dir_ / "dev_q4.out"), slurp(dir_ / "cpu_q4.out"));
  for (const auto& [ref, tag] : {std::pair<std::string, std::string>{"cpu", "dev"}, {"cpu", "tp3"}, {"cpu_q4", "dev_q4"}}) {
    const double worst = expect_top5_close(dir_ / (ref + ".logits"), dir_ / (tag + ".logits"), 49152, tag);
    std::printf("[ info ] SmolLM2 %s vs %s (%s weights, bf16 KV): worst top-5 logit difference %.4f\n", tag.c_str(),
                ref.c_str(), ref == "cpu" ? "bf16" : "the file's Q4_1/Q8_0", worst);
  }
}

// Gemma 3 270M as published in llama.cpp's Q4_K_M (Q4_K, Q6_K, Q5_0 and a Q8_0 table; setup.sh
// fetches it) on the device with --weight-dtype auto: held in those blocks, it gives the CPU
// engine's text (the CPU holds the K formats dequantized to f32: the same values, with
// SNAP_MATVEC=f32act) and prompt logits within the bound above; so does tp 2 (two processes,
// host-staged; its o_proj and down_proj slices are whole Q4_K/Q6_K super-blocks, its KV head
// replicated).
TEST_F(DeviceTpCli, RealGemmaQ4KMMatchesTheCpuEngine) {
  const char* env = std::getenv("SNAP_GEMMA_MODEL");
  const std::string model =
      env && *env ? env : std::string(std::getenv("HOME")) + "/.cache/snapserve/gemma-3-270m-q4_k_m.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no " << model;
  const std::string args = " generate --model " + model +
                           " --chat --prompt 'What is the capital of France? Answer in one sentence.' --max-tokens 16"
                           " --ignore-eos --threads 2 --dump-logits ";
  const auto run = [&](const std::string& tag, const std::string& how) {
    return sh("timeout 300 " + k_bin + args + (dir_ / (tag + ".logits")).string() + how + " > " +
              (dir_ / (tag + ".out")).string() + " 2> " + (dir_ / (tag + ".err")).string());
  };
  ASSERT_EQ(sh("SNAP_MATVEC=f32act timeout 300 " + k_bin + args + (dir_ / "cpu.logits").string() + " --kv-dtype bf16 > " +
               (dir_ / "cpu.out").string() + " 2> " + (dir_ / "cpu.err").string()),
            0)
      << slurp(dir_ / "cpu.err");
  ASSERT_EQ(run("dev", " --device cuda:0"), 0) << slurp(dir_ / "dev.err");
  EXPECT_NE(slurp(dir_ / "dev.err").find("q8_0 + q5_0 + q4_k + q6_k"), std::string::npos) << slurp(dir_ / "dev.err");
  const int port = snap::testing::free_port();
  const std::string tp = " --device cuda:0 --tp 2 --tp-comm host --world-size 2 --leader 127.0.0.1:" + std::to_string(port);
  const std::string cmd = "(timeout 300 " + k_bin + args + (dir_ / "tp2.unused").string() + tp + " --rank 1 > /dev/null 2> " +
                          (dir_ / "tp2.worker").string() + " & timeout 300 " + k_bin + args +
                          (dir_ / "tp2.logits").string() + tp + " --rank 0 > " + (dir_ / "tp2.out").string() + " 2> " +
                          (dir_ / "tp2.err").string() + "; rc=$?; wait; exit $rc)";
  ASSERT_EQ(sh(cmd), 0) << slurp(dir_ / "tp2.err") << slurp(dir_ / "tp2.worker");
  EXPECT_NE(slurp(dir_ / "tp2.err").find("q4_k"), std::string::npos) << slurp(dir_ / "tp2.err");
  EXPECT_GT(slurp(dir_ / "cpu.out").size(), 8u);
  EXPECT_EQ(slurp(dir_ / "dev.out"), slurp(dir_ / "cpu.out"));
  EXPECT_EQ(slurp(dir_ / "tp2.out"), slurp(dir_ / "cpu.out"));
  for (const std::string tag : {"dev", "tp2"}) {
    const double worst = expect_top5_close(dir_ / "cpu.logits", dir_ / (tag + ".logits"), 262144, tag);
    std::printf("[ info ] Gemma 3 270M Q4_K_M %s vs cpu: worst top-5 logit difference %.4f\n", tag.c_str(), worst);
  }
}

// Under mpirun the host-staged exchange goes over MPI, which has no timeout of its own: a rank
// that stops (SIGSTOP) mid-generation must end the job within about --collective-timeout,
// naming it (comm/mpi.cpp), rather than hang until `timeout` (exit 124). SmolLM2 at tp 3,
// so that decoding lasts long enough to be stopped.
TEST_F(DeviceTpCli, StoppedMpiRankEndsTheJobNamingIt) {
  const char* env = std::getenv("SNAP_MODEL");
  const std::string model = env && *env ? env : std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no " << model;
  if (sh(std::string(SNAP_MPIEXEC) + " --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no " << SNAP_MPIEXEC;
  const std::string job = "timeout 120 " + std::string(SNAP_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 3 " + k_bin +
                          " generate --model " + model + " --prompt-file " + (dir_ / "prompt.txt").string() +
                          " --max-tokens 4000 --ignore-eos --threads 1 --device cuda:0 --tp 3 --tp-comm host --collective-timeout 2";
  const snap::testing::StoppedJob r = snap::testing::stop_rank_of_job(job, dir_, (dir_ / "prompt.txt").string(), 1);
  ASSERT_TRUE(r.setup_error.empty()) << r.setup_error;
  ASSERT_NE(r.exit_code, -1) << "job still running " << r.seconds << " s after rank 1 stopped";
  EXPECT_NE(r.exit_code, 0) << r.log;
  EXPECT_NE(r.exit_code, 124) << "mpirun hung until timeout killed it\n" << r.log;
  EXPECT_LT(r.seconds, 30.0) << r.log;
  // Rank 0 or 2 names rank 1 alone (a rank in the second round of a large all-reduce may also
  // name a live rank still in the first).
  EXPECT_TRUE(std::regex_search(r.log, std::regex("comm/mpi: rank [02]: (all_reduce_sum|all_gather|broadcast) waited [0-9.]+ s "
                                                  "for rank 1 \\(--collective-timeout 2 s\\): it died or hangs")))
      << r.log;
  std::printf("[ info ] the job ended %.1f s after rank 1 stopped (--collective-timeout 2)\n", r.seconds);
}

// `snapserve batch --device cuda:0 --tp 2` (what deploy/slurm/batch_tp.sbatch runs with
// BATCH_DEVICE=cuda): the serving engine's lockstep under the batch runner; every record's
// choices equal one process's (SnapKV lines included), and rank 1 exits 0.
TEST_F(DeviceTpCli, BatchTwoProcessesEqualOne) {
  std::vector<std::string> prompts;
  {
    std::ofstream in(dir_ / "batch.jsonl");
    for (int i = 0; i < 6; ++i) {
      // Strings appended piece by piece: GCC 12 misreads "c" + std::string&& (-Wrestrict).
      std::string prompt = slurp(dir_ / "prompt.txt").substr(0, 200 + 40 * i);
      prompt += " w";
      prompt += std::to_string(i);
      prompts.push_back(prompt);
      json body = {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}};
      if (i % 2 == 1) body["kv_compression"] = {{"policy", "snapkv"}, {"budget", 32}, {"window", 8}};
      std::string id = "c";
      id += std::to_string(i);
      in << json{{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}.dump() << "\n";
    }
  }
  const std::string common = " batch --device cuda:0 --model " + (dir_ / "m").string() + " --input " +
                             (dir_ / "batch.jsonl").string() + " --max-num-seqs 4";
  ASSERT_EQ(sh("timeout 300 " + k_bin + common + " --output " + (dir_ / "b1.jsonl").string() + " > " +
               (dir_ / "b1.log").string() + " 2>&1"),
            0)
      << slurp(dir_ / "b1.log");
  const int port = snap::testing::free_port();
  const std::string group = common + " --output " + (dir_ / "b2.jsonl").string() +
                            " --tp 2 --tp-comm host --world-size 2 --leader 127.0.0.1:" + std::to_string(port);
  const int rc = sh("(timeout 300 " + k_bin + group + " --rank 1 > " + (dir_ / "b2.r1").string() + " 2>&1 & p1=$!; timeout 300 " +
                    k_bin + group + " --rank 0 > " + (dir_ / "b2.log").string() + " 2>&1; rc=$?; wait $p1 || rc=91; exit $rc)");
  ASSERT_EQ(rc, 0) << slurp(dir_ / "b2.log") << slurp(dir_ / "b2.r1");
  const auto records = [](const fs::path& p) {
    std::map<std::string, json> out;
    std::ifstream in(p);
    for (std::string line; std::getline(in, line);) {
      const json r = json::parse(line);
      out[r["custom_id"].get<std::string>()] = r["response"]["body"]["choices"];
    }
    return out;
  };
  const auto by_one = records(dir_ / "b1.jsonl"), by_two = records(dir_ / "b2.jsonl");
  ASSERT_EQ(by_one.size(), 6u);
  ASSERT_EQ(by_two.size(), 6u);
  EXPECT_NE(slurp(dir_ / "b2.log").find("6 of 6 done"), std::string::npos) << slurp(dir_ / "b2.log");
  for (int i = 0; i < 6; ++i) {
    std::string id = "c";  // piece by piece, as above (-Wrestrict)
    id += std::to_string(i);
    if (by_two.at(id) == by_one.at(id)) continue;
    // Only a SnapKV record may differ, and only where one process and two keep different
    // entries of its prompt: a near-tie at a head's cut-off (see SnapKvPerRankSelects...).
    // Then the same prompt through `generate` must show that difference, within the allowance;
    // a record whose selections agree must have the same text.
    ASSERT_EQ(i % 2, 1) << id << " (full cache) differs: " << by_two.at(id).dump() << " vs " << by_one.at(id).dump();
    const fs::path prompt = dir_ / (id + ".prompt.txt");
    std::ofstream(prompt) << prompts[static_cast<size_t>(i)];
    int64_t total = 0, differ = 0;
    Outcome a, b;
    compare_selections(id, prompt, &total, &differ, &a, &b);
    if (HasFatalFailure()) return;
    std::printf("[ info ] %s: the texts part; its SnapKV selections: %lld of %lld kept entries differ\n", id.c_str(),
                static_cast<long long>(differ), static_cast<long long>(total));
    EXPECT_GT(differ, 0) << id << " keeps the same entries with one process and two, yet its text differs: "
                         << by_two.at(id).dump() << " vs " << by_one.at(id).dump();
    EXPECT_LE(differ, k_selection_mismatch * total) << id;
  }
}

}  // namespace
}  // namespace snap

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_device_tp_cli: no CUDA device (%s): skipped\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  return RUN_ALL_TESTS();
}
