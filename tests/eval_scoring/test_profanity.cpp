// The C++ alt-profanity-check against the package's own predict_prob under the scikit-learn
// each release pins (tests/fixtures/scoring/profanity.json from tools/tox_profanity_fixtures.py),
// 60 sentences, versions 1.2.2 and 1.5.0, to 1e-9. Exits 77 without the converted files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "eval/scoring/profanity.h"
#include "tests/eval_scoring/scoring_test_paths.h"

namespace snap::scoring {
namespace {

std::string prof_path(const std::string& v) { return default_scorer_dir() + "/profanity-" + v + ".json"; }

class ProfanityVersion : public ::testing::TestWithParam<std::string> {};

TEST_P(ProfanityVersion, MatchesScikitLearn) {
  const std::string v = GetParam();
  auto fx = testing::load_fixture("profanity.json");
  ASSERT_FALSE(fx.is_discarded());
  ASSERT_TRUE(fx["versions"].contains(v)) << "fixture lacks version " << v;
  const auto& want = fx["versions"][v]["scores"];
  const auto& sentences = fx["sentences"];
  ASSERT_GE(sentences.size(), 50u);
  auto m = Profanity::load(prof_path(v));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  double worst = 0;
  int profane = 0;
  for (size_t i = 0; i < sentences.size(); ++i) {
    const double got = (*m)->probability(sentences[i].get<std::string>());
    ASSERT_FALSE(std::isnan(got));
    worst = std::max(worst, std::fabs(got - want[i].get<double>()));
    EXPECT_NEAR(got, want[i].get<double>(), 1e-9) << "sentence " << i << ": " << sentences[i].get<std::string>().substr(0, 60);
    profane += want[i].get<double>() >= 0.5;
  }
  EXPECT_GE(profane, 3) << "the fixture should hold profane sentences";
  std::printf("profanity@%s: max |C++ - scikit-learn| = %.2e over %zu sentences\n", v.c_str(), worst, sentences.size());
}

INSTANTIATE_TEST_SUITE_P(Versions, ProfanityVersion, ::testing::Values("1.2.2", "1.5.0"));

TEST(Profanity, ScorerAndErrors) {
  ScorerOptions o;
  auto a = make_scorer("profanity@1.2.2", o);
  auto b = make_scorer("profanity@1.5.0", o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->info().sha256, (*b)->info().sha256);
  EXPECT_NE((*a)->info().params["model_sha256"], (*b)->info().params["model_sha256"]);
  auto p = Profanity::load(prof_path("1.5.0")).value();
  EXPECT_TRUE(p->tokenize("a I x").empty()) << "single characters are no tokens";
  EXPECT_EQ(p->tokenize("Damn damn").size(), 2u);
  EXPECT_EQ(Profanity::load("/nonexistent.json").status().code(), StatusCode::k_not_found);
}

}  // namespace
}  // namespace snap::scoring

int main(int argc, char** argv) {
  using snap::scoring::default_scorer_dir;
  for (const char* v : {"1.2.2", "1.5.0"}) {
    if (!std::filesystem::exists(default_scorer_dir() + "/profanity-" + v + ".json")) {
      std::printf("skipped: %s/profanity-%s.json missing (scripts/setup.sh converts it)\n", default_scorer_dir().c_str(), v);
      return 77;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
