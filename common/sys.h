// Process facts and clocks: wall time, peak/current resident memory, process identity
// and the state of another process on this host.
#pragma once

#include <chrono>
#include <cstdint>

namespace snap {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
int64_t peak_rss_bytes();
// Current resident set size in bytes (VmRSS), 0 if unknown.
int64_t current_rss_bytes();

// This process's id.
int64_t current_pid();
// A stable hash of this host's name (FNV-1a, never 0): two processes see the same value
// only on the same host (or in containers that share a host name).
int64_t host_id();
// The state letter of process `pid` on this host from /proc/<pid>/stat ('R' running,
// 'S' sleeping, 'T' stopped, 'Z' zombie, ...), or 0 when there is no such process.
char process_state(int64_t pid);

}  // namespace snap
