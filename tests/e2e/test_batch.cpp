// `snapserve batch` as a user runs it, on the default model: every line gets exactly one
// record (bad lines an error record naming the line), a SIGKILL or a SIGTERM mid-run and a
// rerun give the same records as one uninterrupted run, shards + `batch merge` give them
// in input order, --truncate cuts long prompts from the side asked, --kv-policy applies to
// lines without kv_compression, and bad flags end with one line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/snapserve_binary.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int count_lines(const std::string& p) {
  int n = 0;
  for (char c : slurp(p)) n += c == '\n';
  return n;
}

struct BatchRun {
  int exit_code = -1;
  std::string err;
};

// Records of an output file by input line; fails the test on a duplicate or a bad line.
std::map<int64_t, json> records(const std::string& path) {
  std::map<int64_t, json> by_line;
  std::ifstream in(path);
  std::string text;
  while (std::getline(in, text)) {
    json j = json::parse(text, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << path << ": not JSON: " << text;
    if (j.is_discarded()) continue;
    const int64_t line = j.value("line", int64_t{-1});
    EXPECT_TRUE(by_line.emplace(line, j).second) << path << ": line " << line << " recorded twice";
  }
  return by_line;
}

json choices(const json& record) { return record["response"]["body"]["choices"]; }

class Batch : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path()
                                          << " (run scripts/setup.sh or set SNAP_MODEL)";
    dir_ = fs::temp_directory_path() / ("snap_batch_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // `snapserve batch ARGS` (a shell fragment) with --model; stderr captured.
  BatchRun run(const std::string& args) const {
    const std::string err = path("stderr");
    const std::string cmd = snapserve_binary() + " batch " + args + " --model " + model_path() +
                            " --threads 2 2>" + err;
    const int rc = std::system(cmd.c_str());
    BatchRun r;
    r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
    r.err = slurp(err);
    return r;
  }

  // Starts `snapserve batch ARGS` in the background; returns its pid.
  pid_t start(const std::string& args) const {
    const std::string cmd = "exec " + snapserve_binary() + " batch " + args + " --model " +
                            model_path() + " --threads 2 2>>" + path("bg.stderr");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  }

  static int wait_exit(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Waits until `file` has between 1 and total-1 lines; false if it never does.
  static bool wait_partway(const std::string& file, int total) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < end) {
      const int n = fs::exists(file) ? count_lines(file) : 0;
      if (n >= 1) return n < total;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // `n` lines alternating chat and completion, sampled (temperature 0.8, no seed: the
  // batch derives one from custom_id), 24 tokens each.
  std::string corpus(int n) const {
    const std::string p = path("corpus.jsonl");
    std::ofstream out(p);
    for (int k = 1; k <= n; ++k) {
      json body = {{"max_tokens", 24}, {"temperature", 0.8}, {"ignore_eos", true}};
      std::string url = "/v1/completions";
      if (k % 2) {
        body["messages"] = json::array({{{"role", "user"}, {"content", "Tell me one fact about the number " + std::to_string(k)}}});
        url = "/v1/chat/completions";
      } else {
        body["prompt"] = "Item " + std::to_string(k) + " on the list is";
      }
      out << json{{"custom_id", "doc-" + std::to_string(k)}, {"method", "POST"}, {"url", url}, {"body", body}}.dump() << "\n";
    }
    return p;
  }

  fs::path dir_;
};

TEST_F(Batch, EveryLineGetsOneRecordAndBadLinesNameTheirLine) {
  const std::string in = path("in.jsonl");
  {
    std::ofstream f(in);
    f << json{{"custom_id", "a"}, {"url", "/v1/chat/completions"},
              {"body", {{"model", "gpt-4o-mini"}, {"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
                        {"max_tokens", 12}, {"temperature", 0}}}}.dump()
      << "\n";
    f << R"({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "unterminated)" << "\n";
    f << "\n";  // blank: no record
    f << json{{"custom_id", "d"}, {"url", "/v1/completions"}, {"body", {{"prompt", "Hello"}, {"max_tokens", 0}}}}.dump() << "\n";
    f << json{{"custom_id", "e"}, {"url", "/v1/embeddings"}, {"body", {{"input", "x"}}}}.dump() << "\n";
    f << json{{"custom_id", "f"}, {"url", "/v1/completions"},
              {"body", {{"prompt", "The sky is"}, {"max_tokens", 4}, {"stream", true}, {"temperature", 0}}}}.dump()
      << "\n";
  }
  const std::string out = path("out.jsonl");
  BatchRun r = run("--input " + in + " --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("5 records written this run (3 errors"), std::string::npos) << r.err;
  auto recs = records(out);
  ASSERT_EQ(recs.size(), 5u);
  ASSERT_EQ(recs.count(3), 0u) << "a blank line gets no record";

  const json& a = recs[1];
  EXPECT_EQ(a["custom_id"], "a");
  EXPECT_TRUE(a["error"].is_null());
  EXPECT_EQ(a["response"]["status_code"], 200);
  EXPECT_EQ(a["response"]["body"]["object"], "chat.completion");
  EXPECT_NE(a["response"]["body"]["model"].get<std::string>().find("SmolLM2"), std::string::npos)
      << "the line's model is ignored; the record says which model ran";
  EXPECT_EQ(a["response"]["request_id"], a["response"]["body"]["id"]);
  EXPECT_NE(choices(a)[0]["message"]["content"].get<std::string>().find("Paris"), std::string::npos) << a.dump();

  for (const auto& [line, says] : std::map<int64_t, std::string>{
           {2, "not valid JSON"}, {4, "max_tokens must be at least 1"}, {5, "/v1/embeddings"}}) {
    const json& e = recs[line];
    ASSERT_FALSE(e["error"].is_null()) << e.dump();
    const std::string msg = e["error"]["message"];
    EXPECT_EQ(msg.rfind("line " + std::to_string(line) + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(says), std::string::npos) << msg;
    EXPECT_EQ(e["response"]["status_code"], 400);
    EXPECT_EQ(e["response"]["body"]["error"]["message"], msg);
  }
  EXPECT_EQ(recs[2]["custom_id"], nullptr) << "an unparseable line has no custom_id";
  EXPECT_EQ(recs[4]["custom_id"], "d");
  EXPECT_EQ(recs[6]["response"]["body"]["object"], "text_completion") << "\"stream\": true is ignored in a batch";

  const json progress = json::parse(slurp(out + ".progress"));
  EXPECT_EQ(progress["state"], "complete");
  EXPECT_EQ(progress["records_total"], 5);
  EXPECT_EQ(progress["records_done"], 5);
  EXPECT_EQ(progress["input_sha256"].get<std::string>().size(), 64u);

  // BatchRun again: nothing left to do, nothing written twice.
  BatchRun again = run("--input " + in + " --output " + out);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("0 records written this run"), std::string::npos) << again.err;
  EXPECT_EQ(records(out).size(), 5u);

  // The input changed under a started output: refused, output untouched.
  const std::string before = slurp(out);
  std::ofstream(in, std::ios::app) << json{{"custom_id", "g"}, {"url", "/v1/completions"}, {"body", {{"prompt", "x"}}}}.dump()
                                   << "\n";
  BatchRun changed = run("--input " + in + " --output " + out);
  EXPECT_EQ(changed.exit_code, 1);
  EXPECT_NE(changed.err.find("different input"), std::string::npos) << changed.err;
  EXPECT_EQ(slurp(out), before);
}

TEST_F(Batch, KillAndTermThenResumeEqualsOneRun) {
  const int n = 16;
  const std::string in = corpus(n);
  const std::string flags = " --max-num-seqs 2 --progress-interval 0.2";
  BatchRun ref = run("--input " + in + " --output " + path("ref.jsonl") + flags);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto want = records(path("ref.jsonl"));
  ASSERT_EQ(want.size(), static_cast<size_t>(n));

  // SIGKILL partway, then a partial record as a kill mid-write leaves it.
  const std::string killed = path("killed.jsonl");
  pid_t pid = start("--input " + in + " --output " + killed + flags);
  ASSERT_TRUE(wait_partway(killed, n)) << "the run finished before it could be killed";
  ::kill(pid, SIGKILL);
  EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
  const int kept = count_lines(killed);
  std::ofstream(killed, std::ios::app) << R"({"custom_id":"doc-9","error":null,"id":"batch_req_9","li)";
  BatchRun resumed = run("--input " + in + " --output " + killed + flags);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("a partial last line of"), std::string::npos) << resumed.err;
  EXPECT_NE(resumed.err.find(std::to_string(kept) + " were already there"), std::string::npos) << resumed.err;
  auto got = records(killed);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [line, rec] : want) {
    EXPECT_EQ(got[line]["custom_id"], rec["custom_id"]);
    EXPECT_EQ(choices(got[line]), choices(rec)) << "line " << line << " differs from the uninterrupted run";
  }

  // SIGTERM partway: running lines finish and are written, exit 1, progress says stopped.
  const std::string termed = path("termed.jsonl");
  pid = start("--input " + in + " --output " + termed + flags);
  ASSERT_TRUE(wait_partway(termed, n)) << "the run finished before SIGTERM";
  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 1);
  EXPECT_NE(slurp(path("bg.stderr")).find("run the same command again to resume"), std::string::npos)
      << slurp(path("bg.stderr"));
  EXPECT_EQ(json::parse(slurp(termed + ".progress"))["state"], "stopped");
  ASSERT_EQ(slurp(termed).back(), '\n') << "SIGTERM never leaves a partial line";
  BatchRun finished = run("--input " + in + " --output " + termed + flags);
  ASSERT_EQ(finished.exit_code, 0) << finished.err;
  got = records(termed);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [line, rec] : want) EXPECT_EQ(choices(got[line]), choices(rec)) << "line " << line;
}

TEST_F(Batch, ShardsAndMergeGiveInputOrder) {
  const int n = 7;
  const std::string in = corpus(n);
  const std::string flags = " --max-num-seqs 4";
  ASSERT_EQ(run("--input " + in + " --output " + path("one.jsonl") + flags).exit_code, 0);
  auto want = records(path("one.jsonl"));
  const std::string out = path("sharded.jsonl");
  for (int i = 0; i < 3; ++i) {
    BatchRun r = run("--input " + in + " --output " + out + " --shard " + std::to_string(i) + "/3" + flags);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const auto& [line, rec] : records(out + "." + std::to_string(i) + "-of-3")) {
      EXPECT_EQ((line - 1) % 3, i) << "shard " << i << " ran line " << line;
    }
  }
  // Shard 1 again, from the Slurm array variables (task 11 of --array=10-12): the file
  // was removed, so it runs its lines 2 and 5 again.
  fs::remove(out + ".1-of-3");
  fs::remove(out + ".1-of-3.progress");
  const std::string cmd = "SLURM_ARRAY_TASK_ID=11 SLURM_ARRAY_TASK_MIN=10 SLURM_ARRAY_TASK_COUNT=3 " +
                          snapserve_binary() + " batch --input " + in + " --output " + out +
                          " --model " + model_path() + flags + " 2>" + path("slurm.err");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(path("slurm.err"));
  EXPECT_NE(slurp(path("slurm.err")).find("shard 1/3: 2 records written this run"), std::string::npos)
      << slurp(path("slurm.err"));

  const std::string merge = snapserve_binary() + " batch merge --input " + in + " --output " + out +
                            " --shards 3 2>" + path("merge.err");
  ASSERT_EQ(std::system(merge.c_str()), 0) << slurp(path("merge.err"));
  std::ifstream merged(out);
  std::string text;
  int64_t expect_line = 1;
  while (std::getline(merged, text)) {
    const json j = json::parse(text);
    EXPECT_EQ(j["line"], expect_line);
    EXPECT_EQ(choices(j), choices(want[expect_line])) << "line " << expect_line;
    ++expect_line;
  }
  EXPECT_EQ(expect_line, n + 1);

  // A missing shard: merge refuses, naming it.
  fs::remove(out + ".2-of-3");
  const int rc = std::system(merge.c_str());
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(path("merge.err")).find("shard 2/3's output is missing"), std::string::npos) << slurp(path("merge.err"));
}

TEST_F(Batch, TruncateCutsTheSideAsked) {
  // A completion prompt of 400 token ids, and references holding exactly the first and
  // the last 120 of them (128 context - 8 max_tokens): right truncation must equal the
  // first, left the last. A chat line loses tokens from its longest message.
  std::vector<int> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(1000 + (i * 37) % 5000);
  std::string filler;
  for (int i = 0; i < 400; ++i) filler += "word ";
  const json chat = {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "BEGIN " + filler + "END"}}}},
                     {"max_tokens", 8},
                     {"temperature", 0}};
  auto line = [](const std::string& id, const std::string& url, const json& body) {
    return json{{"custom_id", id}, {"url", url}, {"body", body}}.dump() + "\n";
  };
  const std::string in = path("long.jsonl");
  std::ofstream(in) << line("ids", "/v1/completions", {{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0}})
                    << line("chat", "/v1/chat/completions", chat);
  const std::string refs = path("refs.jsonl");
  std::ofstream(refs) << line("first", "/v1/completions",
                              {{"prompt", std::vector<int>(ids.begin(), ids.begin() + 120)}, {"max_tokens", 8}, {"temperature", 0}})
                      << line("last", "/v1/completions",
                              {{"prompt", std::vector<int>(ids.end() - 120, ids.end())}, {"max_tokens", 8}, {"temperature", 0}});
  const std::string ctx = " --max-model-len 128";
  BatchRun ref = run("--input " + refs + " --output " + path("refs.out") + ctx);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto want = records(path("refs.out"));
  ASSERT_TRUE(want[1]["error"].is_null()) << want[1].dump();

  BatchRun plain = run("--input " + in + " --output " + path("plain.jsonl") + ctx);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  for (auto& [n, rec] : records(path("plain.jsonl"))) {
    ASSERT_FALSE(rec["error"].is_null()) << rec.dump();
    EXPECT_NE(rec["error"]["message"].get<std::string>().find("more than the limit of 127"), std::string::npos) << rec.dump();
  }
  for (const std::string side : {"left", "right"}) {
    const std::string out = path(side + ".jsonl");
    BatchRun r = run("--input " + in + " --output " + out + ctx + " --truncate " + side);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("2 truncated"), std::string::npos) << r.err;
    auto got = records(out);
    for (auto& [n, rec] : got) {
      ASSERT_TRUE(rec["error"].is_null()) << rec.dump();
      EXPECT_EQ(rec["truncated"]["side"], side);
      EXPECT_GE(rec["truncated"]["prompt_tokens_before"].get<int64_t>(), 400);
      const int64_t after = rec["truncated"]["prompt_tokens_after"];
      EXPECT_LE(after, 128 - 8);
      EXPECT_GE(after, 128 - 8 - 4) << "truncation keeps as much as fits";
      EXPECT_EQ(rec["response"]["body"]["usage"]["prompt_tokens"], after);
    }
    EXPECT_EQ(got[1]["truncated"]["prompt_tokens_after"], 120);
    EXPECT_EQ(choices(got[1]), choices(want[side == "right" ? 1 : 2])) << side << " truncation kept the wrong tokens";
  }
}

TEST_F(Batch, KvPolicyFlagAppliesToLinesWithoutOne) {
  const std::string in = path("kv.jsonl");
  std::string context;
  for (int i = 0; i < 30; ++i) context += "The keeper wrote in her log every evening about the wind and the ships. ";
  {
    std::ofstream f(in);
    f << json{{"custom_id", "own"}, {"url", "/v1/completions"},
              {"body", {{"prompt", context}, {"max_tokens", 4}, {"kv_compression", {{"policy", "streaming"}, {"budget", 64}}}}}}.dump()
      << "\n";
    f << json{{"custom_id", "default"}, {"url", "/v1/completions"}, {"body", {{"prompt", context}, {"max_tokens", 4}}}}.dump()
      << "\n";
  }
  const std::string out = path("kv.jsonl.out");
  BatchRun r = run("--input " + in + " --output " + out + " --kv-policy snapkv --kv-budget 64 --kv-window 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("saved"), std::string::npos) << "the summary reports the KV memory saved: " << r.err;
  auto recs = records(out);
  EXPECT_EQ(recs[1]["response"]["body"]["kv"]["policy"], "streaming");
  EXPECT_EQ(recs[2]["response"]["body"]["kv"]["policy"], "snapkv");
  EXPECT_GT(recs[2]["response"]["body"]["kv"]["compression_ratio"].get<double>(), 2.0);
}

// A line may ask for n choices of a list of prompts, as over HTTP: one record holds them all.
TEST_F(Batch, ChoicesAndPromptListsInOneRecord) {
  const std::string in = path("multi.jsonl");
  std::ofstream(in) << json{{"custom_id", "m"}, {"url", "/v1/completions"},
                            {"body", {{"prompt", {"Once upon a time", "The sky is"}}, {"n", 2}, {"max_tokens", 5},
                                      {"temperature", 0.7}, {"logprobs", 1}}}}.dump()
                    << "\n";
  const std::string out = path("multi.out");
  BatchRun r = run("--input " + in + " --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto recs = records(out);
  ASSERT_EQ(recs.size(), 1u);
  const json& body = recs[1]["response"]["body"];
  ASSERT_EQ(body["choices"].size(), 4u) << body.dump();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["logprobs"]["tokens"].size(), 5u);
  }
  EXPECT_EQ(body["usage"]["completion_tokens"], 20);
}

TEST_F(Batch, BadFlagsEndWithOneLine) {
  const std::string in = corpus(2);
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"--input " + in + " --output " + path("o") + " --shard 3/3", 1, "--shard index must be in [0, N)"},
      {"--input " + in + " --output " + in, 1, "--output is the --input file"},
      {"--input " + path("absent.jsonl") + " --output " + path("o"), 2, "File does not exist"},
      {"--input " + in + " --output " + path("o") + " --kv-policy snapkv --kv-kernel 4", 1, "must be odd"},
      {"--input " + in + " --output " + path("o") + " --truncate middle", 2, "--truncate"},
      {"--input " + in, 1, "--output FILE is required"},
  };
  for (const Case& k : cases) {
    BatchRun r = run(k.args);
    EXPECT_EQ(r.exit_code, k.code) << k.args << "\n" << r.err;
    EXPECT_NE(r.err.find(k.says), std::string::npos) << k.args << "\n" << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 1) << k.args << "\n" << r.err;
  }
  // An output that is not a batch output is never appended to.
  std::ofstream(path("notes.txt")) << "my notes\n";
  BatchRun r = run("--input " + in + " --output " + path("notes.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a snapserve batch record"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(path("notes.txt")), "my notes\n");
}

}  // namespace
