// Reads /proc for resident memory figures and other processes' states.
#include "common/sys.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
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

// The whole of a small file, or "" when it cannot be read.
std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::ostringstream out;
  out << f.rdbuf();
  return out.str();
}

// The value after `key` (e.g. "inactive_file ") at the start of a line of `text`, or -1.
int64_t keyed_value(const std::string& text, const std::string& key) {
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (line.compare(0, key.size(), key) == 0) {
      long long v = 0;
      if (std::sscanf(line.c_str() + key.size(), " %lld", &v) == 1) return v;
    }
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return -1;
}

// A whole file holding one number ("max" or an unreadable file: -1).
int64_t file_number(const std::string& path) {
  const std::string t = read_small_file(path);
  long long v = 0;
  return std::sscanf(t.c_str(), "%lld", &v) == 1 ? v : -1;
}

void take_smaller(MemoryHeadroom* h, int64_t bytes, const std::string& limit) {
  if (bytes < 0) bytes = 0;
  if (h->bytes < 0 || bytes < h->bytes) {
    h->bytes = bytes;
    h->limit = limit;
  }
}

}  // namespace

std::string mib_text(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

int64_t mapped_bytes() { return read_status_kib("VmSize:") * 1024; }

MemoryHeadroom cgroup_memory_headroom(const std::string& proc_self_cgroup, const std::string& root) {
  MemoryHeadroom h;
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "hierarchy-id:controllers:path": v2 is "0::path"; v1's memory line names "memory".
    const size_t c1 = line.find(':'), c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    std::string controllers(1, ',');  // ",memory," or ",," (v2): each name between commas
    controllers.append(line, c1 + 1, c2 - c1 - 1).push_back(',');
    const bool v2 = line.compare(0, c1, "0") == 0 && controllers == ",,";
    if (!v2 && controllers.find(",memory,") == std::string::npos) continue;
    const std::string mount = v2 ? root : root + "/memory";
    const char* limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char* usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
    const char* file_keys[2] = {v2 ? "active_file " : "total_active_file ", v2 ? "inactive_file " : "total_inactive_file "};
    // From this process's cgroup up to the mount (a container sees its own cgroup as the mount).
    std::string path = line.substr(c2 + 1);
    while (true) {
      const std::string dir = mount + (path == "/" ? "" : path);
      const int64_t limit = file_number(dir + "/" + limit_file);
      // v1 writes "no limit" as a huge page-rounded number.
      if (limit > 0 && limit < (int64_t{1} << 60)) {
        const int64_t usage = file_number(dir + "/" + usage_file);
        // Page-cache pages (the model file's among them) are reclaimed before the limit bites.
        const std::string stat = read_small_file(dir + "/memory.stat");
        int64_t file_pages = 0;
        for (const char* key : file_keys) file_pages += std::max<int64_t>(0, keyed_value(stat, key));
        if (usage >= 0) take_smaller(&h, limit - (usage - std::min(file_pages, usage)), "cgroup " + dir + "/" + limit_file);
      }
      if (path.empty() || path == "/") break;
      const size_t slash = path.find_last_of('/');
      path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
    }
  }
  return h;
}

MemoryHeadroom memory_headroom() {
  MemoryHeadroom h = cgroup_memory_headroom(read_small_file("/proc/self/cgroup"), "/sys/fs/cgroup");
  const int64_t available_kib = keyed_value(read_small_file("/proc/meminfo"), "MemAvailable:");
  if (available_kib >= 0) take_smaller(&h, available_kib * 1024, "MemAvailable");
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    take_smaller(&h, static_cast<int64_t>(as.rlim_cur) - mapped_bytes(), "ulimit -v");
  return h;
}

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
