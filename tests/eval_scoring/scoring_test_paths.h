// Paths shared by the scoring tests: the committed fixtures and the converted classifier
// files that scripts/setup.sh writes into the scorer cache (tests exit 77 without them).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "eval/scoring/scorer.h"

namespace snap::scoring::testing {

inline std::string fixture_path(const std::string& name) {
  return std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/scoring/" + name;
}

inline nlohmann::json load_fixture(const std::string& name) {
  std::ifstream in(fixture_path(name));
  return nlohmann::json::parse(in, nullptr, false);
}

inline std::string tcc_path(const std::string& version) {
  return default_scorer_dir() + "/tcc-toxic-" + version + ".bin";
}

inline bool have_tcc_files() {
  return std::filesystem::exists(tcc_path("0.2.2")) && std::filesystem::exists(tcc_path("0.3.0"));
}

}  // namespace snap::scoring::testing
