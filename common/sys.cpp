// Reads /proc/self/status for resident memory figures.
#include "common/sys.h"

#include <cstdio>
#include <cstring>

namespace snap {
namespace {

int64_t read_status_kib(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  int64_t kib = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, n) == 0) {
      long long v = 0;
      if (std::sscanf(line + n, " %lld", &v) == 1) kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib;
}

}  // namespace

int64_t peak_rss_bytes() { return read_status_kib("VmHWM:") * 1024; }
int64_t current_rss_bytes() { return read_status_kib("VmRSS:") * 1024; }

}  // namespace snap
