// The match scorers of the long-context tasks: exact, contains, numeric. Version 1 of each;
// the normalization below is part of the version (changing it means a new version).
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "common/sha256.h"
#include "eval/scoring/scorer.h"

namespace snap::scoring {
namespace {

ScorerInfo match_info(const std::string& id, nlohmann::json params) {
  ScorerInfo info;
  info.id = id;
  info.version = "1";
  params["normalize"] = "lowercase, ASCII punctuation removed, whitespace collapsed";
  info.params = params;
  // No weights: the fingerprint is of the definition (id, version, parameters).
  info.sha256 = sha256_hex(id + "@1 " + params.dump());
  return info;
}

class ExactScorer : public Scorer {
 public:
  ExactScorer() : info_(match_info("exact", {{"threshold", 0.5}})) {}
  const ScorerInfo& info() const override { return info_; }
  ScoreResult score(std::string_view text, std::string_view reference) const override {
    ScoreResult r;
    r.value = normalize_answer(text) == normalize_answer(reference) ? 1.0 : 0.0;
    return r;
  }

 private:
  ScorerInfo info_;
};

class ContainsScorer : public Scorer {
 public:
  ContainsScorer() : info_(match_info("contains", {{"threshold", 0.5}})) {}
  const ScorerInfo& info() const override { return info_; }
  ScoreResult score(std::string_view text, std::string_view reference) const override {
    ScoreResult r;
    std::string ref = normalize_answer(reference);
    if (ref.empty()) {
      r.error = invalid_argument("contains: the reference answer is empty after normalization");
      return r;
    }
    r.value = normalize_answer(text).find(ref) != std::string::npos ? 1.0 : 0.0;
    return r;
  }

 private:
  ScorerInfo info_;
};

// The first decimal number in s ("-12", "3.5", "1e3", "1,234" with thousands commas).
bool first_number(std::string_view s, double* out) {
  for (size_t i = 0; i < s.size(); ++i) {
    bool sign = (s[i] == '-' || s[i] == '+') && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]));
    if (!sign && !std::isdigit(static_cast<unsigned char>(s[i]))) continue;
    std::string num;
    size_t j = i;
    if (sign) num += s[j++];
    auto digit = [&](size_t k) { return k < s.size() && std::isdigit(static_cast<unsigned char>(s[k])); };
    // Thousands separators: a comma followed by exactly three digits.
    while (digit(j) || (s[j] == ',' && j + 3 < s.size() + 1 && digit(j + 1) && digit(j + 2) && digit(j + 3) && !digit(j + 4))) {
      if (s[j] != ',') num += s[j];
      ++j;
    }
    if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
      num += s[j++];
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) num += s[j++];
    }
    if (j + 1 < s.size() && (s[j] == 'e' || s[j] == 'E') &&
        (std::isdigit(static_cast<unsigned char>(s[j + 1])) ||
         ((s[j + 1] == '-' || s[j + 1] == '+') && j + 2 < s.size() && std::isdigit(static_cast<unsigned char>(s[j + 2]))))) {
      num += s[j++];
      if (s[j] == '-' || s[j] == '+') num += s[j++];
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) num += s[j++];
    }
    *out = std::strtod(num.c_str(), nullptr);
    return true;
  }
  return false;
}

class NumericScorer : public Scorer {
 public:
  explicit NumericScorer(double tol) : tol_(tol), info_(match_info("numeric", {{"threshold", 0.5}, {"rel_tol", tol}})) {}
  const ScorerInfo& info() const override { return info_; }
  ScoreResult score(std::string_view text, std::string_view reference) const override {
    ScoreResult r;
    double want = 0, got = 0;
    if (!first_number(reference, &want)) {
      r.error = invalid_argument("numeric: the reference '" + std::string(reference.substr(0, 60)) + "' holds no number");
      return r;
    }
    r.value = first_number(text, &got) && std::fabs(got - want) <= tol_ * std::max(1.0, std::fabs(want)) ? 1.0 : 0.0;
    return r;
  }

 private:
  double tol_;
  ScorerInfo info_;
};

}  // namespace

std::string normalize_answer(std::string_view s) {
  std::string out;
  bool space = false;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (std::isspace(c)) {
      space = !out.empty();
      continue;
    }
    if (c < 128 && std::ispunct(c)) continue;
    if (space) out += ' ';
    space = false;
    out += static_cast<char>(std::tolower(c));
  }
  return out;
}

std::unique_ptr<Scorer> make_exact_scorer() { return std::make_unique<ExactScorer>(); }
std::unique_ptr<Scorer> make_contains_scorer() { return std::make_unique<ContainsScorer>(); }
std::unique_ptr<Scorer> make_numeric_scorer(double rel_tol) { return std::make_unique<NumericScorer>(rel_tol); }

}  // namespace snap::scoring
