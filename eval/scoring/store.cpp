// Store on SQLite: schema, prepared statements, transactions, exports. WAL journal so a
// reader (export, compare) can run beside a writer; busy timeout 10 s.
#include "eval/scoring/store.h"

#include <sqlite3.h>

#include <ctime>
#include <sstream>

namespace snap::scoring {
namespace {

const char* k_schema = R"sql(
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  config TEXT NOT NULL,
  snapserve_commit TEXT NOT NULL,
  created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS generations (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id),
  prompt_index INTEGER NOT NULL,
  choice INTEGER NOT NULL,
  seed INTEGER NOT NULL,
  prompt TEXT NOT NULL,
  text TEXT NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  completion_tokens INTEGER NOT NULL,
  finish_reason TEXT NOT NULL,
  UNIQUE (run_id, prompt_index, choice));
CREATE TABLE IF NOT EXISTS scores (
  id INTEGER PRIMARY KEY,
  generation_id INTEGER NOT NULL REFERENCES generations(id),
  scorer_id TEXT NOT NULL,
  scorer_version TEXT NOT NULL,
  scorer_sha256 TEXT NOT NULL,
  scorer_params TEXT NOT NULL,
  value REAL,
  attributes TEXT,
  raw TEXT,
  error TEXT,
  created_at TEXT NOT NULL,
  CHECK ((value IS NULL) <> (error IS NULL)));
CREATE INDEX IF NOT EXISTS scores_by_generation ON scores(generation_id);
CREATE TRIGGER IF NOT EXISTS scores_no_update BEFORE UPDATE ON scores
  BEGIN SELECT RAISE(ABORT, 'scores are append-only'); END;
CREATE TRIGGER IF NOT EXISTS scores_no_delete BEFORE DELETE ON scores
  BEGIN SELECT RAISE(ABORT, 'scores are append-only'); END;
)sql";

class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  std::string error() const { return sqlite3_errmsg(db_); }
  Stmt& bind(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); return *this; }
  Stmt& bind(int i, const std::string& v) { sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT); return *this; }
  Stmt& bind_null(int i) { sqlite3_bind_null(s_, i); return *this; }
  Stmt& bind(int i, double v) { sqlite3_bind_double(s_, i, v); return *this; }
  int step() { return sqlite3_step(s_); }
  int64_t i64(int c) const { return sqlite3_column_int64(s_, c); }
  double f64(int c) const { return sqlite3_column_double(s_, c); }
  bool null(int c) const { return sqlite3_column_type(s_, c) == SQLITE_NULL; }
  std::string str(int c) const {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, c));
    return p ? std::string(p, sqlite3_column_bytes(s_, c)) : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

nlohmann::json parse_or_null(const std::string& s) {
  if (s.empty()) return nullptr;
  auto j = nlohmann::json::parse(s, nullptr, false);
  return j.is_discarded() ? nlohmann::json(s) : j;
}

RunRecord read_run(const Stmt& q) {
  RunRecord r;
  r.id = q.i64(0);
  r.name = q.str(1);
  r.config = parse_or_null(q.str(2));
  r.snapserve_commit = q.str(3);
  r.created_at = q.str(4);
  return r;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

}  // namespace

std::string utc_now_iso() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Store::~Store() {
  if (db_) sqlite3_close(db_);
}

Status Store::exec(const std::string& sql) const {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return internal_error(path_ + ": " + m);
  }
  return Status();
}

Result<std::unique_ptr<Store>> Store::open(const std::string& path) {
  auto s = std::unique_ptr<Store>(new Store());
  s->path_ = path;
  if (sqlite3_open_v2(path.c_str(), &s->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    return not_found(path + ": cannot open the store: " + (s->db_ ? sqlite3_errmsg(s->db_) : "out of memory"));
  }
  sqlite3_busy_timeout(s->db_, 10000);
  if (auto st = s->exec("PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON;"); !st.ok()) {
    return data_loss(path + ": not an SQLite database or unreadable (" + st.message() + ")");
  }
  SNAP_RETURN_IF_ERROR(s->exec(k_schema));
  return s;
}

Result<RunRecord> Store::open_run(const std::string& name, const nlohmann::json& config, const std::string& commit) {
  auto existing = run_by_name(name);
  if (existing.ok()) {
    const auto& have = existing->config;
    for (auto it = config.begin(); it != config.end(); ++it) {
      if (!have.contains(it.key()) || have[it.key()] != it.value()) {
        return invalid_argument("run '" + name + "' exists in " + path_ + " with " + it.key() + " = " +
                                (have.contains(it.key()) ? have[it.key()].dump() : "(none)") + ", not " + it.value().dump() +
                                ": use another --name or the same settings to resume");
      }
    }
    return existing;
  }
  if (existing.status().code() != StatusCode::k_not_found) return existing.status();
  Stmt q(db_, "INSERT INTO runs(name, config, snapserve_commit, created_at) VALUES (?,?,?,?)");
  if (!q.ok()) return internal_error(path_ + ": " + q.error());
  q.bind(1, name).bind(2, config.dump()).bind(3, commit).bind(4, utc_now_iso());
  if (q.step() != SQLITE_DONE) return internal_error(path_ + ": cannot add run '" + name + "': " + q.error());
  return run_by_name(name);
}

Result<RunRecord> Store::run_by_name(const std::string& name) const {
  Stmt q(db_, "SELECT id, name, config, snapserve_commit, created_at FROM runs WHERE name = ?");
  if (!q.ok()) return internal_error(path_ + ": " + q.error());
  q.bind(1, name);
  if (q.step() != SQLITE_ROW) return not_found("no run named '" + name + "' in " + path_);
  return read_run(q);
}

Result<std::vector<RunRecord>> Store::runs() const {
  Stmt q(db_, "SELECT id, name, config, snapserve_commit, created_at FROM runs ORDER BY id");
  if (!q.ok()) return internal_error(path_ + ": " + q.error());
  std::vector<RunRecord> out;
  while (q.step() == SQLITE_ROW) out.push_back(read_run(q));
  return out;
}

Result<std::set<int64_t>> Store::complete_prompts(int64_t run_id, int k) const {
  Stmt q(db_, "SELECT prompt_index FROM generations WHERE run_id = ? GROUP BY prompt_index HAVING COUNT(*) >= ?");
  if (!q.ok()) return internal_error(path_ + ": " + q.error());
  q.bind(1, run_id).bind(2, static_cast<int64_t>(k));
  std::set<int64_t> out;
  while (q.step() == SQLITE_ROW) out.insert(q.i64(0));
  return out;
}

Status Store::insert_generation(GenerationRecord& g) {
  Stmt q(db_, "INSERT INTO generations(run_id, prompt_index, choice, seed, prompt, text, prompt_tokens, "
              "completion_tokens, finish_reason) VALUES (?,?,?,?,?,?,?,?,?)");
  if (!q.ok()) return internal_error(path_ + ": " + q.error());
  q.bind(1, g.run_id).bind(2, g.prompt_index).bind(3, static_cast<int64_t>(g.choice)).bind(4, static_cast<int64_t>(g.seed));
  q.bind(5, g.prompt).bind(6, g.text).bind(7, g.prompt_tokens).bind(8, g.completion_tokens).bind(9, g.finish_reason);
  if (q.step() != SQLITE_DONE) {
    return invalid_argument(path_ + ": generation (run " + std::to_string(g.run_id) + ", prompt " + std::to_string(g.prompt_index) +
                            ", choice " + std::to_string(g.choice) + ") not added: " + q.error());
  }
  g.id = sqlite3_last_insert_rowid(db_);
  return Status();
}

Status Store::insert_score(const ScoreRecord& s) {
  Stmt q(db_, "INSERT INTO scores(generation_id, scorer_id, scorer_version, scorer_sha256, scorer_params, value, "
              "attributes, raw, error, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)");
  if (!q.ok()) return internal_error(path_ + ": " + q.error());
  q.bind(1, s.generation_id).bind(2, s.scorer.id).bind(3, s.scorer.version).bind(4, s.scorer.sha256).bind(5, s.scorer.params.dump());
  if (s.value) q.bind(6, *s.value); else q.bind_null(6);
  if (s.attributes.is_null()) q.bind_null(7); else q.bind(7, s.attributes.dump());
  q.bind(8, s.raw);
  if (s.value) q.bind_null(9); else q.bind(9, s.error.empty() ? std::string("unknown error") : s.error);
  q.bind(10, s.created_at.empty() ? utc_now_iso() : s.created_at);
  if (q.step() != SQLITE_DONE) return internal_error(path_ + ": score not added: " + q.error());
  return Status();
}

Status Store::add_prompt(std::vector<GenerationRecord>& generations, const std::vector<ScoreRecord>& scores) {
  SNAP_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
  auto fail = [&](Status st) {
    (void)exec("ROLLBACK");
    return st;
  };
  for (auto& g : generations) {
    if (auto st = insert_generation(g); !st.ok()) return fail(st);
  }
  // scores[i] belongs to generations[i % generations.size()] when their generation_id is 0.
  for (size_t i = 0; i < scores.size(); ++i) {
    ScoreRecord s = scores[i];
    if (s.generation_id == 0 && !generations.empty()) s.generation_id = generations[i % generations.size()].id;
    if (auto st = insert_score(s); !st.ok()) return fail(st);
  }
  return exec("COMMIT");
}

Status Store::add_scores(const std::vector<ScoreRecord>& scores) {
  SNAP_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
  for (const auto& s : scores) {
    if (auto st = insert_score(s); !st.ok()) {
      (void)exec("ROLLBACK");
      return st;
    }
  }
  return exec("COMMIT");
}

Result<std::vector<GenerationRecord>> Store::generations(int64_t run_id) const {
  Stmt q(db_, "SELECT id, run_id, prompt_index, choice, seed, prompt, text, prompt_tokens, completion_tokens, finish_reason "
              "FROM generations WHERE run_id = ? ORDER BY prompt_index, choice");
  if (!q.ok()) return internal_error(path_ + ": " + q.error());
  q.bind(1, run_id);
  std::vector<GenerationRecord> out;
  while (q.step() == SQLITE_ROW) {
    GenerationRecord g;
    g.id = q.i64(0);
    g.run_id = q.i64(1);
    g.prompt_index = q.i64(2);
    g.choice = static_cast<int>(q.i64(3));
    g.seed = static_cast<uint64_t>(q.i64(4));
    g.prompt = q.str(5);
    g.text = q.str(6);
    g.prompt_tokens = q.i64(7);
    g.completion_tokens = q.i64(8);
    g.finish_reason = q.str(9);
    out.push_back(std::move(g));
  }
  return out;
}

Result<std::vector<ScoreRecord>> Store::scores(int64_t run_id) const {
  Stmt q(db_, "SELECT s.id, s.generation_id, s.scorer_id, s.scorer_version, s.scorer_sha256, s.scorer_params, s.value, "
              "s.attributes, s.raw, s.error, s.created_at FROM scores s JOIN generations g ON g.id = s.generation_id "
              "WHERE g.run_id = ? ORDER BY s.id");
  if (!q.ok()) return internal_error(path_ + ": " + q.error());
  q.bind(1, run_id);
  std::vector<ScoreRecord> out;
  while (q.step() == SQLITE_ROW) {
    ScoreRecord s;
    s.id = q.i64(0);
    s.generation_id = q.i64(1);
    s.scorer.id = q.str(2);
    s.scorer.version = q.str(3);
    s.scorer.sha256 = q.str(4);
    s.scorer.params = parse_or_null(q.str(5));
    if (!q.null(6)) s.value = q.f64(6);
    s.attributes = parse_or_null(q.str(7));
    s.raw = q.str(8);
    s.error = q.str(9);
    s.created_at = q.str(10);
    out.push_back(std::move(s));
  }
  return out;
}

Status Store::export_jsonl(std::ostream& out) const {
  SNAP_ASSIGN_OR_RETURN(auto all_runs, runs());
  for (const auto& r : all_runs) {
    SNAP_ASSIGN_OR_RETURN(auto gens, generations(r.id));
    std::map<int64_t, const GenerationRecord*> by_id;
    for (const auto& g : gens) by_id[g.id] = &g;
    SNAP_ASSIGN_OR_RETURN(auto sc, scores(r.id));
    for (const auto& s : sc) {
      const GenerationRecord& g = *by_id.at(s.generation_id);
      nlohmann::json j = {{"run", r.name}, {"run_config", r.config}, {"snapserve_commit", r.snapserve_commit},
                          {"prompt_index", g.prompt_index}, {"choice", g.choice}, {"seed", g.seed},
                          {"prompt", g.prompt}, {"text", g.text}, {"prompt_tokens", g.prompt_tokens},
                          {"completion_tokens", g.completion_tokens}, {"finish_reason", g.finish_reason},
                          {"score_id", s.id}, {"scorer", s.scorer.key()}, {"scorer_sha256", s.scorer.sha256},
                          {"scorer_params", s.scorer.params}, {"value", s.value ? nlohmann::json(*s.value) : nlohmann::json()},
                          {"attributes", s.attributes}, {"error", s.error.empty() ? nlohmann::json() : nlohmann::json(s.error)},
                          {"raw", s.raw}, {"scored_at", s.created_at}};
      out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
  }
  return out ? Status() : internal_error("export: write failed");
}

Status Store::export_csv(std::ostream& out) const {
  out << "run,prompt_index,choice,seed,completion_tokens,finish_reason,scorer,scorer_sha256,value,error,scored_at,text\n";
  SNAP_ASSIGN_OR_RETURN(auto all_runs, runs());
  for (const auto& r : all_runs) {
    SNAP_ASSIGN_OR_RETURN(auto gens, generations(r.id));
    std::map<int64_t, const GenerationRecord*> by_id;
    for (const auto& g : gens) by_id[g.id] = &g;
    SNAP_ASSIGN_OR_RETURN(auto sc, scores(r.id));
    for (const auto& s : sc) {
      const GenerationRecord& g = *by_id.at(s.generation_id);
      std::ostringstream v;
      if (s.value) v.precision(9), v << *s.value;
      out << csv_field(r.name) << ',' << g.prompt_index << ',' << g.choice << ',' << g.seed << ',' << g.completion_tokens << ','
          << g.finish_reason << ',' << csv_field(s.scorer.key()) << ',' << s.scorer.sha256 << ',' << v.str() << ','
          << csv_field(s.error) << ',' << s.created_at << ',' << csv_field(g.text) << '\n';
    }
  }
  return out ? Status() : internal_error("export: write failed");
}

}  // namespace snap::scoring
