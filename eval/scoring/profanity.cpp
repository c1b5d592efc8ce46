// Profanity: JSON reader, the TF-IDF tokenizer and the calibrated SVC ensemble, all in double
// as scikit-learn computes them. Non-ASCII bytes count as word characters (Python's \w
// matches Unicode letters; a non-ASCII punctuation mark would differ) and only ASCII is
// lowercased.
#include "eval/scoring/profanity.h"

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/sha256.h"

namespace snap::scoring {
namespace {

bool word_char(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

class ProfanityScorer : public Scorer {
 public:
  explicit ProfanityScorer(std::unique_ptr<Profanity> m) : m_(std::move(m)) {
    info_.id = "profanity";
    info_.version = m_->package_version();
    info_.sha256 = m_->file_sha256();
    info_.params = {{"threshold", 0.5}, {"package", "alt-profanity-check"}, {"model_sha256", m_->model_sha256()}};
  }
  const ScorerInfo& info() const override { return info_; }
  ScoreResult score(std::string_view text, std::string_view) const override {
    ScoreResult r;
    r.value = m_->probability(text);
    r.attributes = {{"profane", r.value}};
    return r;
  }

 private:
  std::unique_ptr<Profanity> m_;
  ScorerInfo info_;
};

}  // namespace

Result<std::unique_ptr<Profanity>> Profanity::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open (run tools/tox_profanity_convert.py; scripts/setup.sh does)");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto j = nlohmann::json::parse(bytes, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return data_loss(path + ": not JSON");
  auto m = std::make_unique<Profanity>();
  try {
    if (j.at("format") != "snapprof-tfidf-svc-1") return data_loss(path + ": unknown format " + j.at("format").dump());
    m->version_ = j.at("package_version").get<std::string>();
    m->model_sha256_ = j.at("model_sha256").get<std::string>();
    const auto& vocab = j.at("vocab");
    for (size_t i = 0; i < vocab.size(); ++i) m->vocab_.emplace(vocab[i].get<std::string>(), static_cast<int32_t>(i));
    m->idf_ = j.at("idf").get<std::vector<double>>();
    for (const auto& f : j.at("folds")) {
      Fold fold;
      fold.coef = f.at("coef").get<std::vector<double>>();
      fold.intercept = f.at("intercept").get<double>();
      fold.a = f.at("a").get<double>();
      fold.b = f.at("b").get<double>();
      if (fold.coef.size() != vocab.size()) return data_loss(path + ": a fold's coef does not match the vocabulary");
      m->folds_.push_back(std::move(fold));
    }
    if (m->idf_.size() != vocab.size() || m->folds_.empty()) return data_loss(path + ": idf size or folds wrong");
  } catch (const nlohmann::json::exception& e) {
    return data_loss(path + ": field missing or of the wrong type (" + e.what() + ")");
  }
  m->file_sha256_ = sha256_hex(bytes);
  return m;
}

std::vector<int32_t> Profanity::tokenize(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (!word_char(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    std::string w;
    while (j < text.size() && word_char(static_cast<unsigned char>(text[j]))) {
      const char c = text[j++];
      w += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    }
    // >= 2 characters (code points, not bytes).
    size_t chars = 0;
    for (unsigned char c : w) chars += (c & 0xC0) != 0x80;
    if (chars >= 2) {
      auto it = vocab_.find(w);
      if (it != vocab_.end()) ids.push_back(it->second);
    }
    i = j;
  }
  return ids;
}

double Profanity::probability(std::string_view text) const {
  std::map<int32_t, double> tf;  // sparse row, column order
  for (int32_t id : tokenize(text)) tf[id] += 1.0;
  double norm = 0;
  for (auto& [id, v] : tf) {
    v *= idf_[id];
    norm += v * v;
  }
  norm = std::sqrt(norm);
  if (norm > 0) {
    for (auto& [id, v] : tf) v /= norm;
  }
  double p = 0;
  for (const auto& f : folds_) {
    double d = f.intercept;
    for (const auto& [id, v] : tf) d += f.coef[id] * v;
    p += 1.0 / (1.0 + std::exp(f.a * d + f.b));
  }
  return p / static_cast<double>(folds_.size());
}

Result<std::unique_ptr<Scorer>> make_profanity_scorer(const std::string& path) {
  SNAP_ASSIGN_OR_RETURN(auto m, Profanity::load(path));
  return std::unique_ptr<Scorer>(std::make_unique<ProfanityScorer>(std::move(m)));
}

}  // namespace snap::scoring
