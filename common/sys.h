// Process facts and clocks: wall time, peak/current resident memory, process identity
// and the state of another process on this host.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace snap {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
int64_t peak_rss_bytes();
// Current resident set size in bytes (VmRSS), 0 if unknown.
int64_t current_rss_bytes();

// bytes as "12.3 MiB", for messages and reports.
std::string mib_text(int64_t bytes);

// Bytes of address space this process maps (VmSize), 0 if unknown.
int64_t mapped_bytes();

// How much more memory this process may take, and which limit says so: the least of the host's
// MemAvailable (/proc/meminfo), the room under each memory cgroup above this process (a pod's or
// a Slurm job's memory limit, less its usage but for page-cache pages, which the kernel reclaims
// before the limit bites) and the room under the address-space limit (ulimit -v, less what this
// process maps). bytes is -1 when no limit could be read.
struct MemoryHeadroom {
  int64_t bytes = -1;
  std::string limit;  // e.g. "MemAvailable", "cgroup /sys/fs/cgroup/kubepods/.../memory.max", "ulimit -v"
};
MemoryHeadroom memory_headroom();
// The cgroup part alone: /proc/self/cgroup's text, the cgroup file systems under `root` (v2 at
// root, v1's memory controller at root/memory); each directory from this process's cgroup up to
// the mount is looked at. For tests, with a made-up tree.
MemoryHeadroom cgroup_memory_headroom(const std::string& proc_self_cgroup, const std::string& root);

// This process's id.
int64_t current_pid();
// A stable hash of this host's name (FNV-1a, never 0): two processes see the same value
// only on the same host (or in containers that share a host name).
int64_t host_id();
// The state letter of process `pid` on this host from /proc/<pid>/stat ('R' running,
// 'S' sleeping, 'T' stopped, 'Z' zombie, ...), or 0 when there is no such process.
char process_state(int64_t pid);

}  // namespace snap
