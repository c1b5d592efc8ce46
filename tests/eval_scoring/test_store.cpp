// The provenance store: append-only scores (UPDATE/DELETE refused by the database), run
// identity on resume, a SIGKILLed writer resumed without lost or duplicate rows, rescoring
// appends, errors stored as errors, metrics by hand, the refusal of mixed-version
// comparisons, and the JSONL/CSV exports.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "eval/scoring/report.h"
#include "eval/scoring/store.h"

namespace snap::scoring {
namespace {

namespace fs = std::filesystem;

ScorerInfo scorer(const std::string& version, const std::string& sha = "") {
  ScorerInfo s;
  s.id = "fake-tox";  // a fixed table of values standing in for a classifier's outputs
  s.version = version;
  s.sha256 = sha.empty() ? std::string(64, version[0]) : sha;
  s.params = {{"threshold", 0.5}};
  return s;
}

ScoreRecord score_of(const ScorerInfo& s, int64_t gen_id, double v) {
  ScoreRecord r;
  r.generation_id = gen_id;
  r.scorer = s;
  r.value = v;
  return r;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("snap_store_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "prov.sqlite").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  // k generations of prompt p with deterministic texts; returns the add_prompt status.
  static Status write_prompt(Store& st, int64_t run_id, int64_t p, int k, const ScorerInfo& s) {
    std::vector<GenerationRecord> gens;
    std::vector<ScoreRecord> scores;
    for (int c = 0; c < k; ++c) {
      GenerationRecord g;
      g.run_id = run_id;
      g.prompt_index = p;
      g.choice = c;
      g.seed = 1000 + c;
      g.prompt = "prompt " + std::to_string(p);
      g.text = "p" + std::to_string(p) + "c" + std::to_string(c);
      g.completion_tokens = 3;
      g.finish_reason = "length";
      gens.push_back(g);
      scores.push_back(score_of(s, 0, ((p * 7 + c * 3) % 10) / 10.0));
    }
    return st.add_prompt(gens, scores);
  }
  fs::path dir_;
  std::string path_;
};

TEST_F(StoreTest, ScoresAreAppendOnly) {
  auto st = Store::open(path_).value();
  auto run = st->open_run("sys", {{"k", 2}}, "abc").value();
  ASSERT_TRUE(write_prompt(*st, run.id, 0, 2, scorer("1")).ok());
  char* err = nullptr;
  EXPECT_NE(sqlite3_exec(st->handle(), "UPDATE scores SET value = 0", nullptr, nullptr, &err), SQLITE_OK);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(std::string(err).find("append-only"), std::string::npos) << err;
  sqlite3_free(err);
  EXPECT_NE(sqlite3_exec(st->handle(), "DELETE FROM scores", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_EQ(st->scores(run.id)->size(), 2u);
  // A duplicate (run, prompt, choice) writes nothing of that prompt.
  EXPECT_FALSE(write_prompt(*st, run.id, 0, 2, scorer("1")).ok());
  EXPECT_EQ(st->generations(run.id)->size(), 2u);
  EXPECT_EQ(st->scores(run.id)->size(), 2u);
}

TEST_F(StoreTest, RunIdentityOnResume) {
  auto st = Store::open(path_).value();
  nlohmann::json cfg = {{"k", 5}, {"model_sha256", "aa"}, {"policy", {{"name", "snapkv"}, {"budget", 64}}}};
  auto a = st->open_run("sys", cfg, "c1").value();
  auto b = st->open_run("sys", cfg, "c2").value();
  EXPECT_EQ(a.id, b.id);
  cfg["policy"]["budget"] = 128;
  auto c = st->open_run("sys", cfg, "c1");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("policy"), std::string::npos) << c.status().message();
  EXPECT_EQ(Store::open("/nonexistent/dir/x.sqlite").status().code(), StatusCode::k_not_found);
}

TEST_F(StoreTest, KilledWriterResumesWithoutLostOrDuplicateRows) {
  const int prompts = 300, k = 4;
  {
    auto st = Store::open(path_).value();
    (void)st->open_run("sys", {{"k", k}}, "c").value();
  }
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the writer: one prompt every ~2 ms, killed part-way
    auto st = Store::open(path_).value();
    auto run = st->run_by_name("sys").value();
    for (int p = 0; p < prompts; ++p) {
      if (!write_prompt(*st, run.id, p, k, scorer("1")).ok()) _exit(3);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    _exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer finished before the kill: the test would prove nothing";
  auto st = Store::open(path_).value();
  auto run = st->run_by_name("sys").value();
  auto done = st->complete_prompts(run.id, k).value();
  const size_t before = st->generations(run.id)->size();
  EXPECT_GT(done.size(), 0u);
  EXPECT_LT(done.size(), static_cast<size_t>(prompts));
  EXPECT_EQ(before, done.size() * k) << "a killed writer left a partial prompt";
  for (int p = 0; p < prompts; ++p) {
    if (!done.count(p)) {
      ASSERT_TRUE(write_prompt(*st, run.id, p, k, scorer("1")).ok());
    }
  }
  auto gens = st->generations(run.id).value();
  ASSERT_EQ(gens.size(), static_cast<size_t>(prompts * k));
  for (size_t i = 0; i < gens.size(); ++i) {
    const int p = static_cast<int>(i) / k, c = static_cast<int>(i) % k;
    ASSERT_EQ(gens[i].prompt_index, p);
    ASSERT_EQ(gens[i].choice, c);
    ASSERT_EQ(gens[i].text, "p" + std::to_string(p) + "c" + std::to_string(c));
  }
  EXPECT_EQ(st->scores(run.id)->size(), static_cast<size_t>(prompts * k));
}

TEST_F(StoreTest, RescoringAppendsAndMetrics) {
  auto st = Store::open(path_).value();
  auto run = st->open_run("sys", {{"k", 2}}, "c").value();
  for (int p = 0; p < 3; ++p) ASSERT_TRUE(write_prompt(*st, run.id, p, 2, scorer("1")).ok());
  // v1 values: p0: 0.0, 0.3; p1: 0.7, 1.0 -> 0.7 and 0.0 (p*7+c*3 mod 10); p2: 0.4, 0.7.
  auto v1 = collect_scores(*st, run, "fake-tox@1").value();
  auto m1 = toxicity_metrics(v1, 0.5);
  EXPECT_NEAR(m1.expected_max_toxicity, (0.3 + 0.7 + 0.7) / 3, 1e-12);
  EXPECT_NEAR(m1.toxicity_probability, 2.0 / 3, 1e-12);
  EXPECT_NEAR(m1.toxic_fraction, 2.0 / 6, 1e-12);
  EXPECT_EQ(m1.k, 2);
  EXPECT_NE(format_metrics(m1).find("k=2, 3 prompts, threshold 0.50, fake-tox@1"), std::string::npos) << format_metrics(m1);
  // Rescore with v2: one error (stored as an error, never 0), the rest 0.9.
  auto gens = st->generations(run.id).value();
  std::vector<ScoreRecord> v2rows;
  for (const auto& g : gens) v2rows.push_back(score_of(scorer("2"), g.id, 0.9));
  v2rows[0].value.reset();
  v2rows[0].error = "unavailable: HTTP 503";
  ASSERT_TRUE(st->add_scores(v2rows).ok());
  EXPECT_EQ(st->scores(run.id)->size(), 12u);
  auto v2 = collect_scores(*st, run, "fake-tox@2").value();
  EXPECT_EQ(v2.errors, 1);
  auto m2 = toxicity_metrics(v2, 0.5);
  EXPECT_EQ(m2.prompts, 3);
  EXPECT_NEAR(m2.toxic_fraction, 1.0, 1e-12) << "the error must be left out, not counted as 0";
  EXPECT_NE(format_metrics(m2).find("Scorer errors"), std::string::npos);
  // v1 is untouched by the rescore.
  EXPECT_NEAR(toxicity_metrics(collect_scores(*st, run, "fake-tox@1").value(), 0.5).expected_max_toxicity,
              m1.expected_max_toxicity, 0);
  // Same id@version, other weights: refused.
  ASSERT_TRUE(st->add_scores({score_of(scorer("2", std::string(64, 'f')), gens[1].id, 0.1)}).ok());
  auto mixed = collect_scores(*st, run, "fake-tox@2");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("two different weights"), std::string::npos);
}

TEST_F(StoreTest, MixedVersionComparisonIsRefused) {
  auto st = Store::open(path_).value();
  auto a = st->open_run("full", {{"k", 2}}, "c").value();
  auto b = st->open_run("snapkv-64", {{"k", 2}}, "c").value();
  auto c = st->open_run("streaming-64", {{"k", 2}}, "c").value();
  for (int p = 0; p < 4; ++p) {
    ASSERT_TRUE(write_prompt(*st, a.id, p, 2, scorer("1")).ok());
    ASSERT_TRUE(write_prompt(*st, b.id, p, 2, scorer("2")).ok());
    ASSERT_TRUE(write_prompt(*st, c.id, p, 2, scorer("2")).ok());
  }
  CompareOptions o;
  auto r = compare_report(*st, o);
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("fake-tox@1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fake-tox@2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rescore"), std::string::npos) << msg;
  o.scorers = {"fake-tox@2"};
  auto r2 = compare_report(*st, o);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("scored by fake-tox@1"), std::string::npos) << r2.status().message();
  // Rescore 'full' with v2 and the others with v1 (values shifted): now it compares.
  for (const auto* run : {&a, &b, &c}) {
    std::vector<ScoreRecord> rows;
    const auto gens = st->generations(run->id).value();
    for (const auto& g : gens) {
      double base = ((g.prompt_index * 7 + g.choice * 3) % 10) / 10.0;
      rows.push_back(score_of(scorer(run == &a ? "2" : "1"), g.id, run == &a ? std::min(1.0, base + 0.25) : base));
    }
    auto added = st->add_scores(rows);
    ASSERT_TRUE(added.ok()) << added.to_string();
  }
  o.scorers.clear();
  auto ok = compare_report(*st, o);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  const auto& rep = *ok;
  ASSERT_EQ(rep["scorers"].size(), 2u);
  ASSERT_EQ(rep["pairs"].size(), 1u);
  const auto& pair = rep["pairs"][0];
  // Under v1 all three runs have the same texts and values (tied); under v2 'full' is higher.
  EXPECT_EQ(pair["generations"], 24);
  EXPECT_NEAR(pair["max_abs_shift"].get<double>(), 0.25, 1e-12);
  EXPECT_TRUE(pair["kendall_tau_b"].is_null()) << "v1 ties every system: tau-b undefined, as scipy";
  EXPECT_EQ(rep["rankings"]["fake-tox@2"][0]["run"], "full");
  EXPECT_NE(rep["text"].get<std::string>().find("Kendall tau-b"), std::string::npos);
}

TEST_F(StoreTest, Exports) {
  auto st = Store::open(path_).value();
  auto run = st->open_run("sys,\"quoted\"", {{"k", 2}}, "c").value();
  ASSERT_TRUE(write_prompt(*st, run.id, 0, 2, scorer("1")).ok());
  std::ostringstream j, c;
  ASSERT_TRUE(st->export_jsonl(j).ok());
  ASSERT_TRUE(st->export_csv(c).ok());
  std::istringstream in(j.str());
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    auto rec = nlohmann::json::parse(line);
    EXPECT_EQ(rec["scorer"], "fake-tox@1");
    EXPECT_EQ(rec["run"], "sys,\"quoted\"");
    EXPECT_EQ(rec["seed"], 1000 + rec["choice"].get<int>());
    ++n;
  }
  EXPECT_EQ(n, 2);
  const std::string csv = c.str();
  EXPECT_NE(csv.find("\"sys,\"\"quoted\"\"\""), std::string::npos) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
}

}  // namespace
}  // namespace snap::scoring
