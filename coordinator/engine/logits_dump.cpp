// LogitsDumpWriter: streams rows as prefill produces them (no [N, vocab] buffer held).
#include "coordinator/engine/logits_dump.h"

#include <cerrno>
#include <cstring>

namespace snap {

Result<LogitsDumpWriter*> LogitsDumpWriter::open(const std::string& path, const std::vector<int32_t>& ids,
                                                 int64_t vocab_size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return invalid_argument(path + ": cannot open for writing: " + std::strerror(errno));
  const char magic[8] = {'S', 'N', 'A', 'P', 'L', 'G', 'T', '1'};
  const uint32_t version = 1, dtype = 0;
  const int64_t n = static_cast<int64_t>(ids.size());
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(&version, 4, 1, f) == 1 &&
            std::fwrite(&dtype, 4, 1, f) == 1 && std::fwrite(&n, 8, 1, f) == 1 &&
            std::fwrite(&vocab_size, 8, 1, f) == 1 &&
            std::fwrite(ids.data(), 4, ids.size(), f) == ids.size();
  if (!ok) {
    std::fclose(f);
    return data_loss(path + ": write failed: " + std::strerror(errno));
  }
  return new LogitsDumpWriter(f, path, vocab_size);
}

LogitsDumpWriter::~LogitsDumpWriter() {
  if (f_) std::fclose(f_);
}

void LogitsDumpWriter::write_row(const float* logits) {
  if (std::fwrite(logits, sizeof(float), static_cast<size_t>(vocab_), f_) != static_cast<size_t>(vocab_)) {
    failed_ = true;
  }
}

Status LogitsDumpWriter::close() {
  const bool ok = std::fclose(f_) == 0 && !failed_;
  f_ = nullptr;
  if (!ok) return data_loss(path_ + ": write failed (disk full?)");
  return {};
}

}  // namespace snap
