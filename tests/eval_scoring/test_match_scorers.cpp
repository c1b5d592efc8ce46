// The match scorers (exact, contains, numeric), the ID@VERSION parser and the registry's
// errors for unknown or missing scorers.
#include <gtest/gtest.h>

#include "eval/scoring/scorer.h"

namespace snap::scoring {
namespace {

double v(const Scorer& s, const char* text, const char* ref) {
  auto r = s.score(text, ref);
  EXPECT_TRUE(r.error.ok()) << r.error.to_string();
  return r.value;
}

TEST(MatchScorers, ExactContainsNumeric) {
  auto exact = make_exact_scorer();
  EXPECT_EQ(v(*exact, "  The Tempest. ", "the tempest"), 1.0);
  EXPECT_EQ(v(*exact, "The Tempest, act one", "the tempest"), 0.0);
  auto contains = make_contains_scorer();
  EXPECT_EQ(v(*contains, "I think the answer is: Prospero!", "prospero"), 1.0);
  EXPECT_EQ(v(*contains, "Caliban", "prospero"), 0.0);
  EXPECT_FALSE(contains->score("x", " !! ").error.ok()) << "an empty reference is an error, not a 0";
  auto numeric = make_numeric_scorer();
  EXPECT_EQ(v(*numeric, "The pass key is 71432.", "71432"), 1.0);
  EXPECT_EQ(v(*numeric, "about 1,234 people", "1234"), 1.0);
  EXPECT_EQ(v(*numeric, "-3.5e2 degrees", "-350"), 1.0);
  EXPECT_EQ(v(*numeric, "it is 7143", "71432"), 0.0);
  EXPECT_EQ(v(*numeric, "no digits here", "5"), 0.0);
  EXPECT_FALSE(numeric->score("5", "five").error.ok());
}

TEST(MatchScorers, InfoNamesVersionAndFingerprint) {
  auto s = make_numeric_scorer(1e-3);
  EXPECT_EQ(s->info().key(), "numeric@1");
  EXPECT_EQ(s->info().sha256.size(), 64u);
  EXPECT_NE(s->info().sha256, make_numeric_scorer(1e-6)->info().sha256) << "parameters are part of the fingerprint";
}

TEST(ScorerRegistry, SpecsAndErrors) {
  ScorerOptions o;
  EXPECT_EQ(make_scorer("exact@1", o).value()->info().key(), "exact@1");
  for (const char* bad : {"exact", "@1", "exact@", "a@b@c"}) {
    auto r = make_scorer(bad, o);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("ID@VERSION"), std::string::npos) << r.status().message();
  }
  auto unknown = make_scorer("exact@2", o);
  EXPECT_EQ(unknown.status().code(), StatusCode::k_not_found);
  o.model_dir = "/nonexistent";
  auto missing = make_scorer("tcc-toxic@0.3.0", o);
  EXPECT_EQ(missing.status().code(), StatusCode::k_not_found);
  EXPECT_NE(missing.status().message().find("/nonexistent/tcc-toxic-0.3.0.bin"), std::string::npos);
}

}  // namespace
}  // namespace snap::scoring
