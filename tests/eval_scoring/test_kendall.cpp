// Kendall tau-b against scipy.stats.kendalltau on cases with and without ties
// (tests/fixtures/scoring/kendall.json, from tools/tox_kendall_fixture.py), and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "eval/scoring/kendall.h"
#include "tests/eval_scoring/scoring_test_paths.h"

namespace snap::scoring {
namespace {

TEST(Kendall, MatchesScipyWithTies) {
  auto fx = testing::load_fixture("kendall.json");
  ASSERT_FALSE(fx.is_discarded());
  ASSERT_GE(fx["cases"].size(), 10u);
  int with_ties = 0;
  for (const auto& c : fx["cases"]) {
    auto x = c["x"].get<std::vector<double>>();
    auto y = c["y"].get<std::vector<double>>();
    auto tau = kendall_tau_b(x, y);
    ASSERT_TRUE(tau.ok()) << c["name"] << ": " << tau.status().to_string();
    if (c["tau_b"].is_null()) {
      EXPECT_TRUE(std::isnan(*tau)) << c["name"] << ": scipy gives nan, we give " << *tau;
    } else {
      EXPECT_NEAR(*tau, c["tau_b"].get<double>(), 1e-12) << c["name"];
    }
    std::sort(x.begin(), x.end());
    with_ties += std::adjacent_find(x.begin(), x.end()) != x.end();
  }
  EXPECT_GE(with_ties, 5) << "the fixture must exercise ties";
}

TEST(Kendall, BadInput) {
  EXPECT_EQ(kendall_tau_b({1, 2}, {1, 2, 3}).status().code(), StatusCode::k_invalid_argument);
  EXPECT_EQ(kendall_tau_b({1}, {1}).status().code(), StatusCode::k_invalid_argument);
  EXPECT_NEAR(kendall_tau_b({1, 2, 3}, {3, 2, 1}).value(), -1.0, 1e-15);
}

}  // namespace
}  // namespace snap::scoring
