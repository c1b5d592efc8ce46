// A `generate --dump-logits` file read back (the format of coordinator/engine/logits_dump.h and
// tools/read_logits.py: a 32-byte header with the row count at byte 16 and the vocabulary at 24,
// the prompt ids, then one f32 row of logits per prompt position), and the log-softmax the
// tests compare echo's prompt logprobs with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace snap::testing {

struct DumpedLogits {
  int64_t n = 0, vocab = 0;
  std::vector<int32_t> ids;  // [n]
  std::vector<float> rows;   // [n, vocab]
  const float* row(int64_t i) const { return rows.data() + i * vocab; }
};

// False when the file is missing or shorter than its header says.
inline bool read_logits_dump(const std::string& path, DumpedLogits* d) {
  std::ifstream in(path, std::ios::binary);
  char head[32];
  if (!in.read(head, 32)) return false;
  std::memcpy(&d->n, head + 16, 8);
  std::memcpy(&d->vocab, head + 24, 8);
  if (d->n < 0 || d->vocab <= 0) return false;
  d->ids.resize(static_cast<size_t>(d->n));
  d->rows.resize(static_cast<size_t>(d->n * d->vocab));
  return static_cast<bool>(in.read(reinterpret_cast<char*>(d->ids.data()), 4 * d->n)) &&
         static_cast<bool>(in.read(reinterpret_cast<char*>(d->rows.data()), 4 * d->n * d->vocab));
}

// log softmax(row)[id], in double.
inline double log_softmax_at(const float* row, int64_t vocab, int32_t id) {
  double mx = row[0], z = 0;
  for (int64_t t = 0; t < vocab; ++t) mx = std::max<double>(mx, row[t]);
  for (int64_t t = 0; t < vocab; ++t) z += std::exp(row[t] - mx);
  return row[id] - mx - std::log(z);
}

}  // namespace snap::testing
