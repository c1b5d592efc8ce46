// The snapserve commit compiled into scoring records: the generated snap_git_commit.h
// (eval/longctx/git_commit.cmake) when the build provides it, else "unknown".
#pragma once

#include <string>

#if __has_include("snap_git_commit.h")
#include "snap_git_commit.h"
#endif

namespace snap::scoring {

inline std::string snapserve_commit() {
#ifdef SNAP_GIT_COMMIT
  return SNAP_GIT_COMMIT;
#else
  return "unknown";
#endif
}

}  // namespace snap::scoring
