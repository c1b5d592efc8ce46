// Test helpers for model files: a self-deleting temp dir, tools/make_tiny_checkpoint.py
// run at test time (tiny random checkpoints in HF and GGUF form), a hand-written
// safetensors writer for malformed inputs, and the default-model path (SNAP_MODEL).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace snap::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/snap_" + tag + "_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs tools/make_tiny_checkpoint.py with `args` into `out` (HF form in out/hf, GGUF in
// out/model.gguf). Returns false (and records a failure) if the script fails.
inline bool make_tiny_checkpoint(const std::string& out, const std::string& args) {
  const std::string cmd = "python3 " SNAP_SOURCE_DIR "/tools/make_tiny_checkpoint.py --out '" + out + "' " + args;
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "fixture generation failed (rc " << rc << "): " << cmd;
    return false;
  }
  return true;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a header JSON text and a data section, byte for byte; the
// 8-byte length is `header.size()` unless `claimed_header_len` overrides it.
inline void write_safetensors_raw(const std::string& path, const std::string& header, const std::string& data,
                                  int64_t claimed_header_len = -1) {
  const uint64_t n = claimed_header_len >= 0 ? static_cast<uint64_t>(claimed_header_len) : header.size();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_file(path, bytes + header + data);
}

// SNAP_MODEL, else $HOME/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf.
inline std::string default_model_path() {
  if (const char* env = std::getenv("SNAP_MODEL"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace snap::testing
