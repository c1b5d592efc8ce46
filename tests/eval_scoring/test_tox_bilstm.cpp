// The C++ toxic-comment-classifier against the package's own Keras scores on 60 sentences
// (tests/fixtures/scoring/tcc_toxic.json from tools/tox_fixtures.py), both weight versions,
// all six labels, to 1e-5. Exits 77 when the converted files are absent (scripts/setup.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "eval/scoring/tox_bilstm.h"
#include "tests/eval_scoring/scoring_test_paths.h"

namespace snap::scoring {
namespace {

class ToxBilstmVersion : public ::testing::TestWithParam<std::string> {};

TEST_P(ToxBilstmVersion, MatchesKerasOnEverySentence) {
  const std::string version = GetParam();
  auto fx = testing::load_fixture("tcc_toxic.json");
  ASSERT_FALSE(fx.is_discarded());
  const auto& sentences = fx["sentences"];
  const auto& want = fx["versions"][version]["scores"];
  ASSERT_GE(sentences.size(), 50u);
  ASSERT_EQ(want.size(), sentences.size());
  auto m = ToxBilstm::load(testing::tcc_path(version));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->package_version(), version);
  double worst = 0;
  int above_half = 0;
  for (size_t i = 0; i < sentences.size(); ++i) {
    auto got = (*m)->classify(sentences[i].get<std::string>());
    for (int l = 0; l < ToxBilstm::k_labels; ++l) {
      const double w = want[i][l].get<double>();
      ASSERT_FALSE(std::isnan(got[l]));
      worst = std::max(worst, std::fabs(got[l] - w));
      EXPECT_NEAR(got[l], w, 1e-5) << "sentence " << i << " label " << (*m)->labels()[l] << ": "
                                   << sentences[i].get<std::string>().substr(0, 60);
    }
    above_half += want[i][0].get<double>() >= 0.5;
  }
  EXPECT_GE(above_half, 5) << "the fixture should hold clearly toxic sentences";
  std::printf("tcc-toxic@%s: max |C++ - Keras| = %.2e over %zu sentences x 6 labels\n", version.c_str(), worst,
              sentences.size());
}

INSTANTIATE_TEST_SUITE_P(Versions, ToxBilstmVersion, ::testing::Values("0.2.2", "0.3.0"));

TEST(ToxBilstm, VersionsDifferAndScorerInfo) {
  ScorerOptions o;
  auto a = make_scorer("tcc-toxic@0.2.2", o);
  auto b = make_scorer("tcc-toxic@0.3.0", o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->info().sha256, (*b)->info().sha256);
  EXPECT_NE((*a)->info().params["source_sha256"], (*b)->info().params["source_sha256"]);
  auto ra = (*a)->score("Thou lump of foul deformity.", "");
  auto rb = (*b)->score("Thou lump of foul deformity.", "");
  EXPECT_NE(ra.value, rb.value);
  EXPECT_EQ(ra.attributes.size(), 6u);
  EXPECT_EQ(ra.value, ra.attributes["toxic"].get<double>());
}

TEST(ToxBilstm, TokenizerPadsAndTruncatesInFront) {
  auto m = ToxBilstm::load(testing::tcc_path("0.3.0"));
  ASSERT_TRUE(m.ok());
  auto ids = (*m)->tokenize("The, THE the!");
  ASSERT_EQ(ids.size(), 100u);
  EXPECT_EQ(ids[99], 1);  // "the" is the most frequent word: id 1
  EXPECT_EQ(ids[98], 1);
  EXPECT_EQ(ids[97], 1);
  EXPECT_EQ(ids[96], 0);
  std::string long_text;
  for (int i = 0; i < 150; ++i) long_text += "the ";
  long_text += "of";
  auto t = (*m)->tokenize(long_text);
  EXPECT_EQ(t[99], 3);  // "of": the last word survives pre-truncation
  EXPECT_EQ(t[0], 1);
}

TEST(ToxBilstm, BadFiles) {
  auto missing = ToxBilstm::load("/nonexistent.bin");
  EXPECT_EQ(missing.status().code(), StatusCode::k_not_found);
  const std::string p = ::testing::TempDir() + "/bad_tox.bin";
  std::FILE* f = std::fopen(p.c_str(), "wb");
  std::fputs("SNAPTOX1\x05\x00\x00\x00{\"a\"", f);
  std::fclose(f);
  auto bad = ToxBilstm::load(p);
  EXPECT_EQ(bad.status().code(), StatusCode::k_data_loss) << bad.status().to_string();
}

}  // namespace
}  // namespace snap::scoring

int main(int argc, char** argv) {
  if (!snap::scoring::testing::have_tcc_files()) {
    std::printf("skipped: %s or the 0.2.2 file missing (scripts/setup.sh converts them)\n",
                snap::scoring::testing::tcc_path("0.3.0").c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
