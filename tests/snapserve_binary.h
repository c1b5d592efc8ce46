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

// The source tree (for tools/, e.g. make_random_model.py) and the Python that runs it: this
// build's, unless SNAP_TEST_SOURCE_DIR / SNAP_TEST_PYTHON name others. The device e2e tests
// are built on the CPU machine and run on a GPU machine whose paths differ
// (scripts/device_bundle.sh, scripts/device_check.sh).
#ifdef SNAP_SOURCE_DIR
inline std::string test_source_dir() {
  if (const char* p = std::getenv("SNAP_TEST_SOURCE_DIR"); p != nullptr && *p != '\0') return p;
  return SNAP_SOURCE_DIR;
}
#endif
#ifdef SNAP_PYTHON
inline std::string test_python() {
  if (const char* p = std::getenv("SNAP_TEST_PYTHON"); p != nullptr && *p != '\0') return p;
  return SNAP_PYTHON;
}
#endif
