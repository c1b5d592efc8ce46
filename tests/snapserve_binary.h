// Test helper: the snapserve binary an e2e test drives. This build's own, unless
// SNAP_TEST_SNAPSERVE names another: scripts/test.sh runs the Release build's e2e drivers
// against the AddressSanitizer build's binary, so that what runs under the sanitizers is the
// server, batch and eval processes under test, not the test's own HTTP client.
#pragma once

#include <cstdlib>
#include <string>

inline std::string snapserve_binary() {
  if (const char* p = std::getenv("SNAP_TEST_SNAPSERVE"); p != nullptr && *p != '\0') return p;
  return std::string(SNAP_BINARY_DIR) + "/snapserve";
}
