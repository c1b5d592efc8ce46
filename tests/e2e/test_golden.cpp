// The forward pass against independent references: golden logits and greedy
// continuations from Hugging Face transformers (tools/gen_golden.py, cross-checked with
// the numpy reference tools/reference_llama.py) for the default SmolLM2 GGUF and for tiny
// random checkpoints, which must also give identical logits from their GGUF and
// safetensors forms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/engine/generate.h"
#include "worker/model/llama.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// f32 logits computed in a different summation order than PyTorch's: the numpy and
// transformers references differ by 8.6e-5 on SmolLM2; we allow 2e-3 absolute on logits of
// magnitude up to ~35 (6e-5 relative).
constexpr double k_smollm2_tol = 2e-3;
constexpr double k_tiny_tol = 1e-4;

json load_json(const std::string& rel) {
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(in) << rel;
  return json::parse(in);
}

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Logits of every position of ids: [ids.size(), vocab], through the generation path.
std::vector<float> all_logits(const LoadedModel& m, const std::vector<int32_t>& ids, int64_t chunk) {
  LlamaForward fwd(m);
  const int64_t vocab = m.config.vocab_size;
  std::vector<float> out(ids.size() * vocab);
  GenerateRequest req;
  req.prompt_ids = ids;
  req.max_tokens = 0;
  req.prefill_chunk = chunk;
  GenerateHooks hooks;
  hooks.on_prompt_logits = [&](int64_t p, const float* row) { std::copy_n(row, vocab, out.data() + p * vocab); };
  auto r = generate(fwd, req, hooks);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return out;
}

std::vector<int32_t> greedy(const LoadedModel& m, const std::vector<int32_t>& ids, int64_t n) {
  LlamaForward fwd(m);
  GenerateRequest req;
  req.prompt_ids = ids;
  req.max_tokens = n;  // no stop ids: the references do not stop at EOS
  auto r = generate(fwd, req);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

class SmolLM2Golden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fs::exists(model_path())) << "default model missing: " << model_path();
    auto m = load_model(model_path());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = new LoadedModel(std::move(m).value());
  }
  static void TearDownTestSuite() { delete model_; }
  static LoadedModel* model_;
};
LoadedModel* SmolLM2Golden::model_ = nullptr;

TEST_F(SmolLM2Golden, LogitsMatchTransformersAtEveryPromptPosition) {
  const json g = load_json("tests/fixtures/golden/smollm2_q4_1.json");
  const auto fixed_ids = g["fixed_ids"].get<std::vector<int32_t>>();
  const int64_t vocab = model_->config.vocab_size;
  for (const json& prompt : g["prompts"]) {
    const auto ids = prompt["ids"].get<std::vector<int32_t>>();
    // chunk 16 also exercises prefill across chunk boundaries against the KV cache
    const std::vector<float> logits = all_logits(*model_, ids, 16);
    double max_diff = 0;
    int argmax_mismatch = 0;
    ASSERT_EQ(prompt["positions"].size(), ids.size());
    for (size_t p = 0; p < ids.size(); ++p) {
      const json& pos = prompt["positions"][p];
      const float* row = logits.data() + p * vocab;
      auto check = [&](int32_t id, double want) {
        const double got = row[id];
        ASSERT_FALSE(std::isnan(got)) << "NaN at position " << p << " id " << id;
        const double d = std::fabs(got - want);
        max_diff = std::max(max_diff, d);
        EXPECT_LE(d, k_smollm2_tol) << prompt["name"] << " position " << p << " id " << id << ": got " << got
                                    << ", transformers " << want;
      };
      const auto top_ids = pos["top_ids"].get<std::vector<int32_t>>();
      const auto top_logits = pos["top_logits"].get<std::vector<double>>();
      for (size_t i = 0; i < top_ids.size(); ++i) check(top_ids[i], top_logits[i]);
      const auto fixed = pos["fixed_logits"].get<std::vector<double>>();
      for (size_t i = 0; i < fixed_ids.size(); ++i) check(fixed_ids[i], fixed[i]);
      const int32_t our_argmax = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      if (our_argmax != top_ids[0] && top_logits[0] - top_logits[1] > 2 * k_smollm2_tol) ++argmax_mismatch;
    }
    EXPECT_EQ(argmax_mismatch, 0) << prompt["name"];
    std::printf("%s: %zu positions, max |logit - transformers| = %.3g\n",
                prompt["name"].get<std::string>().c_str(), ids.size(), max_diff);
  }
}

TEST_F(SmolLM2Golden, GreedyContinuationMatchesTransformersFor32Tokens) {
  const json g = load_json("tests/fixtures/golden/smollm2_q4_1.json");
  for (const json& prompt : g["prompts"]) {
    const auto ids = prompt["ids"].get<std::vector<int32_t>>();
    const auto want = prompt["greedy"].get<std::vector<int32_t>>();
    ASSERT_EQ(want.size(), 32u);
    EXPECT_EQ(greedy(*model_, ids, 32), want) << prompt["name"];
  }
}

// --- tiny random checkpoints ---------------------------------------------------------

// Writes the fixture's checkpoint (its make_tiny_checkpoint.py command, plus `extra` arguments)
// into a fresh `dir`.
void write_checkpoint(const json& g, const fs::path& dir, const std::string& extra) {
  fs::remove_all(dir);
  std::string cmd = g["checkpoint"]["command"].get<std::string>();
  cmd.replace(cmd.find("<DIR>"), 5, dir.string());
  cmd = "cd " + std::string(SNAP_SOURCE_DIR) + " && " + cmd + extra + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// The largest |logit - transformers| over the fixture's recorded positions; `logits` holds
// every position's row.
double max_diff_to_golden(const json& g, const std::vector<float>& logits, int64_t vocab) {
  const auto positions = g["positions"].get<std::vector<int64_t>>();
  double max_diff = 0;
  for (size_t j = 0; j < positions.size(); ++j) {
    const auto want = g["logits"][j].get<std::vector<double>>();
    EXPECT_EQ(static_cast<int64_t>(want.size()), vocab);
    for (int64_t v = 0; v < vocab && v < static_cast<int64_t>(want.size()); ++v) {
      const double got = logits[positions[j] * vocab + v];
      if (std::isnan(got)) return std::numeric_limits<double>::infinity();
      max_diff = std::max(max_diff, std::fabs(got - want[v]));
    }
  }
  return max_diff;
}

class TinyGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyGolden, GgufAndSafetensorsMatchTransformers) {
  const json g = load_json("tests/fixtures/golden/tiny_" + GetParam() + ".json");
  const fs::path dir = fs::temp_directory_path() / ("snap_tiny_" + GetParam() + "_" + std::to_string(::getpid()));
  write_checkpoint(g, dir, "");
  if (HasFatalFailure()) return;

  auto hf = load_model((dir / "hf").string());
  ASSERT_TRUE(hf.ok()) << hf.status().to_string();
  auto gg = load_model((dir / "model.gguf").string());
  ASSERT_TRUE(gg.ok()) << gg.status().to_string();
  fs::remove_all(dir);

  const auto ids = g["ids"].get<std::vector<int32_t>>();
  const std::vector<float> a = all_logits(*hf, ids, 7);
  const std::vector<float> b = all_logits(*gg, ids, 7);
  ASSERT_EQ(a.size(), b.size());
  // Same weights after the GGUF Q/K un-permutation, same arithmetic: bit-identical.
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
      << "GGUF and safetensors forms disagree";
  // One prefill chunk instead of several: other kernels paths, same numbers to rounding.
  const std::vector<float> c = all_logits(*hf, ids, 1000);
  double chunk_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) chunk_diff = std::max(chunk_diff, double(std::fabs(a[i] - c[i])));
  EXPECT_LE(chunk_diff, k_tiny_tol) << "chunked and one-shot prefill disagree";

  const double max_diff = max_diff_to_golden(g, a, hf->config.vocab_size);
  EXPECT_LE(max_diff, k_tiny_tol) << GetParam();
  EXPECT_EQ(greedy(*hf, ids, g["num_greedy"].get<int64_t>()), g["greedy"].get<std::vector<int32_t>>());
  EXPECT_EQ(greedy(*gg, ids, g["num_greedy"].get<int64_t>()), g["greedy"].get<std::vector<int32_t>>());
  std::printf("tiny %s: max |logit - transformers| = %.3g\n", GetParam().c_str(), max_diff);
}

// Gemma3ForConditionalGeneration (the 4B-27B checkpoints' form): the same tiny Gemma 3 with its
// config under text_config, its tensors under language_model.model. and two vision tensors
// beside them. Its text model is the Gemma3ForCausalLM one: bit-identical logits to the GGUF,
// so within the golden's bound of transformers.
TEST(TinyGoldenGemma3, VisionLanguageFormServesItsTextModel) {
  const json g = load_json("tests/fixtures/golden/tiny_gemma3_swa.json");
  const fs::path dir = fs::temp_directory_path() / ("snap_tiny_gemma3_vl_" + std::to_string(::getpid()));
  write_checkpoint(g, dir, " --vision-language");
  if (HasFatalFailure()) return;
  auto vl = load_model((dir / "hf").string());
  ASSERT_TRUE(vl.ok()) << vl.status().to_string();
  auto gg = load_model((dir / "model.gguf").string());
  ASSERT_TRUE(gg.ok()) << gg.status().to_string();
  fs::remove_all(dir);
  EXPECT_EQ(vl->config.sliding_window_pattern, 2);
  EXPECT_TRUE(vl->config.layer_is_local(2));

  const auto ids = g["ids"].get<std::vector<int32_t>>();
  const std::vector<float> a = all_logits(*vl, ids, 7);
  const std::vector<float> b = all_logits(*gg, ids, 7);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
      << "the vision-language form's text model and the GGUF disagree";
  EXPECT_LE(max_diff_to_golden(g, a, vl->config.vocab_size), k_tiny_tol);
  EXPECT_EQ(greedy(*vl, ids, g["num_greedy"].get<int64_t>()), g["greedy"].get<std::vector<int32_t>>());
}

INSTANTIATE_TEST_SUITE_P(Configs, TinyGolden,
                         ::testing::Values("llama_untied", "qwen2_bias", "mistral_swa", "llama3_rope", "linear_rope",
                                           "head_dim", "gemma3_swa"));

}  // namespace
}  // namespace snap
