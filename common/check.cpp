// CHECK failure reporting: print file:line, the failed expression and the message, abort.
#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace snap::detail {

CheckFailure::CheckFailure(const char* file, int line, const char* expr) {
  os_ << "CHECK failed at " << file << ":" << line << ": " << expr << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", os_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace snap::detail
