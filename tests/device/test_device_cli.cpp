// The --device seam of `snapserve generate` as a user meets it on a machine without a GPU (CI):
// --help explains the flag; --device cuda fails at once, before the model is read, with one
// line saying why — "no CUDA device (cudaGetDeviceCount: error N ...)" in a CUDA build (GPUs
// hidden with CUDA_VISIBLE_DEVICES="", so the test means the same on a GPU host), "this build
// has no CUDA (configure with -DSNAP_ENABLE_CUDA=ON)" in a build without; a malformed device
// and --tp with a device are refused; --device cpu is the default path, token for token.
// `serve --device` and `batch --device` meet the same contract (and refuse --kv-dtype other
// than bf16 there).
// The GPU side (--device cuda equals --device cpu) is tests/cuda/test_device_generate.cpp.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/free_port.h"
#include "tests/snapserve_binary.h"
#include "tests/worker/tiny_checkpoint.h"

namespace {

const std::string k_bin = snapserve_binary();

struct Out {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Out run(const snap::testing::TempDir& dir, const std::string& args, const std::string& env = "") {
  const std::string o = dir / "out", e = dir / "err";
  const int rc = std::system((env + " " + k_bin + " " + args + " >" + o + " 2>" + e).c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : 128, slurp(o), slurp(e)};
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(DeviceCli, HelpExplainsDevice) {
  snap::testing::TempDir dir("devcli_help");
  const Out r = run(dir, "generate --help");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("--device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cuda:N"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cpu (default"), std::string::npos) << r.out;
}

TEST(DeviceCli, CudaWithoutDeviceFailsFastInOneLine) {
  snap::testing::TempDir dir("devcli_nogpu");
  // The model path does not exist: the device must be refused before anything is loaded.
  for (const std::string dev : {"cuda", "cuda:1"}) {
    const Out r = run(dir, "generate --device " + dev + " --model " + (dir / "absent.gguf") + " --prompt hi",
                      "CUDA_VISIBLE_DEVICES=");
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    const std::string name = dev == "cuda" ? "cuda:0" : dev;
#if SNAP_TEST_BUILD_HAS_CUDA
    EXPECT_NE(r.err.find("snapserve: error: --device " + name + ": no CUDA device (cudaGetDeviceCount: error "),
              std::string::npos)
        << r.err;
#else
    EXPECT_NE(r.err.find("snapserve: error: --device " + name +
                         ": this build has no CUDA (configure with -DSNAP_ENABLE_CUDA=ON)"),
              std::string::npos)
        << r.err;
#endif
    EXPECT_EQ(r.err.find("absent.gguf"), std::string::npos) << "the model was read before the device was checked: " << r.err;
  }
}

TEST(DeviceCli, MalformedDeviceAndTpAreRefused) {
  snap::testing::TempDir dir("devcli_bad");
  for (const std::string dev : {"gpu", "cuda:", "cuda:x", "cuda0", "CUDA", "cuda:-1"}) {
    const Out r = run(dir, "generate --device " + dev + " --prompt hi");
    EXPECT_EQ(r.rc, 1) << dev << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--device '" + dev + "': expected cpu, cuda or cuda:N"), std::string::npos) << r.err;
  }
  // --tp with a device keeps the launcher's contract, as on the CPU: N processes for --tp N.
  const Out r = run(dir, "generate --device cuda --tp 2 --prompt hi");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--tp 2 but the launcher started 1 process(es)"), std::string::npos) << r.err;
  const Out c = run(dir, "generate --device cuda --tp-comm mpi --prompt hi");
  EXPECT_NE(c.rc, 0) << c.err;
  EXPECT_NE(c.err.find("--tp-comm"), std::string::npos) << c.err;
  // The device's KV cache is bf16: another --kv-dtype is refused, not silently replaced.
  const Out d = run(dir, "generate --device cuda --kv-dtype f16 --prompt hi");
  EXPECT_EQ(d.rc, 1) << d.err;
  EXPECT_EQ(lines(d.err), 1) << d.err;
  EXPECT_NE(d.err.find("--device cuda:0 keeps the KV cache in bf16; --kv-dtype f16 is CPU-only"), std::string::npos) << d.err;
}

// Two tensor-parallel ranks (--rank/--world-size/--leader, as a LeaderWorkerSet starts them)
// of `args` (a subcommand with --device cuda) on a machine without a GPU: each rank meets its
// group, then fails in one line naming itself, before reading the model (and before serving);
// neither waits for the other.
void expect_tp_ranks_fail_fast(const std::string& tag, const std::string& args) {
  snap::testing::TempDir dir(tag);
  const std::string leader = "127.0.0.1:" + std::to_string(snap::testing::free_port());
  std::string cmd = "CUDA_VISIBLE_DEVICES= timeout 60 sh -c '";
  for (int r = 0; r < 2; ++r) {
    cmd += "(" + k_bin + " " + args + " --device cuda --tp-comm host --tp 2 --rank " + std::to_string(r) +
           " --world-size 2 --leader " + leader + " --model " + (dir / "absent.gguf") + " >" +
           (dir / ("out" + std::to_string(r))) + " 2>" + (dir / ("err" + std::to_string(r))) + "; echo $? >" +
           (dir / ("rc" + std::to_string(r))) + (r == 0 ? ") & " : "); wait'");
  }
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  for (int r = 0; r < 2; ++r) {
    const std::string err = slurp(dir / ("err" + std::to_string(r)));
    EXPECT_EQ(slurp(dir / ("rc" + std::to_string(r))), "1\n") << args << ", rank " << r << ": " << err;
    EXPECT_EQ(lines(err), 1) << err;
    EXPECT_NE(err.find("error: rank " + std::to_string(r) + ": --device cuda:0: "), std::string::npos) << err;
#if SNAP_TEST_BUILD_HAS_CUDA
    EXPECT_NE(err.find("no CUDA device"), std::string::npos) << err;
#else
    EXPECT_NE(err.find("this build has no CUDA"), std::string::npos) << err;
#endif
    EXPECT_EQ(err.find("absent.gguf"), std::string::npos) << "the model was read before the device was checked: " << err;
    EXPECT_EQ(err.find("serving"), std::string::npos) << err;
  }
}

// --tp-exchange-dtype bf16 is a device flag: the CPU refuses it in one line (generate, serve, batch).
TEST(DeviceCli, BfloatExchangeIsForTheDevice) {
  snap::testing::TempDir dir("devcli_bf16x");
  const std::string batch = "batch --input /dev/null --output " + (dir / "never.jsonl");
  for (const std::string& cmd : {std::string("generate --prompt hi"), std::string("serve --port 0"), batch}) {
    const Out r = run(dir, cmd + " --tp-exchange-dtype bf16 --model " + (dir / "absent.gguf"));
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--tp-exchange-dtype bf16 is for --device cuda"), std::string::npos) << cmd << ": " << r.err;
  }
}

TEST(DeviceCli, TensorParallelRanksFailFastNamingTheirRank) { expect_tp_ranks_fail_fast("devcli_tp", "generate --prompt hi"); }

TEST(DeviceCli, ServeTensorParallelRanksFailFastNamingTheirRank) {
  expect_tp_ranks_fail_fast("devcli_serve_tp", "serve --port 0");
}

TEST(DeviceCli, BatchTensorParallelRanksFailFastNamingTheirRank) {
  expect_tp_ranks_fail_fast("devcli_batch_tp", "batch --input /dev/null --output /tmp/snap_devcli_batch_never.jsonl");
}

// serve --device: the same fail-fast contract as generate, before the model is read and before
// any port is bound, and the device's one-line refusals of what it does not run.
TEST(DeviceCli, ServeHelpExplainsDevice) {
  snap::testing::TempDir dir("devcli_serve_help");
  const Out r = run(dir, "serve --help");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("--device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cuda:N"), std::string::npos) << r.out;
}

TEST(DeviceCli, ServeCudaWithoutDeviceFailsFastInOneLine) {
  snap::testing::TempDir dir("devcli_serve_nogpu");
  for (const std::string dev : {"cuda", "cuda:2"}) {
    const Out r = run(dir, "serve --device " + dev + " --port 0 --model " + (dir / "absent.gguf"), "CUDA_VISIBLE_DEVICES=");
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    const std::string name = dev == "cuda" ? "cuda:0" : dev;
#if SNAP_TEST_BUILD_HAS_CUDA
    EXPECT_NE(r.err.find("snapserve: error: --device " + name + ": no CUDA device (cudaGetDeviceCount: error "),
              std::string::npos)
        << r.err;
#else
    EXPECT_NE(r.err.find("snapserve: error: --device " + name +
                         ": this build has no CUDA (configure with -DSNAP_ENABLE_CUDA=ON)"),
              std::string::npos)
        << r.err;
#endif
    EXPECT_EQ(r.err.find("absent.gguf"), std::string::npos) << "the model was read before the device was checked: " << r.err;
    EXPECT_EQ(r.err.find("serving"), std::string::npos) << r.err;
  }
}

TEST(DeviceCli, ServeRefusesMalformedDeviceTpAndKvDtype) {
  snap::testing::TempDir dir("devcli_serve_bad");
  Out r = run(dir, "serve --device cuda:x --port 0");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--device 'cuda:x': expected cpu, cuda or cuda:N"), std::string::npos) << r.err;
  r = run(dir, "serve --device cuda --tp 2 --port 0");  // --tp must match the launcher, on the device too
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--tp 2 but the launcher started 1 process(es)"), std::string::npos) << r.err;
  r = run(dir, "serve --device cuda --kv-dtype q8_0 --port 0");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--device cuda:0 keeps the KV cache in bf16; --kv-dtype q8_0 is CPU-only"), std::string::npos)
      << r.err;
}

TEST(DeviceCli, CpuIsTheDefaultPath) {
  snap::testing::TempDir dir("devcli_cpu");
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir.path(), "--arch llama --seed 5 >/dev/null"));
  const std::string args = "generate --model " + (dir / "model.gguf") + " --prompt 'the cat sat' --max-tokens 12 --ignore-eos";
  const Out a = run(dir, args);
  ASSERT_EQ(a.rc, 0) << a.err;
  const Out b = run(dir, args + " --device cpu");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
  EXPECT_EQ(b.err.find("snapserve: device "), std::string::npos) << "a device memory line on the CPU path: " << b.err;
}

}  // namespace
