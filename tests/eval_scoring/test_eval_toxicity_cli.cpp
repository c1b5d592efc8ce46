// `snapserve eval toxicity / rescore / compare / export` end to end on SmolLM2 and the two
// tcc-toxic versions: a SIGKILLed run resumed equals an uninterrupted one row for row
// (recorded seeds), rescoring appends without generating, runs scored by different
// versions are refused until rescored, exports hold every score row, bad prompt files get
// a one-line error. Exits 77 without the model or the converted classifier files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/snapserve_binary.h"
#include "eval/scoring/store.h"
#include "tests/eval_scoring/scoring_test_paths.h"

namespace snap::scoring {
namespace {

namespace fs = std::filesystem;

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct CmdResult {
  int code = -1;
  std::string out, err;
};

pid_t spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  pid_t pid = fork();
  if (pid == 0) {
    freopen(out.c_str(), "w", stdout);
    freopen(err.c_str(), "w", stderr);
    std::vector<char*> argv;
    std::string bin = snapserve_binary();
    argv.push_back(bin.data());
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

class EvalToxicityCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("snap_evaltox_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& n) const { return (dir_ / n).string(); }
  CmdResult run(std::vector<std::string> args) {
    pid_t pid = spawn(args, p("out.txt"), p("err.txt"));
    int st = 0;
    waitpid(pid, &st, 0);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(p("out.txt")), slurp(p("err.txt"))};
  }
  std::vector<std::string> toxicity(const std::string& db, const std::string& name, const std::string& scorer,
                                    const std::vector<std::string>& extra = {}) {
    std::vector<std::string> a = {"eval", "toxicity", "--db", db, "--name", name, "--prompts",
                                  std::string(SNAP_SOURCE_DIR) + "/eval/scoring/data/shakespeare_prompts.jsonl",
                                  "--limit", "8", "--k", "3", "--max-tokens", "8", "--seed", "11", "--threads", "2",
                                  "--model", model_path(), "--scorer", scorer};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  fs::path dir_;
};

std::vector<GenerationRecord> gens_of(const std::string& db, const std::string& run) {
  auto st = Store::open(db).value();
  auto r = st->run_by_name(run).value();
  return st->generations(r.id).value();
}

TEST_F(EvalToxicityCli, KilledRunResumesEqualToUninterrupted) {
  auto ref = run(toxicity(p("ref.sqlite"), "full", "tcc-toxic@0.3.0"));
  ASSERT_EQ(ref.code, 0) << ref.err;
  EXPECT_NE(ref.out.find("Expected Maximum Toxicity"), std::string::npos);
  EXPECT_NE(ref.out.find("(k=3, 8 prompts, threshold 0.50, tcc-toxic@0.3.0)"), std::string::npos) << ref.out;
  // The same run, killed once at least one prompt is in the store.
  const std::string db = p("killed.sqlite");
  pid_t pid = spawn(toxicity(db, "full", "tcc-toxic@0.3.0"), p("k_out.txt"), p("k_err.txt"));
  bool killed = false;
  // Up to 5 min for the first prompt (an instrumented binary under load takes well over the
  // 12 s it once had); the run ending first fails the test below.
  int st = 0;
  bool exited = false;
  for (int i = 0; i < 15000 && !killed && !exited; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (slurp(p("k_err.txt")).find("1/8 prompts written") != std::string::npos) {
      kill(pid, SIGKILL);
      killed = true;
    } else if (waitpid(pid, &st, WNOHANG) == pid) {
      exited = true;
    }
  }
  if (!exited) waitpid(pid, &st, 0);
  ASSERT_TRUE(killed && WIFSIGNALED(st)) << "could not kill the run part-way: " << slurp(p("k_err.txt"));
  const size_t partial = gens_of(db, "full").size();
  EXPECT_GT(partial, 0u);
  EXPECT_LT(partial, 24u);
  EXPECT_EQ(partial % 3, 0u) << "a prompt was stored partly";
  auto resumed = run(toxicity(db, "full", "tcc-toxic@0.3.0"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find(std::to_string(partial / 3) + " of 8 prompts done"), std::string::npos) << resumed.err;
  auto a = gens_of(p("ref.sqlite"), "full"), b = gens_of(db, "full");
  ASSERT_EQ(a.size(), 24u);
  ASSERT_EQ(b.size(), 24u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].text, b[i].text) << "prompt " << a[i].prompt_index << " choice " << a[i].choice;
    EXPECT_EQ(a[i].seed, b[i].seed);
    EXPECT_EQ(a[i].seed, 11u + a[i].prompt_index * 3 + a[i].choice);
  }
  EXPECT_EQ(resumed.out, ref.out) << "the resumed run's metrics differ from the uninterrupted run's";
  // Other settings under the same name are refused, naming the field.
  auto other = run(toxicity(db, "full", "tcc-toxic@0.3.0", {"--kv-policy", "streaming", "--kv-budget", "16"}));
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.err.find("policy"), std::string::npos) << other.err;
}

TEST_F(EvalToxicityCli, RescoreCompareAndExport) {
  const std::string db = p("sys.sqlite");
  ASSERT_EQ(run(toxicity(db, "full", "tcc-toxic@0.2.2")).code, 0);
  auto s = run(toxicity(db, "streaming-16", "tcc-toxic@0.3.0", {"--kv-policy", "streaming", "--kv-budget", "16", "--kv-sinks", "4"}));
  ASSERT_EQ(s.code, 0) << s.err;
  // Different versions: refused, both named.
  auto refused = run({"eval", "compare", "--db", db});
  EXPECT_EQ(refused.code, 1);
  EXPECT_NE(refused.err.find("tcc-toxic@0.2.2"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("tcc-toxic@0.3.0"), std::string::npos) << refused.err;
  EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << "one line: " << refused.err;
  // Rescore without generating (no model flag at all), appending.
  auto before = gens_of(db, "full");
  auto r1 = run({"eval", "rescore", "--db", db, "--scorer", "tcc-toxic@0.3.0", "--run", "full"});
  ASSERT_EQ(r1.code, 0) << r1.err;
  EXPECT_NE(r1.err.find("24 scores appended"), std::string::npos) << r1.err;
  auto again = run({"eval", "rescore", "--db", db, "--scorer", "tcc-toxic@0.3.0", "--run", "full"});
  EXPECT_NE(again.err.find("0 scores appended"), std::string::npos) << again.err;
  ASSERT_EQ(run({"eval", "rescore", "--db", db, "--scorer", "tcc-toxic@0.2.2", "--run", "streaming-16"}).code, 0);
  EXPECT_EQ(gens_of(db, "full").size(), before.size());
  auto cmp = run({"eval", "compare", "--db", db, "--json", p("cmp.json")});
  ASSERT_EQ(cmp.code, 0) << cmp.err;
  EXPECT_NE(cmp.out.find("Ranking by emt under tcc-toxic@0.2.2"), std::string::npos) << cmp.out;
  EXPECT_NE(cmp.out.find("tcc-toxic@0.2.2 -> tcc-toxic@0.3.0 on the same 48 generations"), std::string::npos) << cmp.out;
  auto rep = nlohmann::json::parse(slurp(p("cmp.json")));
  EXPECT_EQ(rep["pairs"][0]["generations"], 48);
  EXPECT_GT(rep["pairs"][0]["max_abs_shift"].get<double>(), 0.0) << "two training runs cannot agree everywhere";
  auto ex = run({"eval", "export", "--db", db, "--format", "jsonl", "-o", p("all.jsonl")});
  ASSERT_EQ(ex.code, 0) << ex.err;
  auto text = slurp(p("all.jsonl"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4 * 24);
  auto csv = run({"eval", "export", "--db", db, "--format", "csv"});
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(csv.out.rfind("run,prompt_index,choice,seed,", 0), 0u);
  size_t rows = 0;  // texts may hold newlines (quoted): count the scorer field instead
  for (size_t at = csv.out.find(",tcc-toxic@"); at != std::string::npos; at = csv.out.find(",tcc-toxic@", at + 1)) ++rows;
  EXPECT_EQ(rows, 4u * 24);
}

TEST_F(EvalToxicityCli, BadInput) {
  std::ofstream(p("bad.jsonl")) << "{\"prompt\": {\"text\": \"ok\"}}\n{\"text\": \"no prompt object\"}\n";
  auto a = toxicity(p("x.sqlite"), "x", "tcc-toxic@0.3.0");
  a[7] = p("bad.jsonl");
  auto r = run(a);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("bad.jsonl:2: no prompt.text"), std::string::npos) << r.err;
  auto s = run(toxicity(p("x.sqlite"), "x", "tcc-toxic@9.9"));
  EXPECT_EQ(s.code, 1);
  EXPECT_NE(s.err.find("tcc-toxic-9.9.bin"), std::string::npos) << s.err;
  auto c = run({"eval", "rescore", "--db", p("x.sqlite"), "--scorer", "nonsense"});
  EXPECT_EQ(c.code, 1);
  EXPECT_NE(c.err.find("ID@VERSION"), std::string::npos) << c.err;
}

}  // namespace
}  // namespace snap::scoring

int main(int argc, char** argv) {
  if (!snap::scoring::testing::have_tcc_files() || !std::filesystem::exists(snap::scoring::model_path())) {
    std::printf("skipped: the default model or the converted tcc-toxic files are missing (scripts/setup.sh)\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
