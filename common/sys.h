// Process facts and clocks: wall time, peak/current resident memory.
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

}  // namespace snap
