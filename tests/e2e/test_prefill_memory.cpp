// Prefill memory: generate chooses layer-wise prefill by itself for a compressing policy when
// that peaks lower (same kept positions and tokens as chunked prefill, a lower KV pool peak,
// reported in GenerateStats); a prompt within the budget or context-only compression keeps
// chunked prefill; the activation scratch is sized by the prefill chunk, not the prompt.
#include <gtest/gtest.h>

#include <vector>

#include "coordinator/engine/generate.h"
#include "tests/worker/tiny_checkpoint.h"
#include "worker/model/llama.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

class PrefillMemory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new snap::testing::TempDir("prefmem");
    ASSERT_TRUE(snap::testing::make_tiny_checkpoint(dir_->path(), "--arch llama --heads 8 --kv-heads 2 --layers 4 --seed 11"));
    auto m = load_model(*dir_ / "model.gguf");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = new LoadedModel(std::move(m).value());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  static std::vector<int32_t> prompt(int64_t n) {
    std::vector<int32_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(3 + (i * 37 + i / 5) % 250);
    return ids;
  }
  struct Out {
    std::vector<int32_t> tokens;
    std::vector<std::vector<int32_t>> kept;  // [layer * kv_heads + head]
    GenerateStats stats;
  };
  static Out run(const std::vector<int32_t>& ids, KvPolicyKind kind, bool auto_layerwise, int64_t chunk = 32,
                 int64_t context_tokens = 0) {
    LlamaForward fwd(*model_);
    GenerateRequest req;
    req.prompt_ids = ids;
    req.max_tokens = 6;
    req.prefill_chunk = chunk;
    req.kv_policy.kind = kind;
    req.kv_policy.budget = 32;
    req.kv_policy.window = 8;
    req.kv_policy.kernel = 5;
    req.kv_policy.context_tokens = context_tokens;
    req.auto_layerwise = auto_layerwise;
    Out out;
    GenerateHooks hooks;
    hooks.on_prefilled = [&](const PagedKvCache& cache) {
      for (int l = 0; l < model_->config.num_layers; ++l)
        for (int g = 0; g < model_->config.num_kv_heads; ++g) out.kept.push_back(cache.positions(l, g));
    };
    auto r = generate(fwd, req, hooks);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) {
      out.tokens = r->tokens;
      out.stats = r->stats;
    }
    return out;
  }
  static snap::testing::TempDir* dir_;
  static LoadedModel* model_;
};
snap::testing::TempDir* PrefillMemory::dir_ = nullptr;
LoadedModel* PrefillMemory::model_ = nullptr;

TEST_F(PrefillMemory, CompressingPoliciesChooseLayerwiseWhenItPeaksLower) {
  const auto ids = prompt(400);
  for (KvPolicyKind kind : {KvPolicyKind::snapkv, KvPolicyKind::pyramidkv, KvPolicyKind::h2o, KvPolicyKind::streaming}) {
    const Out chunked = run(ids, kind, false);
    const Out chosen = run(ids, kind, true);
    EXPECT_FALSE(chunked.stats.layerwise) << kv_policy_name(kind);
    EXPECT_TRUE(chosen.stats.layerwise) << kv_policy_name(kind);
    EXPECT_EQ(chosen.kept, chunked.kept) << kv_policy_name(kind);
    EXPECT_EQ(chosen.tokens, chunked.tokens) << kv_policy_name(kind);
    // 4 layers: one layer's 400 tokens + three of ~32, against four of 400.
    EXPECT_LT(chosen.stats.kv_pool_peak_bytes * 2, chunked.stats.kv_pool_peak_bytes) << kv_policy_name(kind);
  }
}

TEST_F(PrefillMemory, ShortPromptsFullAndContextOnlyKeepChunkedPrefill) {
  EXPECT_FALSE(run(prompt(30), KvPolicyKind::snapkv, true).stats.layerwise) << "prompt within the budget";
  EXPECT_FALSE(run(prompt(400), KvPolicyKind::full, true).stats.layerwise);
  EXPECT_FALSE(run(prompt(400), KvPolicyKind::snapkv, true, 32, 300).stats.layerwise) << "context-only";
}

TEST_F(PrefillMemory, ScratchFollowsTheChunkNotThePrompt) {
  const Out small = run(prompt(400), KvPolicyKind::full, true, 16);
  const Out large = run(prompt(400), KvPolicyKind::full, true, 128);
  const Out longer = run(prompt(800), KvPolicyKind::full, true, 16);
  EXPECT_GT(small.stats.scratch_peak_bytes, 0);
  EXPECT_LT(small.stats.scratch_peak_bytes * 4, large.stats.scratch_peak_bytes);
  EXPECT_EQ(longer.stats.scratch_peak_bytes, small.stats.scratch_peak_bytes) << "twice the prompt, same chunk";
}

}  // namespace
}  // namespace snap
