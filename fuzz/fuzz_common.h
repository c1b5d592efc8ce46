// Shared by the fuzz targets: the parsers that take paths get the input as a file in a
// per-process scratch directory (tmpfs when there is one), rewritten for every input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace snap::fuzz {

inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string d = std::string(base) + "/snap_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes the input to scratch_dir()/name and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// The fixtures the targets need (a tokenizer), from the source tree.
inline std::string source_path(const std::string& rel) { return std::string(SNAP_SOURCE_DIR) + "/" + rel; }

}  // namespace snap::fuzz
