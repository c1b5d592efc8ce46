// tools/eval_failures.py, which splits the wrong answers of `snapserve eval run` records into
// partial (the value's first 3+ digits, later ones lost), distractor (another needle's value)
// and absent, run on the committed fixture tests/eval_longctx/failures_fixture.jsonl: eleven
// hand-written records, each chosen for one rule of its classify() (the expected kind is in
// the comments below). Also: unreadable files and lines that are not records end it with one
// line and a non-zero exit, not a traceback.
// Also tools/eval_pairs.py (EvalPairs below): a paired comparison of two values of one policy
// parameter on the same prompts, with an exact sign test.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <vector>

#ifndef SNAP_PYTHON
#define SNAP_PYTHON "python3"
#endif

namespace {

struct ToolRun {
  int status = -1;
  std::string out;
};

// Runs tools/SCRIPT with these arguments (stderr folded into stdout).
ToolRun run_script(const std::string& script, const std::string& args) {
  const std::string cmd = std::string(SNAP_PYTHON) + " " + SNAP_SOURCE_DIR "/tools/" + script + " " + args + " 2>&1";
  ToolRun r;
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

ToolRun run_tool(const std::string& args) { return run_script("eval_failures.py", args); }

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

const std::string k_fixture = SNAP_SOURCE_DIR "/tests/eval_longctx/failures_fixture.jsonl";
const std::string k_snapkv = "snapkv budget=1024 window=32 kernel=31 pooling=max gqa=mean";

TEST(EvalFailures, CountsPerCell) {
  const ToolRun r = run_tool(k_fixture);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[0], "| task | placement | length | policy | n | correct | partial | distractor | absent |");
  // Cells sorted by (task, placement, length, policy); n correct partial distractor absent.
  EXPECT_EQ(lines[2], "| niah_multikey | after | 2048 | " + k_snapkv + " | 3 | 1 | 0 | 2 | 0 |");
  EXPECT_EQ(lines[3], "| niah_single | after | 2048 | " + k_snapkv + " | 6 | 1 | 3 | 0 | 2 |");
  EXPECT_EQ(lines[4], "| niah_single | after | 2048 | streaming budget=1024 sinks=4 | 2 | 1 | 0 | 0 | 1 |");
}

TEST(EvalFailures, EachWrongRecordClassified) {
  const ToolRun r = run_tool(k_fixture + " --list");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 5u + 8u) << r.out;  // the table, then the 8 wrong records
  const std::string single = "niah_single " + k_snapkv + " L2048 after ";
  const std::string multi = "niah_multikey " + k_snapkv + " L2048 after ";
  const std::vector<std::string> want = {
      // Another key's value named: distractor.
      multi + "depth 50 seed 0: distractor, expected ['5551234'], output 'The magic number for calm-river is 7654321.'",
      // A distractor's value and a prefix of the right one: the distractor rule comes first.
      multi + "depth 75 seed 0: distractor, expected ['5551234'], output 'Either 2223334 or 55512.'",
      // All digits but the last: partial (a number that shares 6 leading digits, not equal).
      single + "depth 0 seed 1: partial, expected ['1344350'], output 'The number is 1344351.'",
      // The value's later digits lost: partial.
      single + "depth 25 seed 0: partial, expected ['1344350'], output 'The special magic number is 134435.'",
      // Exactly 3 leading digits is still partial.
      single + "depth 50 seed 0: partial, expected ['4516832'], output '451'",
      // 2 leading digits is not: absent.
      single + "depth 75 seed 0: absent, expected ['4516832'], output 'It is 45, or 11.'",
      // No number at all: absent.
      single + "depth 100 seed 0: absent, expected ['8418313'], output 'I could not find it in the text.'",
      // A 4-digit number of another sentence is no distractor (distractors are 5+ digit values): absent.
      "niah_single streaming budget=1024 sinks=4 L2048 after depth 0 seed 0: absent, expected ['9876543'], "
      "output 'The number is 1234.'",
  };
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(lines[5 + i], want[i]) << "wrong record " << i;
}

// The same case answered by two models (engine records) and by a server (--url) is three
// rows, a system column first; one system alone prints no such column (the tests above).
TEST(EvalFailures, SystemsAreNotPooled) {
  const std::string path = ::testing::TempDir() + "eval_failures_systems.jsonl";
  {
    std::ofstream f(path);
    const std::string common =
        R"("task": "niah_single", "placement": "after", "length": 2048, "policy_label": "full", "depth": 50, )"
        R"("seed": 0, "expected": ["4516832"], "needles": [], )";
    f << "{" << common << R"("correct": false, "output": "451", "backend": "engine", "model_file": "a.gguf"})" << "\n"
      << "{" << common << R"("correct": true, "output": "4516832", "backend": "engine", "model_file": "b.gguf"})" << "\n"
      << "{" << common << R"("correct": false, "output": "no", "backend": "http://h:8080", "served_model": "m"})" << "\n";
  }
  const ToolRun r = run_tool(path + " --list");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u + 3u + 2u) << r.out;
  EXPECT_EQ(lines[0], "| system | task | placement | length | policy | n | correct | partial | distractor | absent |");
  EXPECT_EQ(lines[2], "| a.gguf | niah_single | after | 2048 | full | 1 | 0 | 1 | 0 | 0 |");
  EXPECT_EQ(lines[3], "| b.gguf | niah_single | after | 2048 | full | 1 | 1 | 0 | 0 | 0 |");
  EXPECT_EQ(lines[4], "| m @ http://h:8080 | niah_single | after | 2048 | full | 1 | 0 | 0 | 0 | 1 |");
  EXPECT_EQ(lines[5], "a.gguf: niah_single full L2048 after depth 50 seed 0: partial, expected ['4516832'], output '451'");
  EXPECT_EQ(lines[6], "m @ http://h:8080: niah_single full L2048 after depth 50 seed 0: absent, expected ['4516832'], "
                      "output 'no'");
}

TEST(EvalFailures, BadInputIsOneLine) {
  const ToolRun missing = run_tool("/nonexistent/records.jsonl");
  EXPECT_NE(missing.status, 0);
  EXPECT_EQ(missing.out, "eval_failures.py: /nonexistent/records.jsonl: cannot read it (No such file or directory)\n");

  const std::string bad = ::testing::TempDir() + "eval_failures_bad.jsonl";
  {
    std::ofstream f(bad);
    f << "{\"task\": \"niah_single\"}\n";
  }
  const ToolRun not_record = run_tool(bad);
  EXPECT_NE(not_record.status, 0);
  EXPECT_EQ(not_record.out, "eval_failures.py: " + bad + ":1: not an eval run record (field 'placement' missing or "
                            "of the wrong type)\n");
  {
    std::ofstream f(bad);
    f << "\n{not json\n";
  }
  const ToolRun not_json = run_tool(bad);
  EXPECT_NE(not_json.status, 0);
  EXPECT_EQ(lines_of(not_json.out).size(), 1u) << not_json.out;
  EXPECT_EQ(not_json.out.rfind("eval_failures.py: " + bad + ":2: not JSON (", 0), 0u) << not_json.out;
}

// --- tools/eval_pairs.py: two values of one parameter on the same prompts --------------------

// One record line: the fields eval_pairs.py reads.
std::string pair_record(const std::string& sha, const std::string& pooling, bool correct, const std::string& output,
                        int depth, const std::string& model = "a.gguf", int budget = 256) {
  const std::string b = std::to_string(budget);
  const std::string policy = pooling.empty() ? R"({"name": "full"})"
                                             : R"({"name": "snapkv", "budget": )" + b + R"(, "pooling": ")" + pooling + R"("})";
  const std::string label =
      pooling.empty() ? "full" : "snapkv budget=" + b + " window=32 kernel=31 pooling=" + pooling + " gqa=mean";
  return R"({"task": "niah_single", "placement": "after", "length": 4096, "depth": )" + std::to_string(depth) +
         R"(, "seed": 0, "prompt_sha256": ")" + sha + R"(", "policy": )" + policy + R"(, "policy_label": ")" + label +
         R"(", "correct": )" + (correct ? "true" : "false") + R"(, "output": ")" + output +
         R"(", "backend": "engine", "model_file": ")" + model + "\"}\n";
}

// Pairs are the same prompt, placement, system and policy but the parameter; unpaired records,
// policies without the parameter (full) and other systems' records stay out; a rerun counts
// once (the last one read); the total carries the exact sign test over the discordant pairs.
TEST(EvalPairs, PairsTheSamePromptOnly) {
  const std::string path = ::testing::TempDir() + "eval_pairs.jsonl";
  {
    std::ofstream f(path);
    f << pair_record("p1", "avg", true, "1234567", 25) << pair_record("p1", "max", false, "12", 25)  // avg only
      << pair_record("p2", "avg", true, "7654321", 75) << pair_record("p2", "max", true, "7654321", 75)
      << pair_record("p3", "max", true, "1", 50) << pair_record("p3", "max", false, "rerun", 50)  // last wins
      << pair_record("p3", "avg", true, "1", 50)                                                  // avg only
      << pair_record("p4", "avg", true, "x", 0)                                                   // unpaired
      << pair_record("p1", "", true, "1234567", 25)                                               // full
      << pair_record("p1", "max", true, "1234567", 25, "b.gguf")                                  // no a.gguf twin
      << pair_record("p5", "avg", false, "no", 0, "a.gguf", 1024) << pair_record("p5", "max", true, "9", 0, "a.gguf", 1024);
  }
  const ToolRun r = run_script("eval_pairs.py", path + " --param pooling --a avg --b max --list");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u + 2u + 1u + 3u) << r.out;
  EXPECT_EQ(lines[0], "| task | placement | length | policy (without pooling) | pairs | avg correct | max correct | "
                      "avg only | max only |");
  EXPECT_EQ(lines[2], "| niah_single | after | 4096 | snapkv budget=1024 window=32 kernel=31 gqa=mean | 1 | 0 | 1 | 0 | 1 |");
  EXPECT_EQ(lines[3], "| niah_single | after | 4096 | snapkv budget=256 window=32 kernel=31 gqa=mean | 3 | 3 | 1 | 2 | 0 |");
  // 3 discordant pairs split 2:1: p = 2 * (C(3,0) + C(3,1)) / 2^3 = 1 (capped).
  EXPECT_EQ(lines[4], "total: 4 pairs; pooling=avg 3/4, pooling=max 2/4; right with avg only 2, with max only 1; "
                      "exact two-sided sign test p = 1");
  EXPECT_EQ(lines[5], "niah_single snapkv budget=1024 window=32 kernel=31 gqa=mean L4096 after depth 0 seed 0: right "
                      "with pooling=max only; the other answered 'no'");
  EXPECT_EQ(lines[6], "niah_single snapkv budget=256 window=32 kernel=31 gqa=mean L4096 after depth 25 seed 0: right "
                      "with pooling=avg only; the other answered '12'");
  EXPECT_EQ(lines[7], "niah_single snapkv budget=256 window=32 kernel=31 gqa=mean L4096 after depth 50 seed 0: right "
                      "with pooling=avg only; the other answered 'rerun'");

  // With the full record of p1 as the reference: avg answers 1234567 as full does, max 12.
  const ToolRun ref = run_script("eval_pairs.py", path + " --param pooling --a avg --b max --reference full");
  ASSERT_EQ(ref.status, 0) << ref.out;
  const auto rl = lines_of(ref.out);
  ASSERT_EQ(rl.size(), 2u + 2u + 2u) << ref.out;
  EXPECT_EQ(rl[0], lines[0] + " with full | avg as full | max as full |");
  EXPECT_EQ(rl[2], lines[2] + " 0 | 0 | 0 |");
  EXPECT_EQ(rl[3], lines[3] + " 1 | 1 | 0 |");
  EXPECT_EQ(rl[5], "answers as full (the first number of the output), of 1 pairs with a full record: pooling=avg 1, "
                   "pooling=max 0");

  // Eight discordant pairs all one way: p = 2 / 2^8.
  {
    std::ofstream f(path);
    for (int i = 0; i < 8; ++i)
      f << pair_record("q" + std::to_string(i), "avg", true, "1", i) << pair_record("q" + std::to_string(i), "max", false, "0", i);
  }
  const ToolRun eight = run_script("eval_pairs.py", path + " --param pooling --a avg --b max");
  ASSERT_EQ(eight.status, 0) << eight.out;
  EXPECT_NE(eight.out.find("right with avg only 8, with max only 0; exact two-sided sign test p = 0.0078\n"),
            std::string::npos)
      << eight.out;
}

TEST(EvalPairs, BadInputIsOneLine) {
  const ToolRun missing = run_script("eval_pairs.py", "/nonexistent/r.jsonl --param pooling --a avg --b max");
  EXPECT_NE(missing.status, 0);
  EXPECT_EQ(missing.out, "eval_pairs.py: /nonexistent/r.jsonl: cannot read it (No such file or directory)\n");
  const std::string bad = ::testing::TempDir() + "eval_pairs_bad.jsonl";
  {
    std::ofstream f(bad);
    f << R"({"policy": {"pooling": "avg"}, "task": "niah_single"})" << "\n";
  }
  const ToolRun not_record = run_script("eval_pairs.py", bad + " --param pooling --a avg --b max");
  EXPECT_NE(not_record.status, 0);
  EXPECT_EQ(not_record.out, "eval_pairs.py: " + bad + ":1: not an eval run record (field 'prompt_sha256' missing or "
                            "of the wrong type)\n");
}

}  // namespace
