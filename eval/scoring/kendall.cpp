// Kendall tau-b by counting every pair: O(n^2), exact in integers. Our inputs are rankings
// of tens of systems, so the O(n log n) merge-sort form would buy nothing measurable.
#include "eval/scoring/kendall.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace snap::scoring {

Result<double> kendall_tau_b(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) {
    return invalid_argument("kendall: the two orderings have " + std::to_string(x.size()) + " and " +
                            std::to_string(y.size()) + " values");
  }
  const int64_t n = static_cast<int64_t>(x.size());
  if (n < 2) return invalid_argument("kendall: needs at least 2 values, got " + std::to_string(n));
  int64_t concordant = 0, discordant = 0, tied_x = 0, tied_y = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i + 1; j < n; ++j) {
      const double dx = x[j] - x[i], dy = y[j] - y[i];
      if (dx == 0) ++tied_x;
      if (dy == 0) ++tied_y;
      if (dx == 0 || dy == 0) continue;
      if ((dx > 0) == (dy > 0)) ++concordant; else ++discordant;
    }
  }
  const int64_t n0 = n * (n - 1) / 2;
  const double denom = std::sqrt(static_cast<double>(n0 - tied_x) * static_cast<double>(n0 - tied_y));
  if (denom == 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(concordant - discordant) / denom;
}

}  // namespace snap::scoring
