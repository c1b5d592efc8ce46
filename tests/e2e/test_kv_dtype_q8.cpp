// q8_0 KV (int8 values, one f16 scale per 32 of a head's row) against f32 KV on the default
// SmolLM2 GGUF — its quality cost measured, not assumed: logits at every prompt position of
// the golden prompts (max difference to f32 KV and to transformers), greedy tokens (how many
// of 32 match f32 KV's, and where they first diverge), SnapKV's kept positions on the
// 702-token selection prompt against f32 KV's, and the bytes (68 per 64-value row: 0.27x of
// f32's 256, exact in the accounting). Prints the figures the README quotes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "coordinator/engine/generate.h"
#include "worker/model/llama.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Measured (this file's printout, 2026-12-01, AVX2): max |logit(q8_0 KV) − logit(f32 KV)| over
// the full vocabulary at every position of the two golden prompts 1.05 / 0.335 (f16: 0.036 /
// 0.013), against transformers 0.644 / 0.24; the argmax equals f32 KV's at 37 of 37 and 31 of
// 32 positions. q8_0 errs far more than f16 per value (half a step of amax/127 against 2^-11
// relative). The bounds leave ~2x room; see README "KV cache dtype".
constexpr double k_q8_vs_f32 = 2.0;
constexpr double k_q8_vs_transformers = 1.3;

json load_json(const std::string& rel) {
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(in) << rel;
  return json::parse(in);
}

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

class KvQ8SmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(model_path())) return;
    auto m = load_model(model_path());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = new LoadedModel(std::move(m).value());
  }
  static void TearDownTestSuite() { delete model_; }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "default model missing: " << model_path();
  }
  static LoadedModel* model_;

  struct Run {
    std::vector<float> prompt_logits;  // [n, vocab]
    std::vector<int32_t> tokens;
    std::vector<std::vector<std::vector<int32_t>>> kept;  // [layer][kv_head]
    GenerateStats stats;
  };
  static Run run(const std::vector<int32_t>& ids, DType dtype, int64_t max_tokens, const KvPolicy& policy = {},
                 bool all_logits = false, int64_t chunk = 16) {
    LlamaForward fwd(*model_);
    const int64_t vocab = model_->config.vocab_size;
    GenerateRequest req;
    req.prompt_ids = ids;
    req.max_tokens = max_tokens;
    req.prefill_chunk = chunk;  // later chunks attend over the q8_0 cache of the earlier ones
    req.kv_policy = policy;
    req.kv_dtype = dtype;
    Run out;
    GenerateHooks hooks;
    if (all_logits) {
      out.prompt_logits.resize(ids.size() * vocab);
      hooks.on_prompt_logits = [&](int64_t p, const float* row) {
        std::copy_n(row, vocab, out.prompt_logits.data() + p * vocab);
      };
    }
    hooks.on_prefilled = [&](const PagedKvCache& cache) {
      out.kept.resize(model_->config.num_layers);
      for (int l = 0; l < model_->config.num_layers; ++l)
        for (int g = 0; g < model_->config.num_kv_heads; ++g) out.kept[l].push_back(cache.positions(l, g));
    };
    auto r = generate(fwd, req, hooks);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) {
      out.tokens = r->tokens;
      out.stats = r->stats;
    }
    return out;
  }
};
LoadedModel* KvQ8SmolLM2::model_ = nullptr;

TEST_F(KvQ8SmolLM2, LogitsStayWithinTheBoundOfF32KvAndTransformers) {
  const json g = load_json("tests/fixtures/golden/smollm2_q4_1.json");
  const auto fixed_ids = g["fixed_ids"].get<std::vector<int32_t>>();
  const int64_t vocab = model_->config.vocab_size;
  for (const json& prompt : g["prompts"]) {
    const auto ids = prompt["ids"].get<std::vector<int32_t>>();
    const Run f32 = run(ids, DType::f32, 0, {}, true);
    const Run r = run(ids, DType::q8_0, 0, {}, true);
    ASSERT_EQ(r.prompt_logits.size(), f32.prompt_logits.size());
    double vs_f32 = 0, vs_hf = 0;
    int64_t argmax_same = 0;
    for (size_t i = 0; i < r.prompt_logits.size(); ++i) {
      ASSERT_FALSE(std::isnan(r.prompt_logits[i])) << "NaN at " << i;
      vs_f32 = std::max(vs_f32, std::fabs(double{r.prompt_logits[i]} - f32.prompt_logits[i]));
    }
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* row = r.prompt_logits.data() + p * vocab;
      const float* base = f32.prompt_logits.data() + p * vocab;
      argmax_same += std::max_element(row, row + vocab) - row == std::max_element(base, base + vocab) - base;
      const json& pos = prompt["positions"][p];
      const auto top_ids = pos["top_ids"].get<std::vector<int32_t>>();
      const auto top_logits = pos["top_logits"].get<std::vector<double>>();
      for (size_t i = 0; i < top_ids.size(); ++i) vs_hf = std::max(vs_hf, std::fabs(row[top_ids[i]] - top_logits[i]));
      const auto fixed = pos["fixed_logits"].get<std::vector<double>>();
      for (size_t i = 0; i < fixed_ids.size(); ++i) vs_hf = std::max(vs_hf, std::fabs(row[fixed_ids[i]] - fixed[i]));
    }
    const std::string name = prompt["name"].get<std::string>();
    std::printf("%s q8_0: max |logit - f32 KV| = %.3g over %zu positions x %lld, max |logit - transformers| = %.3g, "
                "argmax equal to f32 KV's at %lld of %zu positions\n",
                name.c_str(), vs_f32, ids.size(), static_cast<long long>(vocab), vs_hf,
                static_cast<long long>(argmax_same), ids.size());
    EXPECT_LE(vs_f32, k_q8_vs_f32) << name;
    EXPECT_LE(vs_hf, k_q8_vs_transformers) << name;
  }
}

TEST_F(KvQ8SmolLM2, GreedyTokensAgainstF32Kv) {
  const json g = load_json("tests/fixtures/golden/smollm2_q4_1.json");
  for (const json& prompt : g["prompts"]) {
    const auto ids = prompt["ids"].get<std::vector<int32_t>>();
    const auto want = prompt["greedy"].get<std::vector<int32_t>>();
    const Run f32 = run(ids, DType::f32, 32);
    ASSERT_EQ(f32.tokens, want) << prompt["name"];
    const Run q8 = run(ids, DType::q8_0, 32);
    ASSERT_EQ(q8.tokens.size(), want.size());
    size_t first_diff = want.size(), same = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      same += q8.tokens[i] == want[i];
      if (q8.tokens[i] != want[i] && first_diff == want.size()) first_diff = i;
    }
    std::printf("%s q8_0: %zu of %zu greedy tokens equal f32 KV's, first divergence at %s\n",
                prompt["name"].get<std::string>().c_str(), same, want.size(),
                first_diff == want.size() ? "none" : std::to_string(first_diff).c_str());
    EXPECT_EQ(q8.tokens, want) << prompt["name"];
  }
}

TEST_F(KvQ8SmolLM2, SnapKvSelectionAgainstF32Kv) {
  const json ref = load_json("tests/fixtures/kv_selection/smollm2_hf.json");
  const auto ids = ref["ids"].get<std::vector<int32_t>>();
  KvPolicy p;
  p.kind = KvPolicyKind::snapkv;
  p.budget = ref["budget"].get<int64_t>();
  p.window = ref["window"].get<int>();
  p.kernel = ref["kernel"].get<int>();
  // Chunks of 128 (6 for the 702 tokens): fewer forward passes than 16-token chunks.
  const Run f32 = run(ids, DType::f32, 1, p, false, 128);
  const Run r = run(ids, DType::q8_0, 1, p, false, 128);
  ASSERT_EQ(r.kept.size(), f32.kept.size());
  int64_t swapped = 0, differing_heads = 0, kept_total = 0, worst = 0;
  for (size_t l = 0; l < r.kept.size(); ++l) {
    for (size_t g = 0; g < r.kept[l].size(); ++g) {
      const std::set<int32_t> a(f32.kept[l][g].begin(), f32.kept[l][g].end());
      const std::set<int32_t> b(r.kept[l][g].begin(), r.kept[l][g].end());
      ASSERT_EQ(a.size(), b.size()) << "layer " << l << " head " << g;
      int64_t diff = 0;
      for (int32_t x : b) diff += a.count(x) ? 0 : 1;
      swapped += diff;
      differing_heads += diff > 0;
      worst = std::max(worst, diff);
      kept_total += static_cast<int64_t>(a.size());
    }
  }
  std::printf("SnapKV q8_0 vs f32 KV: %lld of %lld kept positions swapped, in %lld of %zu heads, at most %lld in one\n",
              static_cast<long long>(swapped), static_cast<long long>(kept_total),
              static_cast<long long>(differing_heads), r.kept.size() * r.kept[0].size(), static_cast<long long>(worst));
  // Measured: 187 of 11520 swapped (1.6%), in 45 of 90 heads, at most 14 of a head's 128
  // (f16: 10 in 3 heads) — swaps at the cut-off, never a block of positions.
  EXPECT_LE(worst, 24);
  EXPECT_LE(swapped * 25, kept_total);  // at most 4% overall
}

TEST_F(KvQ8SmolLM2, BytesAreRowsWithTheirScales) {
  const json g = load_json("tests/fixtures/golden/smollm2_q4_1.json");
  const auto ids = g["prompts"][0]["ids"].get<std::vector<int32_t>>();
  const Run f32 = run(ids, DType::f32, 4);
  const Run r = run(ids, DType::q8_0, 4);
  const int64_t bs = 16, hd = model_->config.head_dim;
  const int64_t row = hd + 2 * ((hd + 31) / 32);  // 68 for SmolLM2's 64
  // Blocks of the same count: K + V rows of `row` bytes instead of hd × 4, positions unchanged.
  EXPECT_EQ(r.stats.kv_resident_bytes * (2 * bs * hd * 4 + bs * 4), f32.stats.kv_resident_bytes * (2 * bs * row + bs * 4));
  EXPECT_EQ(r.stats.kv_stored_bytes * hd * 4, f32.stats.kv_stored_bytes * row);
  EXPECT_EQ(r.stats.kv_full_equivalent_bytes, r.stats.kv_resident_bytes);
  std::printf("q8_0 KV: %lld resident bytes vs f32 %lld (%.3fx)\n", static_cast<long long>(r.stats.kv_resident_bytes),
              static_cast<long long>(f32.stats.kv_resident_bytes),
              static_cast<double>(r.stats.kv_resident_bytes) / f32.stats.kv_resident_bytes);
}

}  // namespace
}  // namespace snap
