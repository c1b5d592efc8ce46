// Kendall's tau-b between two orderings (the statistic scipy.stats.kendalltau computes by
// default): (concordant - discordant) / sqrt((n0 - ties_x) (n0 - ties_y)), where a pair tied
// in x or in y is neither concordant nor discordant. Used to say how much a ranking of
// systems changes when the scorer changes.
#pragma once

#include <vector>

#include "common/status.h"

namespace snap::scoring {

// invalid_argument when the lengths differ or n < 2; NaN when every value of x or of y is
// tied (scipy returns nan there too).
Result<double> kendall_tau_b(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace snap::scoring
