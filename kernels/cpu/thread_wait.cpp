// threads_wait_setup (kernels/thread_wait.h): choose libgomp's wait policy before it matters.
// libgomp reads its environment in a constructor that runs when the library is loaded, so a
// setenv() in main() comes too late; the only way to change it from inside is to set the
// variables and exec the same binary again, which keeps the pid (mpirun, supervisors and tests
// that hold it are unaffected) and costs one program start (~10 ms). Two variables guard it:
// SNAP_THREADS_WAIT_APPLIED (which mode set the environment, inherited by children, so a
// child asking for another mode may change it) and SNAP_THREADS_WAIT_EXEC (set only across the
// exec, so the program never re-executes twice).
#include "kernels/thread_wait.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace snap::kernels {

namespace {

// auto's margin: the cores count as taken when other runnable work + our threads exceeds
// the cores by this much (the 1-minute load of an idle machine hovers at 0.1-0.3).
constexpr double k_auto_margin = 0.5;

constexpr const char* k_env_applied = "SNAP_THREADS_WAIT_APPLIED";
constexpr const char* k_env_exec = "SNAP_THREADS_WAIT_EXEC";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

void set_or_unset(const char* name, const std::string& value) {
  if (value.empty()) unsetenv(name);
  else setenv(name, value.c_str(), 1);
}

}  // namespace

bool threads_wait_from_name(const std::string& name, ThreadsWait* out) {
  if (name == "spin") *out = ThreadsWait::spin;
  else if (name == "passive") *out = ThreadsWait::passive;
  else if (name == "auto") *out = ThreadsWait::auto_;
  else return false;
  return true;
}

const char* threads_wait_name(ThreadsWait w) {
  switch (w) {
    case ThreadsWait::spin: return "spin";
    case ThreadsWait::passive: return "passive";
    case ThreadsWait::auto_: return "auto";
  }
  return "auto";
}

ThreadsWaitEnv threads_wait_env(ThreadsWait w) {
  switch (w) {
    case ThreadsWait::spin: return {"", ""};
    case ThreadsWait::passive: return {"PASSIVE", ""};
    case ThreadsWait::auto_: return {"", ""};  // resolved to spin or passive first
  }
  return {"", ""};
}

ThreadsWait threads_wait_resolve_auto(double others, int threads, int cores) {
  return others + threads > cores + k_auto_margin ? ThreadsWait::passive : ThreadsWait::spin;
}

double threads_wait_others_runnable() {
  // The runnable tasks now (the 4th field of /proc/loadavg counts this thread too), averaged
  // over k_samples readings k_sample_us apart. Not the 1-minute load average: it still holds
  // work that ended up to a minute ago (the previous run of a benchmark loop, a build that just
  // finished) and chose passive on idle machines, where it decodes 3-4x slower than spin
  // (bench/run_decode_floor.sh on a 2-core Zen 5: 85 vs 311 tok/s).
  constexpr int k_samples = 10;
  constexpr useconds_t k_sample_us = 3000;
  double sum = 0.0;
  int read = 0;
  for (int i = 0; i < k_samples; ++i) {
    if (i > 0) usleep(k_sample_us);
    std::FILE* f = std::fopen("/proc/loadavg", "r");
    if (f == nullptr) break;
    double load1 = 0, load5 = 0, load15 = 0;
    int running = 0, total = 0;
    const int n = std::fscanf(f, "%lf %lf %lf %d/%d", &load1, &load5, &load15, &running, &total);
    std::fclose(f);
    if (n < 4) break;
    sum += std::max(0, running - 1);
    ++read;
  }
  return read > 0 ? sum / read : 0.0;
}

int threads_wait_setup(int argc, char** argv) {
  const bool reexecuted = std::getenv(k_env_exec) != nullptr;
  unsetenv(k_env_exec);
  // The restarted program keeps what the first run decided (auto must not decide twice).
  if (reexecuted && std::getenv(k_env_applied) != nullptr) return 0;
  std::string name = env_or_empty("SNAP_THREADS_WAIT");
  const char* source = "SNAP_THREADS_WAIT";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads-wait") == 0 && i + 1 < argc) {
      name = argv[i + 1];
      source = "--threads-wait";
    } else if (std::strncmp(argv[i], "--threads-wait=", 15) == 0) {
      name = argv[i] + 15;
      source = "--threads-wait";
    }
  }
  ThreadsWait mode = ThreadsWait::auto_;
  if (!name.empty() && !threads_wait_from_name(name, &mode)) {
    std::fprintf(stderr, "error: %s '%s' is not one of spin, passive, auto\n", source, name.c_str());
    return 2;
  }
  const std::string policy = env_or_empty("OMP_WAIT_POLICY"), spins = env_or_empty("GOMP_SPINCOUNT");
  const bool user_set = (!policy.empty() || !spins.empty()) && std::getenv(k_env_applied) == nullptr;
  if (user_set) return 0;  // the user's own libgomp settings win
  std::string applied = threads_wait_name(mode);
  if (mode == ThreadsWait::auto_) {
    int threads = 0;  // --threads N as the subcommand will read it; else OpenMP's default, the cores
    for (int i = 1; i + 1 < argc; ++i)
      if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    const int cores = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    const double others = threads_wait_others_runnable();
    mode = threads_wait_resolve_auto(others, threads > 0 ? threads : cores, cores);
    char why[96];
    std::snprintf(why, sizeof why, "auto: %s, %.1f other runnable on %d cores at start", threads_wait_name(mode),
                  others, cores);
    applied = why;
  }
  const ThreadsWaitEnv want = threads_wait_env(mode);
  setenv(k_env_applied, applied.c_str(), 1);
  if (policy == want.wait_policy && spins == want.spin_count) return 0;
  set_or_unset("OMP_WAIT_POLICY", want.wait_policy);
  set_or_unset("GOMP_SPINCOUNT", want.spin_count);
  setenv(k_env_exec, "1", 1);
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
  // exec failed (no /proc?): carry on with the policy libgomp already read.
  unsetenv(k_env_exec);
  std::fprintf(stderr, "warning: --threads-wait %s: could not re-execute (%s), running with libgomp's defaults\n",
               threads_wait_name(mode), std::strerror(errno));
  return 0;
}

std::string threads_wait_describe() {
  const std::string policy = env_or_empty("OMP_WAIT_POLICY"), spins = env_or_empty("GOMP_SPINCOUNT");
  std::string env;
  if (!policy.empty()) env += "OMP_WAIT_POLICY=" + policy;
  if (!spins.empty()) env += std::string(env.empty() ? "" : " ") + "GOMP_SPINCOUNT=" + spins;
  if (env.empty()) env = "libgomp default";
  const char* applied = std::getenv(k_env_applied);
  return std::string(applied ? applied : "user") + " (" + env + ")";
}

}  // namespace snap::kernels
