// CHECK: broken invariants abort with file:line and a message. Not for bad input —
// bad input returns a Status (common/status.h).
#pragma once

#include <sstream>

namespace snap::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expr);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

// Lets `CHECK(x) << "msg";` compile to nothing when x holds.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace snap::detail

#define CHECK(cond) \
  (cond) ? (void)0 : ::snap::detail::Voidify() & ::snap::detail::CheckFailure(__FILE__, __LINE__, #cond)
#define CHECK_EQ(a, b) CHECK((a) == (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
#define CHECK_LT(a, b) CHECK((a) < (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
#define CHECK_LE(a, b) CHECK((a) <= (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
#define CHECK_GT(a, b) CHECK((a) > (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
#define CHECK_GE(a, b) CHECK((a) >= (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
