// `snapserve eval` end to end on the default model: a tiny sweep (single needle in
// Shakespeare at ~400 tokens, depths 0 and 100, full and snapkv 64 with both question
// placements) whose tasks are reproducible, whose `full` answers equal `snapserve
// generate` on the same prompt, whose context_only answers equal `generate --question`,
// which resumes after a torn line, reports (markdown + SVG), and gives the same answers
// through `--url` against a `snapserve serve` process. Exits 77 without the model or corpus.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/snapserve_binary.h"
#include "coordinator/engine/model_path.h"
#include "eval/longctx/answer_check.h"
#include "eval/longctx/haystack.h"
#include "tests/e2e/server_process.h"

namespace snap::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using snap::testing::slurp_file;

const std::string k_bin = snapserve_binary();
const std::string k_sweep =
    " --tasks niah_single --haystacks shakespeare --lengths 400 --depths 0,100 --seeds 0 --policies full,snapkv "
    "--budgets 64 --windows 16";

struct Ran {
  int rc = -1;
  std::string out, err;
};

fs::path work_dir() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / ("snap_eval_e2e_" + std::to_string(::getpid()));
    fs::create_directories(p);
    return p;
  }();
  return d;
}

Ran run(const std::string& args) {
  const std::string o = (work_dir() / "stdout").string(), e = (work_dir() / "stderr").string();
  const std::string cmd = k_bin + " " + args + " > " + o + " 2> " + e;
  const int status = std::system(cmd.c_str());
  Ran r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp_file(o);
  r.err = slurp_file(e);
  return r;
}

std::vector<json> read_jsonl(const fs::path& p) {
  std::vector<json> v;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) v.push_back(json::parse(line));
  }
  return v;
}

class EvalE2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(default_model_path()) || !fs::is_directory(default_haystack_dir())) {
      std::fprintf(stderr, "default model or haystack corpus absent (scripts/setup.sh fetches both): skipping\n");
      std::exit(77);
    }
    records_path_ = (work_dir() / "r.jsonl").string();
    first_ = run("eval run" + k_sweep + " --max-tokens 24 --placements after,context_only -c 2 --output " + records_path_);
    tasks_a_ = run("eval tasks" + k_sweep).out;
    tasks_b_ = run("eval tasks" + k_sweep).out;
  }
  static void TearDownTestSuite() { fs::remove_all(work_dir()); }

  // The generated task (eval tasks) of a depth.
  static json task_at(int depth) {
    std::istringstream in(tasks_a_);
    std::string line;
    while (std::getline(in, line)) {
      json j = json::parse(line);
      if (j["depth"] == depth) return j;
    }
    return json();
  }

  static inline std::string records_path_, tasks_a_, tasks_b_;
  static inline Ran first_;
};

TEST_F(EvalE2e, RunRecordsEveryCaseWithProvenance) {
  ASSERT_EQ(first_.rc, 0) << first_.err;
  const auto recs = read_jsonl(records_path_);
  ASSERT_EQ(recs.size(), 6u) << "2 depths x (full once + snapkv after + snapkv context_only)";
  for (const auto& r : recs) {
    EXPECT_EQ(r["model_sha256"].get<std::string>().size(), 64u);
    EXPECT_EQ(r["haystack_sha256"].get<std::string>().size(), 64u);
    EXPECT_GE(r["snapserve_commit"].get<std::string>().size(), 7u);
    EXPECT_LE(r["prompt_tokens"].get<int64_t>(), 400);
    EXPECT_GE(r["prompt_tokens"].get<int64_t>(), 300);
    EXPECT_EQ(r["prompt_tokens"], r["served_prompt_tokens"]);
    // The recorded verdict is the scorer's on the recorded output.
    const auto expected = r["expected"].get<std::vector<std::string>>();
    EXPECT_EQ(r["correct"].get<bool>(), score_answer(ScoreKind::contains, r["output"], expected).correct);
    EXPECT_EQ(r["needles"].size(), 1u);
    EXPECT_NE(r["needles"][0].get<std::string>().find(expected[0]), std::string::npos);
    // Where the needle lies in the prompt, for tools/eval_needle_kept.py.
    ASSERT_EQ(r["needle_tokens"].size(), 1u);
    EXPECT_LT(r["needle_tokens"][0][0].get<int64_t>(), r["needle_tokens"][0][1].get<int64_t>());
    EXPECT_LE(r["needle_tokens"][0][1].get<int64_t>(), r["context_tokens"].get<int64_t>());
  }
  EXPECT_NE(first_.out.find("niah_single after L400 | full"), std::string::npos) << first_.out;
}

TEST_F(EvalE2e, TasksAreReproducible) {
  ASSERT_FALSE(tasks_a_.empty());
  EXPECT_EQ(tasks_a_, tasks_b_);
  std::map<int, std::string> sha;
  std::istringstream in(tasks_a_);
  std::string line;
  while (std::getline(in, line)) sha[json::parse(line)["depth"].get<int>()] = json::parse(line)["prompt_sha256"];
  for (const auto& r : read_jsonl(records_path_)) EXPECT_EQ(r["prompt_sha256"], sha[r["depth"].get<int>()]);
}

// `full` scores what the model scores: its answers are `snapserve generate`'s on the same
// prompt; context_only answers are `generate --question`'s (the context compressed alone).
TEST_F(EvalE2e, AnswersEqualDirectGeneration) {
  ASSERT_EQ(first_.rc, 0);
  int checked = 0;
  for (const auto& r : read_jsonl(records_path_)) {
    const json t = task_at(r["depth"].get<int>());
    ASSERT_TRUE(t.is_object());
    const std::string prompt = t["prompt"], question = t["question"];
    const std::string gen = " --chat --max-tokens 24 --prefill-chunk 256";
    Ran g;
    if (r["policy"]["name"] == "full") {
      std::ofstream(work_dir() / "prompt.txt", std::ios::binary) << prompt;
      g = run("generate --prompt-file " + (work_dir() / "prompt.txt").string() + gen);
    } else if (r["placement"] == "context_only") {
      ASSERT_EQ(prompt.substr(prompt.size() - question.size() - 2), "\n\n" + question);
      std::ofstream(work_dir() / "context.txt", std::ios::binary) << prompt.substr(0, prompt.size() - question.size() - 2);
      std::ofstream(work_dir() / "question.txt", std::ios::binary) << question;
      g = run("generate --prompt-file " + (work_dir() / "context.txt").string() + " --question \"$(cat " +
              (work_dir() / "question.txt").string() + ")\" --kv-policy snapkv --kv-budget 64 --kv-window 16" + gen);
    } else {
      continue;
    }
    ASSERT_EQ(g.rc, 0) << g.err;
    EXPECT_EQ(g.out, r["output"].get<std::string>() + "\n") << r["key"];
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST_F(EvalE2e, ResumesSkippingDoneCasesAndCuttingATornLine) {
  ASSERT_EQ(first_.rc, 0);
  const std::string copy = (work_dir() / "resume.jsonl").string();
  fs::copy_file(records_path_, copy, fs::copy_options::overwrite_existing);
  const std::string before = slurp_file(copy);
  Ran again = run("eval run" + k_sweep + " --max-tokens 24 --placements after,context_only --output " + copy);
  ASSERT_EQ(again.rc, 0) << again.err;
  EXPECT_NE(again.err.find("6 already in"), std::string::npos) << again.err;
  EXPECT_EQ(slurp_file(copy), before);
  // A crash mid-write leaves half a line: it is cut and that case runs again.
  const size_t last = before.rfind('\n', before.size() - 2);
  fs::resize_file(copy, last + 1 + (before.size() - last - 1) / 2);
  Ran torn = run("eval run" + k_sweep + " --max-tokens 24 --placements after,context_only --output " + copy);
  ASSERT_EQ(torn.rc, 0) << torn.err;
  EXPECT_NE(torn.err.find("5 already in"), std::string::npos) << torn.err;
  EXPECT_NE(torn.err.find("torn last line"), std::string::npos) << torn.err;
  EXPECT_EQ(read_jsonl(copy).size(), 6u);
}

TEST_F(EvalE2e, ReportWritesTablesAndPictures) {
  ASSERT_EQ(first_.rc, 0);
  const fs::path dir = work_dir() / "report";
  Ran r = run("eval report --input " + records_path_ + " --output-dir " + dir.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string md = slurp_file((dir / "report.md").string());
  EXPECT_NE(md.find("6 records"), std::string::npos);
  EXPECT_NE(md.find("| full |"), std::string::npos);
  EXPECT_NE(md.find("/2) ["), std::string::npos) << md;  // 2 cases per policy and length
  int svgs = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".svg") continue;
    const std::string s = slurp_file(e.path().string());
    EXPECT_EQ(s.rfind("<?xml", 0), 0u) << e.path();
    EXPECT_EQ(s.substr(s.size() - 7), "</svg>\n") << e.path();
    ++svgs;
  }
  // heatmap, length and budget pictures for each of the two placements
  EXPECT_EQ(svgs, 6);
  EXPECT_TRUE(fs::exists(dir / "heatmap_niah_single_shakespeare_after.svg"));
  EXPECT_TRUE(fs::exists(dir / "budget_niah_single_shakespeare_context_only.svg"));
}

TEST_F(EvalE2e, UrlBackendGivesTheSameAnswers) {
  ASSERT_EQ(first_.rc, 0);
  snap::testing::ServerProcess server({k_bin, "serve", "--port", "0", "--kv-cache-mib", "256"});
  ASSERT_GT(server.port(), 0);
  const std::string url_out = (work_dir() / "url.jsonl").string();
  Ran r = run("eval run" + k_sweep + " --max-tokens 24 --placements after -c 2 --url http://127.0.0.1:" + std::to_string(server.port()) +
              " --output " + url_out);
  ASSERT_EQ(r.rc, 0) << r.err;
  std::map<std::string, std::string> local;
  for (const auto& rec : read_jsonl(records_path_)) local[rec["key"]] = rec["output"];
  const auto recs = read_jsonl(url_out);
  ASSERT_EQ(recs.size(), 4u);
  for (const auto& rec : recs) {
    ASSERT_TRUE(local.count(rec["key"])) << rec["key"];
    EXPECT_EQ(rec["output"].get<std::string>(), local[rec["key"]]) << rec["key"];
    EXPECT_EQ(rec["backend"].get<std::string>().rfind("http://127.0.0.1:", 0), 0u);
  }
  // --server-policy sends no kv_compression: one case per task, the server's default (full).
  const std::string plain_out = (work_dir() / "plain.jsonl").string();
  Ran plain = run("eval run" + k_sweep + " --max-tokens 24 --server-policy --url http://127.0.0.1:" +
                  std::to_string(server.port()) + " --output " + plain_out);
  ASSERT_EQ(plain.rc, 0) << plain.err;
  const auto plain_recs = read_jsonl(plain_out);
  ASSERT_EQ(plain_recs.size(), 2u);
  for (const auto& rec : plain_recs) {
    EXPECT_EQ(rec["policy_label"], "server");
    const std::string full_key = rec["key"];
    ASSERT_TRUE(local.count(full_key)) << full_key;
    EXPECT_EQ(rec["output"].get<std::string>(), local[full_key]);
  }
  Ran ctx = run("eval run" + k_sweep + " --max-tokens 24 --placements context_only --url http://127.0.0.1:" +
                std::to_string(server.port()) + " --output " + url_out);
  EXPECT_EQ(ctx.rc, 1);
  EXPECT_NE(ctx.err.find("context_only needs the in-process engine"), std::string::npos) << ctx.err;
}

// --kv-dtype reaches the in-process engine (q8_0 rows: 68 bytes per 64 values against f32's
// 256, with each block's positions beside them) and names the cases, so records of several
// KV types share a file and a report; full's answer is `generate --kv-dtype q8_0`'s.
TEST_F(EvalE2e, KvDtypeNamesTheCasesAndReachesTheEngine) {
  ASSERT_EQ(first_.rc, 0);
  const std::string path = (work_dir() / "q8.jsonl").string();
  Ran q = run("eval run --tasks niah_single --haystacks shakespeare --lengths 400 --depths 0 --seeds 0 "
              "--policies full,snapkv --budgets 64 --windows 16 --max-tokens 24 -c 2 --kv-dtype q8_0 --output " + path);
  ASSERT_EQ(q.rc, 0) << q.err;
  std::map<std::string, json> f32;
  for (const auto& r : read_jsonl(records_path_)) f32[r["key"].get<std::string>()] = r;
  const auto recs = read_jsonl(path);
  ASSERT_EQ(recs.size(), 2u);
  for (const auto& r : recs) {
    const std::string key = r["key"], label = r["policy_label"];
    ASSERT_GT(key.size(), 8u);
    EXPECT_EQ(key.substr(key.size() - 8), " kv=q8_0") << key;
    EXPECT_EQ(label.substr(label.size() - 8), " kv=q8_0") << label;
    EXPECT_EQ(r["kv_dtype"], "q8_0");
    const json& base = f32[key.substr(0, key.size() - 8)];
    ASSERT_TRUE(base.is_object()) << key;
    EXPECT_EQ(base["kv_dtype"], "f32");
    EXPECT_EQ(r["prompt_sha256"], base["prompt_sha256"]);
    const double ratio = r["kv_resident_bytes"].get<double>() / base["kv_resident_bytes"].get<double>();
    EXPECT_GT(ratio, 0.2) << key;
    EXPECT_LT(ratio, 0.35) << key;
    if (r["policy"]["name"] == "full") {
      std::ofstream(work_dir() / "prompt_q8.txt", std::ios::binary) << task_at(0)["prompt"].get<std::string>();
      Ran g = run("generate --prompt-file " + (work_dir() / "prompt_q8.txt").string() +
                  " --chat --max-tokens 24 --prefill-chunk 256 --kv-dtype q8_0");
      ASSERT_EQ(g.rc, 0) << g.err;
      EXPECT_EQ(g.out, r["output"].get<std::string>() + "\n");
    }
  }
}

// At the model's whole context (SmolLM2: 8192) each prompt leaves room for its new tokens:
// an 8,191-token prompt once left one token for the answer, scored as a miss. `eval tasks`
// fits prompts as `eval run` does (tokenizer only, no engine).
TEST(EvalContext, PromptsAtTheModelContextLeaveRoomForTheAnswer) {
  if (!fs::exists(default_model_path()) || !fs::is_directory(default_haystack_dir())) {
    std::fprintf(stderr, "default model or haystack corpus absent: skipping\n");
    std::exit(77);
  }
  fs::create_directories(work_dir());  // the fixture's tear-down may have removed it
  const fs::path out = work_dir() / "ctx_tasks.jsonl";
  Ran r = run("eval tasks --tasks niah_single,niah_multivalue --lengths 8192 --depths 75 --seeds 0 --output " +
              out.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto tasks = read_jsonl(out);
  ASSERT_EQ(tasks.size(), 2u);
  for (const auto& t : tasks) {
    const int64_t room = t["task"] == "niah_single" ? 32 : 64;  // task_default_max_tokens
    EXPECT_LE(t["prompt_tokens"].get<int64_t>(), 8192 - room) << t["task"];
    EXPECT_GE(t["prompt_tokens"].get<int64_t>(), 8192 - room - 80) << t["task"] << ": paragraphs are < 80 tokens";
    EXPECT_EQ(t["length"], 8192);
  }
}

TEST_F(EvalE2e, BadInputIsOneLineNamingIt) {
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"eval run --lengths abc --output x.jsonl", "--lengths: 'abc' is not an integer"},
           {"eval run --tasks needle --output x.jsonl", "unknown task 'needle'"},
           {"eval run --policies snapkv --budgets 8 --output x.jsonl", "budget"},
           {"eval run --haystack-dir /nonexistent --output x.jsonl", "/nonexistent"},
           {"eval run --url ftp://x --output " + (work_dir() / "bad.jsonl").string(), "must start with http://"},
           {"eval run --kv-dtype q4_0 --output x.jsonl", "--kv-dtype: KV dtype 'q4_0': expected f32, bf16, f16 or q8_0"},
           {"eval run --kv-dtype f16 --url http://127.0.0.1:9 --output " + (work_dir() / "bad.jsonl").string(),
            "with --url the server chooses its own"},
           {"eval report --input /nonexistent.jsonl --output-dir " + (work_dir() / "r2").string(), "/nonexistent.jsonl"}}) {
    Ran r = run(args);
    EXPECT_EQ(r.rc, 1) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace snap::eval
