// The scorer registry: "ID@VERSION" -> a Scorer. Classifier versions are files in the scorer
// directory (tcc-toxic-<version>.bin, written by tools/tox_convert.py), so a new version is
// a new file and never replaces an old one.
#include "eval/scoring/scorer.h"

#include <cstdlib>
#include <filesystem>

#include "eval/scoring/perspective_client.h"
#include "eval/scoring/profanity.h"
#include "eval/scoring/tox_bilstm.h"

namespace snap::scoring {

Result<std::pair<std::string, std::string>> parse_scorer_spec(const std::string& spec) {
  const auto at = spec.find('@');
  if (at == std::string::npos || at == 0 || at + 1 == spec.size() || spec.find('@', at + 1) != std::string::npos) {
    return invalid_argument("scorer '" + spec + "' is not ID@VERSION (known: " + known_scorers() + ")");
  }
  return std::make_pair(spec.substr(0, at), spec.substr(at + 1));
}

std::string default_scorer_dir() {
  if (const char* d = std::getenv("SNAP_SCORER_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/snapserve/tox";
}

const char* known_scorers() {
  return "exact@1, contains@1, numeric@1, tcc-toxic@0.2.2, tcc-toxic@0.3.0, profanity@1.2.2, profanity@1.5.0, perspective@LABEL";
}

Result<std::unique_ptr<Scorer>> make_scorer(const std::string& spec, const ScorerOptions& options) {
  SNAP_ASSIGN_OR_RETURN(auto parts, parse_scorer_spec(spec));
  const auto& [id, version] = parts;
  if (id == "exact" && version == "1") return make_exact_scorer();
  if (id == "contains" && version == "1") return make_contains_scorer();
  if (id == "numeric" && version == "1") return make_numeric_scorer();
  if (id == "tcc-toxic") {
    const std::string dir = options.model_dir.empty() ? default_scorer_dir() : options.model_dir;
    const std::string path = dir + "/tcc-toxic-" + version + ".bin";
    if (!std::filesystem::exists(path)) {
      return not_found("scorer " + spec + ": no converted weights at " + path +
                       " (scripts/setup.sh converts 0.2.2 and 0.3.0 with tools/tox_convert.py)");
    }
    SNAP_ASSIGN_OR_RETURN(auto s, make_tcc_scorer(path));
    if (s->info().version != version) {
      return data_loss(path + " holds version " + s->info().version + ", not " + version);
    }
    return s;
  }
  if (id == "profanity") {
    const std::string dir = options.model_dir.empty() ? default_scorer_dir() : options.model_dir;
    const std::string path = dir + "/profanity-" + version + ".json";
    if (!std::filesystem::exists(path)) {
      return not_found("scorer " + spec + ": no converted model at " + path +
                       " (scripts/setup.sh converts 1.2.2 and 1.5.0 with tools/tox_profanity_convert.py)");
    }
    SNAP_ASSIGN_OR_RETURN(auto s, make_profanity_scorer(path));
    if (s->info().version != version) return data_loss(path + " holds version " + s->info().version + ", not " + version);
    return s;
  }
  if (id == "perspective") return make_perspective_scorer(version, options);
  return not_found("unknown scorer '" + spec + "' (known: " + known_scorers() + ")");
}

}  // namespace snap::scoring
