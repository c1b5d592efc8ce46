// What the engines and the CLI say when an allocation fails (std::bad_alloc), and the fault
// injection its tests use.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/sys.h"

namespace snap {

// " with N MiB left (the limit that binds)", from memory_headroom(); empty when it is unknown.
inline std::string memory_left_phrase() {
  const MemoryHeadroom room = memory_headroom();
  return room.bytes >= 0 ? " with " + std::to_string(room.bytes >> 20) + " MiB left (" + room.limit + ")" : std::string();
}

// $SNAP_FAULT_BAD_ALLOC_STEP=N: the serving engines throw std::bad_alloc in their N-th step (for
// tests); 0 when unset.
inline int64_t fault_bad_alloc_step() {
  const char* f = std::getenv("SNAP_FAULT_BAD_ALLOC_STEP");
  return f ? std::atoll(f) : int64_t{0};
}

}  // namespace snap
