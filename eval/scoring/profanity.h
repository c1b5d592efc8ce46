// alt-profanity-check (PyPI, MIT) in C++: scikit-learn's TfidfVectorizer (lowercase, tokens
// = maximal runs of >= 2 word characters, counts x idf, l2 norm) and a CalibratedClassifierCV
// of LinearSVCs (per fold: f = coef . x + intercept, p = 1 / (1 + exp(a f + b)); the
// probability is the mean over folds). Weights from tools/tox_profanity_convert.py.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "eval/scoring/scorer.h"

namespace snap::scoring {

class Profanity {
 public:
  static Result<std::unique_ptr<Profanity>> load(const std::string& path);
  // Column index of each token of the text that is in the vocabulary, in text order.
  std::vector<int32_t> tokenize(std::string_view text) const;
  double probability(std::string_view text) const;  // P(profane)
  const std::string& package_version() const { return version_; }
  const std::string& file_sha256() const { return file_sha256_; }
  const std::string& model_sha256() const { return model_sha256_; }

 private:
  struct Fold {
    std::vector<double> coef;  // [vocab]
    double intercept = 0, a = 0, b = 0;
  };
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<double> idf_;  // [vocab]
  std::vector<Fold> folds_;
  std::string version_, file_sha256_, model_sha256_;
};

// "profanity@<package version>": value = P(profane).
Result<std::unique_ptr<Scorer>> make_profanity_scorer(const std::string& path);

}  // namespace snap::scoring
