// SHA-256 (FIPS 180-4) for provenance: fingerprints of input corpora and model files, so a
// resumed or merged run can prove it reads the bytes it started with. Incremental: feed any
// number of update() calls, then hex() once.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace snap {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // The digest as 64 lowercase hex digits; the object is spent afterwards.
  std::string hex();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view data);
// Streams the file; io_error naming the path when it cannot be read.
Result<std::string> sha256_file(const std::string& path);

}  // namespace snap
