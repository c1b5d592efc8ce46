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

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace snap::kernels {

namespace {

// GOMP_SPINCOUNT for auto. One libgomp spin is a relaxed load + `pause` (~25 ns on this
// AMD EPYC), so 4000 spins ≈ 0.1 ms: longer than the gaps between a decode step's regions on
// an idle machine (tens of µs), far shorter than a scheduler time slice (~3 ms) spent spinning
// for a thread that another process has pushed off its core. Measured by bench/run_decode_floor.sh.
constexpr const char* k_threads_wait_auto_spins = "4000";

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
    case ThreadsWait::auto_: return {"", k_threads_wait_auto_spins};
  }
  return {"", ""};
}

int threads_wait_setup(int argc, char** argv) {
  const bool reexecuted = std::getenv(k_env_exec) != nullptr;
  unsetenv(k_env_exec);
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
  const ThreadsWaitEnv want = threads_wait_env(mode);
  setenv(k_env_applied, threads_wait_name(mode), 1);
  if (policy == want.wait_policy && spins == want.spin_count) return 0;
  if (reexecuted) {  // the exec did not bring the environment: do not loop
    std::fprintf(stderr, "warning: --threads-wait %s: environment not applied, running with libgomp's\n",
                 threads_wait_name(mode));
    return 0;
  }
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
