// The --dump-logits file: logits of every prompt position, for external comparison.
// Layout (little-endian):
//   char     magic[8] = "SNAPLGT1"
//   uint32   version = 1,  uint32 dtype = 0 (f32)
//   int64    num_positions, int64 vocab_size
//   int32    token_ids[num_positions]
//   float32  logits[num_positions][vocab_size]   (row p: logits after token p)
// tools/read_logits.py reads it into numpy.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"

namespace snap {

class LogitsDumpWriter {
 public:
  static Result<LogitsDumpWriter*> open(const std::string& path, const std::vector<int32_t>& ids, int64_t vocab_size);
  ~LogitsDumpWriter();
  void write_row(const float* logits);  // rows in position order
  Status close();

 private:
  LogitsDumpWriter(std::FILE* f, std::string path, int64_t vocab) : f_(f), path_(std::move(path)), vocab_(vocab) {}
  std::FILE* f_;
  std::string path_;
  int64_t vocab_;
  bool failed_ = false;
};

}  // namespace snap
