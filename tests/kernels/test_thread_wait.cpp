// threads_wait_setup (kernels/thread_wait.h): the mode reaches libgomp. Each case forks a
// child that runs threads_wait_setup() with a --threads-wait argument; the re-executed child
// (this test binary again, filtered to ThreadsWait.ChildReport) prints what libgomp itself
// read at load time (omp_display_env) and the parent checks it. Also: an unknown mode is a
// one-line error (2), and the user's own OMP_WAIT_POLICY wins without any re-execution.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/thread_wait.h"

namespace snap::kernels {
namespace {

// Runs in the re-executed child only (SNAP_TW_CHILD set): libgomp's view of its settings.
TEST(ThreadsWait, ChildReport) {
  if (std::getenv("SNAP_TW_CHILD") == nullptr) GTEST_SKIP() << "runs inside ThreadsWait's children";
  std::printf("describe: %s\n", threads_wait_describe().c_str());
  std::fflush(stdout);
  omp_display_env(1);
}

// Forks; the child clears the OpenMP environment (ctest sets OMP_WAIT_POLICY), sends
// stdout+stderr to a file and calls threads_wait_setup(argv). Returns {exit code, output}.
std::pair<int, std::string> run_child(const std::vector<std::string>& extra, const char* user_policy = nullptr) {
  char path[] = "/tmp/snap_test_thread_wait_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    unsetenv("GOMP_SPINCOUNT");
    unsetenv("SNAP_THREADS_WAIT");
    unsetenv("SNAP_THREADS_WAIT_APPLIED");
    if (user_policy) setenv("OMP_WAIT_POLICY", user_policy, 1);
    else unsetenv("OMP_WAIT_POLICY");
    setenv("SNAP_TW_CHILD", "1", 1);
    std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=ThreadsWait.ChildReport"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = threads_wait_setup(static_cast<int>(args.size()), argv.data());
    // Only here without a re-execution (error, or nothing to change).
    std::printf("no re-exec, rc %d\n", rc);
    std::fflush(stdout);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  close(fd);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  unlink(path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

// auto resolves from the load at start: whichever it picked, libgomp must run with it.
TEST(ThreadsWait, AutoAppliesWhatItResolved) {
  const auto [rc, out] = run_child({"--threads-wait", "auto", "--threads", "2"});
  EXPECT_EQ(rc, 0) << out;
  const bool passive = out.find("auto: passive") != std::string::npos;
  const bool spin = out.find("no re-exec, rc 0") != std::string::npos;
  EXPECT_TRUE(passive != spin) << out;
  if (passive) {
    EXPECT_NE(out.find("OMP_WAIT_POLICY = 'PASSIVE'"), std::string::npos) << out;
    EXPECT_NE(out.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << out;
  }
}

TEST(ThreadsWait, AutoResolvesFromTheLoad) {
  EXPECT_EQ(threads_wait_resolve_auto(0.2, 2, 2), ThreadsWait::spin);     // idle
  EXPECT_EQ(threads_wait_resolve_auto(1.0, 2, 2), ThreadsWait::passive);  // one busy competitor
  EXPECT_EQ(threads_wait_resolve_auto(1.0, 1, 2), ThreadsWait::spin);     // a core left for us
  EXPECT_EQ(threads_wait_resolve_auto(9.0, 16, 32), ThreadsWait::spin);
  EXPECT_EQ(threads_wait_resolve_auto(20.0, 16, 32), ThreadsWait::passive);
  EXPECT_GE(threads_wait_others_runnable(), 0.0);
}

// Work that is running now counts at once, and work that ended does not linger: four busy
// threads add about four to the count, and after they stop it falls back within the 30 ms of
// sampling (the 1-minute load average would still hold them). Other tests may run beside this
// one (ctest -j), so each attempt compares before/during/after and one clean attempt of 5 passes.
TEST(ThreadsWait, OthersRunnableIsWhatRunsNow) {
  std::ostringstream seen;
  bool ok = false;
  for (int attempt = 0; attempt < 5 && !ok; ++attempt) {
    const double before = threads_wait_others_runnable();
    std::atomic<bool> stop{false};
    std::vector<std::thread> busy;
    for (int i = 0; i < 4; ++i) {
      busy.emplace_back([&stop] {
        volatile uint64_t x = 0;
        while (!stop.load(std::memory_order_relaxed)) x = x + 1;
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const double during = threads_wait_others_runnable();
    stop = true;
    for (std::thread& t : busy) t.join();
    const double after = threads_wait_others_runnable();
    seen << " [" << before << ", " << during << ", " << after << "]";
    ok = during >= before + 2.0 && after <= during - 2.0;
  }
  EXPECT_TRUE(ok) << "others runnable before, with 4 busy threads, after:" << seen.str();
}

TEST(ThreadsWait, PassiveSleepsAtOnce) {
  const auto [rc, out] = run_child({"--threads-wait=passive"});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("OMP_WAIT_POLICY = 'PASSIVE'"), std::string::npos) << out;
  EXPECT_NE(out.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << out;
}

TEST(ThreadsWait, SpinKeepsLibgompDefaultsWithoutRestarting) {
  const auto [rc, out] = run_child({"--threads-wait", "spin"});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("no re-exec, rc 0"), std::string::npos) << out;
}

TEST(ThreadsWait, UserEnvironmentWins) {
  const auto [rc, out] = run_child({"--threads-wait", "auto"}, "ACTIVE");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("no re-exec, rc 0"), std::string::npos) << out;
}

TEST(ThreadsWait, UnknownModeIsAOneLineError) {
  const auto [rc, out] = run_child({"--threads-wait", "sometimes"});
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("error: --threads-wait 'sometimes' is not one of spin, passive, auto\n"), std::string::npos) << out;
}

TEST(ThreadsWait, Names) {
  ThreadsWait w = ThreadsWait::spin;
  EXPECT_TRUE(threads_wait_from_name("auto", &w));
  EXPECT_EQ(w, ThreadsWait::auto_);
  EXPECT_TRUE(threads_wait_from_name("passive", &w));
  EXPECT_EQ(w, ThreadsWait::passive);
  EXPECT_FALSE(threads_wait_from_name("Passive", &w));
  EXPECT_STREQ(threads_wait_name(ThreadsWait::spin), "spin");
  EXPECT_EQ(threads_wait_env(ThreadsWait::spin).wait_policy, "");
  EXPECT_EQ(threads_wait_env(ThreadsWait::passive).wait_policy, "PASSIVE");
}

}  // namespace
}  // namespace snap::kernels
