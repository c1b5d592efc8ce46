// tools/eval_failures.py, which splits the wrong answers of `snapserve eval run` records into
// partial (the value's first 3+ digits, later ones lost), distractor (another needle's value)
// and absent, run on the committed fixture tests/eval_longctx/failures_fixture.jsonl: eleven
// hand-written records, each chosen for one rule of its classify() (the expected kind is in
// the comments below). Also: unreadable files and lines that are not records end it with one
// line and a non-zero exit, not a traceback.
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

// Runs the tool with these arguments (stderr folded into stdout).
ToolRun run_tool(const std::string& args) {
  const std::string cmd = std::string(SNAP_PYTHON) + " " + SNAP_SOURCE_DIR "/tools/eval_failures.py " + args + " 2>&1";
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

}  // namespace
