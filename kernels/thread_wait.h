// How idle OpenMP threads wait between parallel regions (libgomp). A decode step runs a few
// hundred short regions; spinning threads (libgomp's default: ~300k pause loops, several ms)
// make that collapse when another process competes for the cores, passive ones (futex sleep)
// cost a wake-up per region on an idle machine. libgomp reads OMP_WAIT_POLICY/GOMP_SPINCOUNT
// once, when it is loaded, before main() runs, so threads_wait_setup() sets them and re-executes
// the program once (same pid, same argv) when they must change.
#pragma once

#include <string>

namespace snap::kernels {

enum class ThreadsWait : unsigned char { spin, passive, auto_ };

// "spin" | "passive" | "auto" -> true and *out set; anything else -> false.
bool threads_wait_from_name(const std::string& name, ThreadsWait* out);
const char* threads_wait_name(ThreadsWait w);

// The environment a mode asks for (empty value: leave that variable unset):
//   spin:    libgomp's defaults (OMP_WAIT_POLICY unset, GOMP_SPINCOUNT unset)
//   passive: OMP_WAIT_POLICY=PASSIVE (sleep at once)
//   auto:    resolved at start to spin or passive by threads_wait_resolve_auto()
struct ThreadsWaitEnv {
  std::string wait_policy, spin_count;
};
ThreadsWaitEnv threads_wait_env(ThreadsWait w);

// auto: passive when other runnable work + our threads exceed the cores (by more than 0.5),
// else spin, so an idle machine decodes exactly as with libgomp's default. Measured on this
// 2-core box at load ~9 (bench_generate, prompt 512, 2 threads): spin 337 ms/token, passive
// 73; GOMP_SPINCOUNT=300/1000/4000 85/97/189, so no fixed spin count was as good as passive there.
ThreadsWait threads_wait_resolve_auto(double others_runnable, int threads, int cores);
// Other runnable work now: the runnable tasks but this one (/proc/loadavg), averaged over 10
// readings 3 ms apart (30 ms at start). Not the 1-minute load average, which still counts work
// that ended up to a minute ago and so chose passive on idle machines.
double threads_wait_others_runnable();

// Call first thing in main(), before any OpenMP region. The mode comes from argv
// (`--threads-wait MODE` or `--threads-wait=MODE`, anywhere), else env SNAP_THREADS_WAIT,
// else auto (resolved here, once, from the load at start and `--threads N`). If the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT themselves, nothing changes.
// Otherwise, when the environment differs from what the mode asks for, it is set and the
// program re-executes itself once (/proc/self/exe). Returns 0, or 2 after printing a one-line
// error for an unknown mode (the caller exits with it).
int threads_wait_setup(int argc, char** argv);

// What this process runs with, for the startup line: e.g. "spin (libgomp default)",
// "auto: passive, 1.2 other runnable on 2 cores at start (OMP_WAIT_POLICY=PASSIVE)",
// "user (OMP_WAIT_POLICY=active)".
std::string threads_wait_describe();

}  // namespace snap::kernels
