// Reads /proc for resident memory figures and other processes' states.
#include "common/sys.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

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

int64_t current_pid() { return static_cast<int64_t>(::getpid()); }

int64_t host_id() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return 1;
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  const int64_t id = static_cast<int64_t>(h & 0x7fffffffffffffffull);
  return id == 0 ? 1 : id;
}

char process_state(int64_t pid) {
  if (pid <= 0) return 0;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  // "pid (comm) S ...": comm may hold spaces and parentheses, so take the last ')'.
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* close = std::strrchr(buf, ')');
  if (!close || close[1] != ' ' || close[2] == 0) return 0;
  return close[2];
}

}  // namespace snap
