// Synthetic models at real shapes (tools/make_random_model.py): the llama3-8b shape has
// Llama-3-8B's exact parameter count and config, and small random models of two families
// (llama3 rope + GQA + bf16, qwen2 bias + tied + f16) load in `snapserve generate` from the
// directory the tool writes (config, safetensors, tokenizer) and give the numpy reference's
// prompt logits (tools/reference_llama.py on the same ids) and the same greedy choices.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/snapserve_binary.h"
#include "tests/worker/tiny_checkpoint.h"

namespace {

using nlohmann::json;

const std::string k_tool = std::string("python3 ") + SNAP_SOURCE_DIR + "/tools/make_random_model.py";

// Runs a shell command, returns its exit code (128 + signal when killed).
int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(RandomModel, Llama3_8bShapeIsTheRealOne) {
  snap::testing::TempDir dir("rm_dry");
  ASSERT_EQ(sh(k_tool + " --shape llama3-8b --dry-run >" + (dir / "dry.json")), 0);
  const json d = json::parse(slurp(dir / "dry.json"));
  // Meta-Llama-3-8B: 8,030,261,248 parameters (32 layers, untied 128256 x 4096 embeddings).
  EXPECT_EQ(d["parameters"].get<int64_t>(), int64_t{8030261248});
  EXPECT_EQ(d["weight_bytes"].get<int64_t>(), int64_t{8030261248} * 2);
  EXPECT_EQ(d["kv_bytes_per_token_bf16"].get<int64_t>(), 2 * 32 * 8 * 128 * 2);
  const json& c = d["config"];
  EXPECT_EQ(c["num_hidden_layers"], 32);
  EXPECT_EQ(c["hidden_size"], 4096);
  EXPECT_EQ(c["num_attention_heads"], 32);
  EXPECT_EQ(c["num_key_value_heads"], 8);
  EXPECT_EQ(c["intermediate_size"], 14336);
  EXPECT_EQ(c["vocab_size"], 128256);
  EXPECT_EQ(c["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(c["rope_theta"].get<double>(), 500000.0);
}

TEST(RandomModel, BadShapesGetOneLineErrors) {
  snap::testing::TempDir dir("rm_bad");
  const std::string err = dir / "err";
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : {Case{"--shape tiny-llama3 --heads 5 --dry-run", "--kv-heads"},
                        Case{"--shape tiny-llama3 --vocab 100 --dry-run", "--vocab"},
                        Case{"--shape tiny-llama3 --sliding-window 8 --dry-run", "--sliding-window"},
                        Case{"--shape tiny-llama3", "--out"},
                        Case{"--shape llama9", "llama9"}}) {
    EXPECT_NE(sh(k_tool + " " + c.args + " >/dev/null 2>" + err), 0) << c.args;
    const std::string e = slurp(err);
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.args << ": " << e;
  }
}

// A generate --dump-logits file: ids[n] and logits[n, vocab] (tools/read_logits.py).
struct Dump {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  int64_t vocab = 0;
};
Dump read_dump(const std::string& path) {
  const std::string b = slurp(path);
  Dump d;
  if (b.size() < 32 || b.compare(0, 8, "SNAPLGT1") != 0) {
    ADD_FAILURE() << path << ": not a logits dump";
    return d;
  }
  int64_t n = 0;
  std::memcpy(&n, b.data() + 16, 8);
  std::memcpy(&d.vocab, b.data() + 24, 8);
  if (b.size() != 32 + static_cast<size_t>(n) * 4 + static_cast<size_t>(n * d.vocab) * 4) {
    ADD_FAILURE() << path << ": truncated";
    return d;
  }
  d.ids.resize(static_cast<size_t>(n));
  d.logits.resize(static_cast<size_t>(n * d.vocab));
  std::memcpy(d.ids.data(), b.data() + 32, d.ids.size() * 4);
  std::memcpy(d.logits.data(), b.data() + 32 + d.ids.size() * 4, d.logits.size() * 4);
  return d;
}

struct Family {
  const char* name;
  const char* tool_args;
};

class RandomModelEngine : public ::testing::TestWithParam<Family> {};

TEST_P(RandomModelEngine, GenerateMatchesNumpyReference) {
  const Family f = GetParam();
  snap::testing::TempDir dir(std::string("rm_") + f.name);
  const std::string model = dir / "model";
  ASSERT_EQ(sh(k_tool + " " + f.tool_args + " --out " + model + " >/dev/null"), 0);
  const std::string prompt = "the cat sat on the mat, and then it ran into the garden at night";
  const std::string dump = dir / "logits.bin", out = dir / "out.txt";
  ASSERT_EQ(sh(snapserve_binary() + " generate --model " + model + " --prompt '" + prompt +
               "' --max-tokens 4 --ignore-eos --dump-logits " + dump + " >" + out + " 2>" + (dir / "err")),
            0)
      << slurp(dir / "err");
  const Dump d = read_dump(dump);
  ASSERT_GE(d.ids.size(), 10u) << "prompt tokenized to too few ids";
  std::string ids;
  for (int32_t id : d.ids) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(id);
  }
  const std::string ref = dir / "ref.json";
  ASSERT_EQ(sh("python3 " SNAP_SOURCE_DIR "/tools/reference_llama.py --model " + model + " --ids " + ids +
               " --top 5 --out " + ref + " >/dev/null"),
            0);
  const json r = json::parse(slurp(ref));
  ASSERT_EQ(r["positions"].size(), d.ids.size());
  // Both run f32 on the same (bf16/f16-exact) weights in different summation orders: on
  // logits of magnitude ~3, 1e-4 absolute is ~30x the observed difference.
  constexpr double k_tol = 1e-4;
  for (size_t t = 0; t < d.ids.size(); ++t) {
    const json& p = r["positions"][t];
    const float* row = d.logits.data() + t * d.vocab;
    for (size_t k = 0; k < p["top_ids"].size(); ++k) {
      const int64_t id = p["top_ids"][k].get<int64_t>();
      EXPECT_NEAR(row[id], p["top_logits"][k].get<double>(), k_tol) << f.name << " position " << t << " id " << id;
    }
    int64_t best = 0;
    for (int64_t v = 1; v < d.vocab; ++v)
      if (row[v] > row[best]) best = v;
    EXPECT_EQ(best, p["top_ids"][0].get<int64_t>()) << f.name << " greedy choice at position " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, RandomModelEngine,
                         ::testing::Values(Family{"llama3_bf16", "--shape tiny-llama3 --dtype bf16 --seed 3"},
                                           Family{"qwen2_f16", "--shape tiny-qwen2 --dtype f16 --seed 4"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
