// The provenance store: one SQLite file (the path is a flag) with three tables.
//   runs        one system evaluated on one prompt set: model sha256, KV policy, sampling,
//               k, snapserve commit, prompt set sha256; identified by its name
//   generations prompt index, choice, seed, prompt, text, token counts; UNIQUE per run
//   scores      scorer id, version, sha256, params, value or error, attributes, raw, time
// Scores are append-only (SQLite triggers refuse UPDATE and DELETE), so rescoring adds rows
// and the history of every scorer version stays. A prompt's generations (and their first
// scores) are written in one transaction: a killed run leaves whole prompts only, and a
// resumed run skips those, so no row is lost or duplicated.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "eval/scoring/scorer.h"

struct sqlite3;

namespace snap::scoring {

struct RunRecord {
  int64_t id = 0;
  std::string name;               // the system: "smollm2/snapkv-64"
  nlohmann::json config;          // model_sha256, model, policy, sampling, k, max_tokens, prompts_sha256, ...
  std::string snapserve_commit;
  std::string created_at;         // UTC, ISO 8601
};

struct GenerationRecord {
  int64_t id = 0;
  int64_t run_id = 0;
  int64_t prompt_index = 0;
  int choice = 0;
  uint64_t seed = 0;
  std::string prompt;
  std::string text;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::string finish_reason;
};

struct ScoreRecord {
  int64_t id = 0;
  int64_t generation_id = 0;
  ScorerInfo scorer;
  std::optional<double> value;  // empty when the scorer failed
  nlohmann::json attributes;
  std::string raw;
  std::string error;            // "" when value is set
  std::string created_at;
};

class Store {
 public:
  // Opens or creates the file and its tables; io/data errors name the path.
  static Result<std::unique_ptr<Store>> open(const std::string& path);
  ~Store();

  // The run named `name`: created when new; when it exists its config must be identical
  // (resume), else invalid_argument naming the first differing field.
  Result<RunRecord> open_run(const std::string& name, const nlohmann::json& config, const std::string& commit);
  Result<std::vector<RunRecord>> runs() const;
  Result<RunRecord> run_by_name(const std::string& name) const;

  // Prompt indices of `run_id` that already have all `k` generations.
  Result<std::set<int64_t>> complete_prompts(int64_t run_id, int k) const;
  // One prompt's generations and their scores, atomically. Fails (and writes nothing) on a
  // duplicate (run, prompt, choice).
  Status add_prompt(std::vector<GenerationRecord>& generations, const std::vector<ScoreRecord>& scores);
  Result<std::vector<GenerationRecord>> generations(int64_t run_id) const;

  Status add_scores(const std::vector<ScoreRecord>& scores);  // one transaction
  // Every score row of a run's generations, oldest first.
  Result<std::vector<ScoreRecord>> scores(int64_t run_id) const;

  Status export_jsonl(std::ostream& out) const;  // one line per score row, joined with its generation and run
  Status export_csv(std::ostream& out) const;

  sqlite3* handle() { return db_; }  // for tests that check the triggers

 private:
  Store() = default;
  Status exec(const std::string& sql) const;
  Status insert_generation(GenerationRecord& g);
  Status insert_score(const ScoreRecord& s);
  sqlite3* db_ = nullptr;
  std::string path_;
};

std::string utc_now_iso();

}  // namespace snap::scoring
