// Scorers as versioned components: every score names the scorer that made it (id, version,
// sha256 of its weights/config, parameters), so scores from different versions are never
// mixed silently. A scorer maps a text (and, for reference-based tasks, an expected answer)
// to a value in its own range, or to an error — an error is never a score of 0.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace snap::scoring {

struct ScorerInfo {
  std::string id;          // "tcc-toxic", "exact", "perspective"
  std::string version;     // "0.3.0"; a new version whenever weights or semantics change
  std::string sha256;      // of the weights file / configuration the scores depend on
  nlohmann::json params;   // threshold, attribute, normalization, ...
  std::string key() const { return id + "@" + version; }
  double threshold() const { return params.value("threshold", 0.5); }
};

struct ScoreResult {
  double value = 0.0;          // meaningful only when error.ok()
  nlohmann::json attributes;   // every label the scorer produced (object), may be null
  std::string raw;             // the raw response of a remote scorer ("" for local ones)
  Status error;                // not ok: no score was made
};

class Scorer {
 public:
  virtual ~Scorer() = default;
  virtual const ScorerInfo& info() const = 0;
  // `reference` is the expected answer for match scorers and ignored by classifiers.
  virtual ScoreResult score(std::string_view text, std::string_view reference) const = 0;
};

// "ID@VERSION" -> (id, version); invalid_argument naming the spec when malformed.
Result<std::pair<std::string, std::string>> parse_scorer_spec(const std::string& spec);

// Match scorers for long-context tasks (value 1 or 0). Texts are normalized first:
// lowercased, ASCII punctuation removed, whitespace collapsed and trimmed.
std::unique_ptr<Scorer> make_exact_scorer();
std::unique_ptr<Scorer> make_contains_scorer();
// The first number in the text equals the reference number within |a-b| <= tol * max(1,|b|).
std::unique_ptr<Scorer> make_numeric_scorer(double rel_tol = 1e-6);
std::string normalize_answer(std::string_view s);

struct ScorerOptions {
  std::string model_dir;         // converted classifier files; default $SNAP_SCORER_DIR or ~/.cache/snapserve/tox
  // perspective@LABEL: LABEL is the user's name for the API's (unpublished) model at the
  // time of use, e.g. perspective@2026-12-01.
  std::string perspective_url;        // analyze URL; default $PERSPECTIVE_API_URL or Google's endpoint
  std::string perspective_key;        // default $PERSPECTIVE_API_KEY (required for Google's endpoint)
  std::string perspective_attribute = "TOXICITY";
  double perspective_qps = 1.0;       // the API's default quota; <= 0: no client-side limit
  int perspective_retries = 4;        // on 429, 5xx and network errors
  double perspective_backoff = 1.0;   // seconds before the first retry, doubled each time
  double perspective_timeout = 30;    // seconds per request
};
std::string default_scorer_dir();

// Every scorer by "ID@VERSION": exact@1, contains@1, numeric@1, tcc-toxic@0.2.2,
// tcc-toxic@0.3.0, profanity@1.2.2, profanity@1.5.0, perspective@LABEL. not_found names the spec and lists the known ones.
Result<std::unique_ptr<Scorer>> make_scorer(const std::string& spec, const ScorerOptions& options);
const char* known_scorers();

}  // namespace snap::scoring
