// Long-context task generators, scorers, sweep expansion, Wilson intervals and the SVG
// writer. The RNG is checked against tools/eval_rng_reference.py's golden values; tasks
// are fitted with the default model's tokenizer (skipped, exit 77, without the model).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "coordinator/engine/model_path.h"
#include "eval/longctx/answer_check.h"
#include "eval/longctx/haystack.h"
#include "eval/longctx/report.h"
#include "eval/longctx/svg_plot.h"
#include "eval/longctx/sweep.h"
#include "eval/longctx/tasks.h"

namespace snap::eval {
namespace {

const Tokenizer* tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    std::unique_ptr<Tokenizer> t;
    const std::string path = default_model_path();
    if (!std::filesystem::exists(path)) return t;
    auto r = Tokenizer::load_for_model(path);
    if (r.ok()) t = std::make_unique<Tokenizer>(std::move(r).value());
    return t;
  }();
  return tok.get();
}

#define NEED_TOKENIZER()                                                  \
  if (!tokenizer()) {                                                     \
    std::fprintf(stderr, "default model absent: skipping\n");             \
    std::exit(77);                                                        \
  }

TextCorpus small_corpus() {
  std::vector<std::string> p;
  for (int i = 0; i < 400; ++i) {
    p.push_back("Paragraph " + std::to_string(i) + " says that the river runs past the old mill,\nand the miller sings.");
  }
  return TextCorpus::from_paragraphs(p);
}

// --- RNG ----------------------------------------------------------------------------------

TEST(EvalRng, MatchesPythonReference) {
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/eval_longctx/rng.json");
  ASSERT_TRUE(in) << "fixture missing";
  const auto j = nlohmann::json::parse(in);
  EvalRng a(42);
  for (const auto& v : j["seed42_u64"]) EXPECT_EQ(a.next_u64(), std::stoull(v.get<std::string>()));
  EvalRng b(7);
  for (size_t i = 0; i < j["below_n"].size(); ++i) {
    const uint64_t n = std::stoull(j["below_n"][i].get<std::string>());
    EXPECT_EQ(b.below(n), std::stoull(j["seed7_below"][i].get<std::string>())) << "n = " << n;
  }
  EXPECT_EQ(mix_seed(mix_seed(1469598103934665603ULL, "snapserve-eval-v1"), "niah_single"),
            std::stoull(j["mix_v1_niah_single"].get<std::string>()));
}

// --- tasks --------------------------------------------------------------------------------

TEST(EvalTasks, SameSeedSameBytesOtherSeedOtherTask) {
  NEED_TOKENIZER();
  const TextCorpus corpus = small_corpus();
  for (TaskKind k : {TaskKind::niah_single, TaskKind::passkey, TaskKind::niah_multikey, TaskKind::niah_multivalue,
                     TaskKind::vt, TaskKind::cwe}) {
    for (HaystackKind h : {HaystackKind::shakespeare, HaystackKind::noise}) {
      TaskSpec s;
      s.kind = k;
      s.haystack = h;
      s.length = 700;
      s.depth_percent = task_uses_depth(k) ? 40 : -1;
      s.seed = 3;
      auto a = make_task(s, *tokenizer(), &corpus, true);
      auto b = make_task(s, *tokenizer(), &corpus, true);
      ASSERT_TRUE(a.ok()) << task_name(k) << ": " << a.status().message();
      ASSERT_TRUE(b.ok());
      EXPECT_EQ(a->prompt_text, b->prompt_text) << task_name(k);
      EXPECT_EQ(a->prompt_ids, b->prompt_ids) << task_name(k);
      EXPECT_EQ(a->expected, b->expected) << task_name(k);
      EXPECT_EQ(a->prompt_sha256.size(), 64u);
      s.seed = 4;
      auto c = make_task(s, *tokenizer(), &corpus, true);
      ASSERT_TRUE(c.ok());
      EXPECT_NE(a->expected, c->expected) << task_name(k) << ": seed 4 drew the same answers as seed 3";
      // Needles are in the prompt, every answer is findable in the context.
      for (const auto& n : a->needles) EXPECT_NE(a->context.find(n), std::string::npos);
      for (const auto& e : a->expected) EXPECT_TRUE(contains_whole(a->context, e)) << task_name(k) << " " << e;
    }
  }
}

TEST(EvalTasks, GoldenPromptHashPinsTheGenerator) {
  NEED_TOKENIZER();
  // The noise haystack needs no corpus: this hash changes only if the generator, the
  // templates or the tokenizer's counts change (then re-pin it and say so in the commit).
  TaskSpec s;
  s.kind = TaskKind::niah_single;
  s.haystack = HaystackKind::noise;
  s.length = 512;
  s.depth_percent = 50;
  s.seed = 0;
  auto t = make_task(s, *tokenizer(), nullptr, true);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->expected.size(), 1u);
  EXPECT_EQ(t->prompt_sha256, "20a2be7df71c71345fc320a62bf93242cbd3e12c24e7472ed5a5de44bfea2fbb");
  EXPECT_EQ(t->prompt_ids.size(), 512u);
}

TEST(EvalTasks, LengthIsFittedWithTheTokenizer) {
  NEED_TOKENIZER();
  const TextCorpus corpus = small_corpus();
  for (int64_t len : {300, 1000, 2500}) {
    for (TaskKind k : {TaskKind::niah_single, TaskKind::cwe}) {
      TaskSpec s;
      s.kind = k;
      s.haystack = HaystackKind::noise;
      s.length = len;
      s.depth_percent = 50;
      auto t = make_task(s, *tokenizer(), &corpus, true);
      ASSERT_TRUE(t.ok()) << t.status().message();
      const int64_t n = static_cast<int64_t>(t->prompt_ids.size());
      EXPECT_LE(n, len);
      EXPECT_GE(n, len - 12) << task_name(k) << " at " << len << ": noise units are ~5 tokens, cwe items ~4";
      // The context cut is a real prefix of the prompt, the question after it.
      EXPECT_GT(t->context_tokens, n / 2);
      EXPECT_LT(t->context_tokens, n);
    }
  }
  TaskSpec tiny;
  tiny.length = 40;
  auto bad = make_task(tiny, *tokenizer(), &corpus, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("length 40 is too short"), std::string::npos) << bad.status().message();
}

// A case at the model's whole context must leave room for its answer: eval run sets
// max_prompt_tokens = context - new tokens. The bound changes only the fit: the needles
// (seeded by length, depth, seed) stay the same, and without it the prompt exceeds it.
TEST(EvalTasks, PromptBoundLeavesRoomForTheAnswer) {
  NEED_TOKENIZER();
  const TextCorpus corpus = small_corpus();
  for (TaskKind k : {TaskKind::niah_single, TaskKind::niah_multivalue, TaskKind::cwe}) {
    TaskSpec s;
    s.kind = k;
    s.haystack = HaystackKind::noise;
    s.length = 1000;
    s.depth_percent = 75;
    auto whole = make_task(s, *tokenizer(), &corpus, true);
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    s.max_prompt_tokens = 1000 - task_default_max_tokens(k);
    EXPECT_EQ(prompt_token_bound(s), s.max_prompt_tokens);
    auto bounded = make_task(s, *tokenizer(), &corpus, true);
    ASSERT_TRUE(bounded.ok()) << bounded.status().message();
    const int64_t n = static_cast<int64_t>(bounded->prompt_ids.size());
    EXPECT_GT(static_cast<int64_t>(whole->prompt_ids.size()), s.max_prompt_tokens) << task_name(k);
    EXPECT_LE(n, s.max_prompt_tokens) << task_name(k);
    EXPECT_GE(n, s.max_prompt_tokens - 12) << task_name(k);
    EXPECT_EQ(bounded->needles, whole->needles) << task_name(k);
    EXPECT_EQ(bounded->expected, whole->expected) << task_name(k);
    s.max_prompt_tokens = 5000;  // a looser bound than length changes nothing
    auto loose = make_task(s, *tokenizer(), &corpus, true);
    ASSERT_TRUE(loose.ok());
    EXPECT_EQ(loose->prompt_sha256, whole->prompt_sha256) << task_name(k);
  }
  TaskSpec tiny;
  tiny.length = 400;
  tiny.max_prompt_tokens = 40;
  auto bad = make_task(tiny, *tokenizer(), &corpus, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("length 400 (at most 40 prompt tokens in the model's context) is too short"),
            std::string::npos)
      << bad.status().message();
}

TEST(EvalTasks, DepthPlacesTheNeedle) {
  NEED_TOKENIZER();
  const TextCorpus corpus = small_corpus();
  double prev = -1;
  for (int d : {0, 25, 50, 75, 100}) {
    TaskSpec s;
    s.kind = TaskKind::niah_single;
    s.length = 1500;
    s.depth_percent = d;
    auto t = make_task(s, *tokenizer(), &corpus, false);
    ASSERT_TRUE(t.ok());
    const size_t hay_start = t->context.find("\n\n") + 2;
    const double at = static_cast<double>(t->context.find(t->needles[0]) - hay_start) /
                      static_cast<double>(t->context.size() - hay_start);
    EXPECT_NEAR(at, d / 100.0, 0.06) << "depth " << d;
    EXPECT_GT(at, prev);
    prev = at;
  }
}

// needle_tokens: the ids at [begin, end) decode to the needle's sentence (up to the space
// or newline a boundary token carries), in both prompt forms and for every needle of a
// multi-needle task; the spans are in text order, inside the context, and disjoint.
TEST(EvalTasks, NeedleTokensAreTheNeedlesIds) {
  NEED_TOKENIZER();
  const TextCorpus corpus = small_corpus();
  for (bool chat : {false, true}) {
    for (TaskKind k : {TaskKind::niah_single, TaskKind::niah_multikey, TaskKind::vt}) {
      TaskSpec s;
      s.kind = k;
      s.length = 900;
      s.depth_percent = 30;
      s.seed = 5;
      auto t = make_task(s, *tokenizer(), &corpus, chat);
      ASSERT_TRUE(t.ok()) << t.status().message();
      ASSERT_EQ(t->needle_tokens.size(), t->needles.size());
      int64_t prev_end = 0;
      for (size_t i = 0; i < t->needles.size(); ++i) {
        const auto [b, e] = t->needle_tokens[i];
        EXPECT_GE(b, prev_end);
        EXPECT_LT(b, e);
        EXPECT_LE(e, t->context_tokens);
        prev_end = e;
        std::vector<int32_t> ids(t->prompt_ids.begin() + b, t->prompt_ids.begin() + e);
        std::string text = tokenizer()->decode(ids, false);
        while (!text.empty() && (text.front() == ' ' || text.front() == '\n')) text.erase(text.begin());
        // A boundary token shared with the text around may be left out: the span holds at
        // least the needle without its first and last character.
        const std::string& n = t->needles[i];
        EXPECT_NE(n.find(text), std::string::npos) << "'" << text << "' not in '" << n << "'";
        EXPECT_GE(text.size() + 2, n.size()) << "'" << text << "' vs '" << n << "'";
      }
    }
  }
}

// --- scorers ----------------------------------------------------------------------------------

TEST(AnswerCheck, ExactOnKnownAnswers) {
  EXPECT_TRUE(score_answer(ScoreKind::contains, "The number is 7227305.", {"7227305"}).correct);
  EXPECT_FALSE(score_answer(ScoreKind::contains, "The number is 72273051.", {"7227305"}).correct);
  EXPECT_FALSE(score_answer(ScoreKind::contains, "The number is 17227305", {"7227305"}).correct);
  EXPECT_FALSE(score_answer(ScoreKind::contains, "The number is 722730", {"7227305"}).correct);
  EXPECT_TRUE(score_answer(ScoreKind::contains, "variables: QZKRA, ABCDE", {"abcde"}).correct);
  EXPECT_FALSE(score_answer(ScoreKind::contains, "ABCDEF", {"ABCDE"}).correct);
  EXPECT_TRUE(score_answer(ScoreKind::exact, "  42. ", {"42"}).correct);
  EXPECT_FALSE(score_answer(ScoreKind::exact, "It is 42", {"42"}).correct);
  EXPECT_TRUE(score_answer(ScoreKind::numeric, "It is 42, not 43", {"42"}).correct);
  EXPECT_FALSE(score_answer(ScoreKind::numeric, "It is 43, not 42", {"42"}).correct);
  EXPECT_FALSE(score_answer(ScoreKind::numeric, "no number", {"42"}).correct);
  const AnswerScore half = score_answer(ScoreKind::all, "1111111 and 3333333", {"1111111", "2222222", "3333333", "4444444"});
  EXPECT_FALSE(half.correct);
  EXPECT_DOUBLE_EQ(half.partial, 0.5);
  const AnswerScore all = score_answer(ScoreKind::all, "4444444 3333333 2222222 1111111", {"1111111", "2222222", "3333333", "4444444"});
  EXPECT_TRUE(all.correct);
  EXPECT_DOUBLE_EQ(all.partial, 1.0);
  EXPECT_FALSE(score_answer(ScoreKind::contains, "anything", {}).correct);
  EXPECT_FALSE(score_kind_from_name("fuzzy").ok());
}

// --- sweeps ------------------------------------------------------------------------------------

TEST(Sweep, CrossesOnlyTheParametersAPolicyReads) {
  SweepFlags f;
  f.tasks = "niah_single,vt";
  f.lengths = "512,1024";
  f.depths = "0,50,100";
  f.seeds = "0-1";
  f.placements = "after,context_only";
  f.policies = "full,snapkv,streaming";
  f.budgets = "128,256";
  f.kernels = "7,15";
  auto policies = sweep_policies(f);
  ASSERT_TRUE(policies.ok()) << policies.status().message();
  EXPECT_EQ(policies->size(), 1u + 2 * 2 + 2);  // full; snapkv budgets x kernels; streaming budgets
  auto cases = sweep_cases(f);
  ASSERT_TRUE(cases.ok());
  // niah: 2 lengths x 3 depths x 2 seeds x (full once + 6 policies x 2 placements); vt ignores depth.
  EXPECT_EQ(cases->size(), 2u * 3 * 2 * 13 + 2u * 1 * 2 * 13);
  std::set<std::string> keys;
  for (const auto& c : *cases) keys.insert(c.key);
  EXPECT_EQ(keys.size(), cases->size());
  f.depths = "0,101";
  EXPECT_NE(sweep_cases(f).status().message().find("--depths: 101"), std::string::npos);
  f.depths = "0";
  f.budgets = "16";  // below the window
  EXPECT_FALSE(sweep_cases(f).ok());
  f.budgets = "x";
  EXPECT_NE(sweep_cases(f).status().message().find("--budgets: 'x' is not an integer"), std::string::npos);
  EXPECT_EQ(parse_int_list("--seeds", "0-3,9").value(), (std::vector<int64_t>{0, 1, 2, 3, 9}));
}

// An eval run without SnapKV flags measures what a server runs without them: the sweep's
// defaults are KvPolicy's (window, kernel, pooling, GQA aggregation).
TEST(Sweep, DefaultsAreTheServingDefaults) {
  SweepFlags f;
  f.policies = "snapkv,pyramidkv,adakv";
  auto policies = sweep_policies(f);
  ASSERT_TRUE(policies.ok()) << policies.status().message();
  ASSERT_EQ(policies->size(), 3u);
  const KvPolicy d;
  for (const KvPolicy& p : *policies) {
    EXPECT_EQ(p.budget, d.budget);
    EXPECT_EQ(p.window, d.window);
    EXPECT_EQ(p.kernel, d.kernel);
    EXPECT_EQ(p.pooling, d.pooling);
    EXPECT_EQ(p.aggregation, d.aggregation);
  }
  EXPECT_EQ(d.pooling, KvPooling::avg);  // docs/eval.md, seventh sweep
}

// --- intervals and pictures ------------------------------------------------------------------------

TEST(Report, WilsonInterval) {
  // References: the Wilson formula evaluated in Python (z = 1.959963984540054).
  Interval a = wilson_interval(0, 3);
  EXPECT_NEAR(a.lo, 0.0, 1e-12);
  EXPECT_NEAR(a.hi, 0.561497, 1e-5);
  Interval b = wilson_interval(5, 5);
  EXPECT_NEAR(b.lo, 0.565518, 1e-5);
  EXPECT_NEAR(b.hi, 1.0, 1e-12);
  Interval c = wilson_interval(7, 10);
  EXPECT_NEAR(c.lo, 0.396778, 1e-5);
  EXPECT_NEAR(c.hi, 0.892209, 1e-5);
}

// Records of the same case from two models and a server are three results, each in its own
// sections; the same (system, key) twice counts once, the last line winning.
TEST(Report, SeparatesModelsAndServers) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("snap_report_systems_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto rec = [](const std::string& backend, const std::string& model, bool correct) {
    nlohmann::json j = {{"key", "niah_single|shakespeare|L1024|d50|s0|after|full"},
                        {"task", "niah_single"},
                        {"haystack", "shakespeare"},
                        {"placement", "after"},
                        {"policy_label", "full"},
                        {"policy_family", "full"},
                        {"policy", {{"name", "full"}}},
                        {"length", 1024},
                        {"depth", 50},
                        {"prompt_tokens", 1000},
                        {"correct", correct},
                        {"partial", correct ? 1.0 : 0.0},
                        {"backend", backend}};
    j[backend == "engine" ? "model_file" : "served_model"] = model;
    return j.dump() + "\n";
  };
  const std::string path = (dir / "mixed.jsonl").string();
  {
    std::ofstream out(path);
    out << rec("engine", "a.gguf", true) << rec("engine", "b.gguf", false) << rec("http://127.0.0.1:8080", "m", true)
        << rec("engine", "a.gguf", false);
  }
  auto recs = load_records({path});
  ASSERT_TRUE(recs.ok()) << recs.status().message();
  ASSERT_EQ(recs->size(), 3u);
  EXPECT_EQ((*recs)[0].system, "a.gguf");
  EXPECT_FALSE((*recs)[0].correct);  // the later a.gguf line
  EXPECT_EQ((*recs)[2].system, "m @ http://127.0.0.1:8080");
  auto files = write_report(*recs, (dir / "report").string(), "t");
  ASSERT_TRUE(files.ok()) << files.status().message();
  std::ifstream in(dir / "report" / "report.md");
  const std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("Records of 3 systems"), std::string::npos) << md;
  EXPECT_NE(md.find("## a.gguf: niah_single on shakespeare"), std::string::npos) << md;
  EXPECT_NE(md.find("## b.gguf: niah_single on shakespeare"), std::string::npos) << md;
  EXPECT_NE(md.find("## m @ http://127.0.0.1:8080: niah_single"), std::string::npos) << md;
  EXPECT_NE(md.find("| full | 0% (0/1)"), std::string::npos) << md;  // a.gguf and b.gguf
  EXPECT_NE(md.find("| full | 100% (1/1)"), std::string::npos) << md;  // the server
  EXPECT_EQ(md.find("/2)"), std::string::npos) << md;                   // nothing pooled
  EXPECT_TRUE(fs::exists(dir / "report" / "heatmap_a_gguf_niah_single_shakespeare_after.svg"));
  EXPECT_TRUE(fs::exists(dir / "report" / "heatmap_m___http___127_0_0_1_8080_niah_single_shakespeare_after.svg"));
  // One system: the names and headings of before.
  auto one = load_records({path});
  one->resize(1);
  ASSERT_TRUE(write_report(*one, (dir / "one").string(), "t").ok());
  EXPECT_TRUE(fs::exists(dir / "one" / "heatmap_niah_single_shakespeare_after.svg"));
  fs::remove_all(dir);
}

TEST(SvgPlot, WellFormedWithOneCellPerValue) {
  HeatmapPanel p;
  p.title = "snapkv <b>";
  p.columns = {"1024", "2048"};
  p.rows = {"0%", "50%", "100%"};
  p.value = {{1, 0.5}, {0, NAN}, {0.25, 1}};
  const std::string s = svg_heatmaps("t", "x", "y", {p, p});
  EXPECT_EQ(s.rfind("<?xml", 0), 0u);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  EXPECT_NE(s.find("snapkv &lt;b&gt;"), std::string::npos);
  size_t rects = 0;
  for (size_t pos = s.find("<rect"); pos != std::string::npos; pos = s.find("<rect", pos + 1)) ++rects;
  EXPECT_EQ(rects, 1u + 2 * 6);  // background + 6 cells per panel
  const std::string l = svg_line_chart("t", "x", "y", {"a", "b"}, {{"s", {0.5, NAN}, {0.2, NAN}, {0.8, NAN}}});
  EXPECT_NE(l.find("<circle"), std::string::npos);
  EXPECT_EQ(l.find("<circle", l.find("<circle") + 1), std::string::npos);  // NaN draws no point
}

}  // namespace
}  // namespace snap::eval
