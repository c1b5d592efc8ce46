// The `snapserve` binary as a user runs it: a factual chat prompt on the default model
// gives a sensible answer, --dump-logits writes a readable file, and every bad input
// (missing file, truncated model, bad flag) ends with one clear line and a non-zero exit.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/snapserve_binary.h"
#include "tests/worker/tiny_checkpoint.h"

namespace {

namespace fs = std::filesystem;

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the binary with args (a shell fragment), capturing stdout and stderr separately.
CliRun run(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("snap_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "out").string(), err = (dir / "err").string();
  const std::string cmd = snapserve_binary() + " " + args + " >" + out + " 2>" + err;
  const int rc = std::system(cmd.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path()
                                          << " (run scripts/setup.sh or set SNAP_MODEL)";
    tmp_ = fs::temp_directory_path() / ("snap_cli_files_" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }
  fs::path tmp_;
};

TEST_F(Cli, ChatAnswersTheCapitalOfFrance) {
  CliRun r = run("generate --model " + model_path() +
              " --chat --prompt 'What is the capital of France?' --max-tokens 24 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << "output: " << r.out;
  // The timing report a user reads.
  for (const char* key : {"prompt tokens", "prefill", "tok/s", "decode", "peak RSS"}) {
    EXPECT_NE(r.err.find(key), std::string::npos) << key << " missing from stderr: " << r.err;
  }
}

// The default model's q4_1 projections and q8_0 table requantized to q8_0 at load.
TEST_F(Cli, WeightsQuantizedAtLoadStillAnswer) {
  CliRun r = run("generate --model " + model_path() +
                 " --chat --prompt 'What is the capital of France?' --max-tokens 24 --threads 2 --weight-dtype q8_0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Paris"), std::string::npos) << "output: " << r.out;
  EXPECT_NE(r.err.find("projections q8_0, lm_head q8_0"), std::string::npos) << r.err;
}

TEST_F(Cli, SeededSamplingIsReproducible) {
  const std::string args = "generate --model " + model_path() +
                           " --prompt 'Once upon a time' --max-tokens 12 --temperature 0.9 --top-p 0.9 --seed 7";
  CliRun a = run(args), b = run(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
}

TEST_F(Cli, DumpLogitsWritesHeaderIdsAndRows) {
  const std::string dump = (tmp_ / "logits.bin").string();
  CliRun r = run("generate --model " + model_path() + " --prompt 'Hello world' --max-tokens 1 --dump-logits " + dump);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dump, std::ios::binary);
  ASSERT_TRUE(in);
  char magic[8];
  uint32_t version = 0, dtype = 9;
  int64_t n = 0, vocab = 0;
  in.read(magic, 8).read(reinterpret_cast<char*>(&version), 4).read(reinterpret_cast<char*>(&dtype), 4);
  in.read(reinterpret_cast<char*>(&n), 8).read(reinterpret_cast<char*>(&vocab), 8);
  EXPECT_EQ(std::string(magic, 8), "SNAPLGT1");
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(dtype, 0u);
  EXPECT_EQ(vocab, 49152);
  ASSERT_GE(n, 2);  // "Hello world" is at least two tokens
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(dump)), 32 + 4 * n + 4 * n * vocab);
}

TEST_F(Cli, BadInputGivesOneLineErrorNamingTheProblem) {
  // A truncated copy of the real model and an empty file.
  const std::string truncated = (tmp_ / "truncated.gguf").string();
  {
    std::ifstream in(model_path(), std::ios::binary);
    std::string head(1 << 20, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(truncated, std::ios::binary).write(head.data(), static_cast<std::streamsize>(head.size()));
  }
  const std::string empty = (tmp_ / "empty.gguf").string();
  std::ofstream(empty).close();

  struct Case {
    std::string args;
    int exit_code;
    std::string must_contain;
  };
  const Case cases[] = {
      {"generate --model /nonexistent/model.gguf --prompt hi", 1, "/nonexistent/model.gguf"},
      {"generate --model " + truncated + " --prompt hi", 1, truncated},
      {"generate --model " + empty + " --prompt hi", 1, empty},
      {"generate --model /nonexistent_dir --prompt hi", 1, "/nonexistent_dir"},
      {"generate --model " + model_path() + " --prompt hi --max-tokens -3", 2, "max-tokens"},
      {"generate --model " + model_path() + " --prompt hi --temperature banana", 2, "temperature"},
      {"generate --model " + model_path() + " --prompt hi --no-such-flag", 2, "no-such-flag"},
      {"generate --model " + model_path(), 1, "--prompt"},
      {"generate --model " + model_path() + " --prompt hi --weight-dtype q4_k", 2, "weight-dtype"},
      {"generate --device cuda --weight-dtype f32 --prompt hi", 1, "--weight-dtype f32 is CPU-only"},
      {"serve --device cuda --weight-dtype f16", 1, "--weight-dtype f16 is CPU-only"},
      {"generate --prompt-file /nonexistent/prompt.txt", 2, "/nonexistent/prompt.txt"},
      {"inspect --model " + truncated, 1, truncated},
      {"frobnicate", 2, "frobnicate"},
  };
  for (const Case& c : cases) {
    CliRun r = run(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << c.args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(c.must_contain), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.find("CHECK failed"), std::string::npos) << c.args;
  }
}

TEST_F(Cli, InspectPrintsTheConfig) {
  CliRun r = run("inspect --model " + model_path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* key : {"llama", "layers             30", "9 / 3", "head_dim 64", "49152", "Q4_1"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing from: " << r.out;
  }
}

// Gemma 3 from a Hugging Face directory: which layers are local, their window and RoPE base,
// and the stop ids (config.json's and generation_config.json's).
TEST_F(Cli, InspectShowsGemma3LayerKindsAndStopIds) {
  snap::testing::TempDir dir("cli_gemma3");
  ASSERT_TRUE(snap::testing::make_tiny_checkpoint(
      dir.path(), "--arch gemma3 --tie --layers 4 --head-dim 32 --sliding-window 7 --sliding-window-pattern 2 "
                  "--rope-theta 1000000 --no-gguf"));
  snap::testing::write_file(dir / "hf/generation_config.json", R"({"eos_token_id": [5, 6]})");
  CliRun r = run("inspect --model " + (dir / "hf"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* key : {"architecture       gemma3", "(safetensors, ",
                          "layer kinds        2 local (window 7, rope theta 10000), 2 global (layers 1, 3)",
                          "tied embeddings    yes"}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing from: " << r.out;
  }
  const size_t stops = r.out.find("stop token ids     ");
  ASSERT_NE(stops, std::string::npos) << r.out;
  const std::string line = r.out.substr(stops, r.out.find('\n', stops) - stops);
  EXPECT_NE(line.find(", 5, 6"), std::string::npos) << line;  // after config.json's own eos id
}

}  // namespace
