// 16-bit KV (bf16, f16) against f32 KV on the default SmolLM2 GGUF: logits at every prompt
// position of the golden prompts within a stated bound of f32 KV's (and of transformers'),
// the same 32 greedy tokens, and SnapKV keeping the same positions as with f32 KV on the
// 702-token selection prompt except for a few positions per head (swaps at the cut-off as
// the 16-bit rounding moves the window queries and keys; the scores themselves are not
// compared here). Prints the measured figures the README quotes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// Measured (this file's printout, 2026-12-01, AVX2 — the machine has no AVX-512): max |logit(16-bit KV) − logit(f32
// KV)| over the full vocabulary at every position of the two golden prompts was 0.18 / 0.081
// (bf16) and 0.036 / 0.013 (f16), on logits of magnitude up to ~35; against transformers'
// top and fixed ids 0.106 / 0.047 (bf16) and 0.028 / 0.0082 (f16) — above test_golden's
// 2e-3 for f32 KV, which is why f32 stays the default. The bounds leave ~2x room.
constexpr double k_bf16_vs_f32 = 0.4;
constexpr double k_f16_vs_f32 = 0.08;
constexpr double k_bf16_vs_transformers = 0.25;
constexpr double k_f16_vs_transformers = 0.06;

json load_json(const std::string& rel) {
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(in) << rel;
  return json::parse(in);
}

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

class KvDtypeSmolLM2 : public ::testing::Test {
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
                 bool all_logits = false) {
    LlamaForward fwd(*model_);
    const int64_t vocab = model_->config.vocab_size;
    GenerateRequest req;
    req.prompt_ids = ids;
    req.max_tokens = max_tokens;
    req.prefill_chunk = 16;  // prefill across chunk boundaries reads the 16-bit cache too
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
LoadedModel* KvDtypeSmolLM2::model_ = nullptr;

TEST_F(KvDtypeSmolLM2, LogitsStayWithinTheBoundOfF32KvAndTransformers) {
  const json g = load_json("tests/fixtures/golden/smollm2_q4_1.json");
  const auto fixed_ids = g["fixed_ids"].get<std::vector<int32_t>>();
  const int64_t vocab = model_->config.vocab_size;
  for (const json& prompt : g["prompts"]) {
    const auto ids = prompt["ids"].get<std::vector<int32_t>>();
    const Run f32 = run(ids, DType::f32, 0, {}, true);
    for (DType dtype : {DType::bf16, DType::f16}) {
      const Run r = run(ids, dtype, 0, {}, true);
      ASSERT_EQ(r.prompt_logits.size(), f32.prompt_logits.size());
      double vs_f32 = 0, vs_hf = 0;
      for (size_t i = 0; i < r.prompt_logits.size(); ++i) {
        ASSERT_FALSE(std::isnan(r.prompt_logits[i])) << dtype_name(dtype) << " NaN at " << i;
        vs_f32 = std::max(vs_f32, std::fabs(double{r.prompt_logits[i]} - f32.prompt_logits[i]));
      }
      for (size_t p = 0; p < ids.size(); ++p) {
        const json& pos = prompt["positions"][p];
        const float* row = r.prompt_logits.data() + p * vocab;
        const auto top_ids = pos["top_ids"].get<std::vector<int32_t>>();
        const auto top_logits = pos["top_logits"].get<std::vector<double>>();
        for (size_t i = 0; i < top_ids.size(); ++i) vs_hf = std::max(vs_hf, std::fabs(row[top_ids[i]] - top_logits[i]));
        const auto fixed = pos["fixed_logits"].get<std::vector<double>>();
        for (size_t i = 0; i < fixed_ids.size(); ++i) vs_hf = std::max(vs_hf, std::fabs(row[fixed_ids[i]] - fixed[i]));
      }
      const std::string name = prompt["name"].get<std::string>() + " " + dtype_name(dtype);
      std::printf("%s: max |logit - f32 KV| = %.3g over %zu positions x %lld, max |logit - transformers| = %.3g\n",
                  name.c_str(), vs_f32, ids.size(), static_cast<long long>(vocab), vs_hf);
      EXPECT_LE(vs_f32, dtype == DType::bf16 ? k_bf16_vs_f32 : k_f16_vs_f32) << name;
      EXPECT_LE(vs_hf, dtype == DType::bf16 ? k_bf16_vs_transformers : k_f16_vs_transformers) << name;
    }
  }
}

TEST_F(KvDtypeSmolLM2, GreedyTokensEqualF32KvAndTransformers) {
  const json g = load_json("tests/fixtures/golden/smollm2_q4_1.json");
  for (const json& prompt : g["prompts"]) {
    const auto ids = prompt["ids"].get<std::vector<int32_t>>();
    const auto want = prompt["greedy"].get<std::vector<int32_t>>();
    const Run f32 = run(ids, DType::f32, 32);
    EXPECT_EQ(f32.tokens, want) << prompt["name"];
    for (DType dtype : {DType::bf16, DType::f16}) {
      EXPECT_EQ(run(ids, dtype, 32).tokens, want) << prompt["name"] << " " << dtype_name(dtype);
    }
  }
}

TEST_F(KvDtypeSmolLM2, SnapKvSelectionEqualsF32KvExceptNearTies) {
  const json ref = load_json("tests/fixtures/kv_selection/smollm2_hf.json");
  const auto ids = ref["ids"].get<std::vector<int32_t>>();
  KvPolicy p;
  p.kind = KvPolicyKind::snapkv;
  p.budget = ref["budget"].get<int64_t>();
  p.window = ref["window"].get<int>();
  p.kernel = ref["kernel"].get<int>();
  const Run f32 = run(ids, DType::f32, 1, p);
  for (DType dtype : {DType::bf16, DType::f16}) {
    const Run r = run(ids, dtype, 1, p);
    ASSERT_EQ(r.kept.size(), f32.kept.size());
    int64_t swapped = 0, differing_heads = 0, kept_total = 0;
    for (size_t l = 0; l < r.kept.size(); ++l) {
      for (size_t g = 0; g < r.kept[l].size(); ++g) {
        const std::set<int32_t> a(f32.kept[l][g].begin(), f32.kept[l][g].end());
        const std::set<int32_t> b(r.kept[l][g].begin(), r.kept[l][g].end());
        ASSERT_EQ(a.size(), b.size()) << "layer " << l << " head " << g;
        int64_t diff = 0;
        for (int32_t x : b) diff += a.count(x) ? 0 : 1;
        swapped += diff;
        differing_heads += diff > 0;
        kept_total += static_cast<int64_t>(a.size());
        // Measured at most 6 (bf16) and 4 (f16) of 128 in a head: swaps at the cut-off, never
        // a block of positions.
        EXPECT_LE(diff, 12) << dtype_name(dtype) << " layer " << l << " head " << g;
      }
    }
    std::printf("SnapKV %s vs f32 KV: %lld of %lld kept positions swapped, in %lld of 90 heads\n", dtype_name(dtype),
                static_cast<long long>(swapped), static_cast<long long>(kept_total),
                static_cast<long long>(differing_heads));
    // Measured 67 (bf16, 19 heads) and 10 (f16, 3 heads) of 11520: bounds 1.2% and 0.25%.
    EXPECT_LE(swapped * (dtype == DType::bf16 ? 84 : 400), kept_total) << dtype_name(dtype);
  }
}

TEST_F(KvDtypeSmolLM2, SixteenBitHalvesTheKvBytes) {
  const json g = load_json("tests/fixtures/golden/smollm2_q4_1.json");
  const auto ids = g["prompts"][0]["ids"].get<std::vector<int32_t>>();
  const Run f32 = run(ids, DType::f32, 4);
  for (DType dtype : {DType::bf16, DType::f16}) {
    const Run r = run(ids, dtype, 4);
    const int64_t bs = 16, hd = model_->config.head_dim;
    // Blocks of the same count: K + V at 2 bytes instead of 4, positions unchanged.
    EXPECT_EQ(r.stats.kv_resident_bytes * (2 * bs * hd * 4 + bs * 4), f32.stats.kv_resident_bytes * (2 * bs * hd * 2 + bs * 4))
        << dtype_name(dtype);
    EXPECT_EQ(2 * r.stats.kv_stored_bytes, f32.stats.kv_stored_bytes) << dtype_name(dtype);
    EXPECT_EQ(r.stats.kv_full_equivalent_bytes, r.stats.kv_resident_bytes) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace snap
