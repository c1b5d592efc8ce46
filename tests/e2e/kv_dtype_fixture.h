// Shared by the KV-dtype tests (test_kv_dtype: bf16/f16, test_kv_dtype_q8: q8_0): the default
// SmolLM2 GGUF loaded once per suite, a generate() run with a given KV dtype that records the
// prompt logits, the greedy tokens, the positions every (layer, KV head) kept after prefill and
// the KV byte figures, and the two comparisons both tests make against an f32-KV run: logits
// (against f32 KV over the whole vocabulary, and against transformers' golden top and fixed
// ids) and SnapKV selections (positions swapped per head).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "coordinator/engine/generate.h"
#include "worker/model/llama.h"
#include "worker/model/weights.h"

namespace snap::kv_dtype_test {

inline nlohmann::json load_json(const std::string& rel) {
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(in) << rel;
  return nlohmann::json::parse(in);
}

inline std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

struct KvRun {
  std::vector<float> prompt_logits;                     // [n, vocab] when asked for
  std::vector<int32_t> tokens;                          // greedy
  std::vector<std::vector<std::vector<int32_t>>> kept;  // [layer][kv_head] after prefill
  GenerateStats stats;
};

// Logits of a run against a base run (f32 KV) and against the golden fixture's prompt.
struct LogitDiff {
  double vs_base = 0;         // max |logit - base| over every position and the whole vocabulary
  double vs_transformers = 0; // max over the fixture's top ids and fixed ids
  int64_t argmax_same = 0;    // positions whose argmax equals the base's
  int64_t nans = 0;           // NaN logits in the run
};

// SnapKV's kept positions of a run against a base run.
struct SelectionDiff {
  int64_t swapped = 0;          // positions kept here but not in the base, over all heads
  int64_t differing_heads = 0;
  int64_t kept_total = 0;
  int64_t worst = 0;            // the most swapped in one head
  size_t heads = 0;
};

// A test suite over the default model; SetUp skips when the model file is absent.
class SmolLM2KvDtype : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    auto m = load_model(model_path());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = new LoadedModel(std::move(m).value());
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "default model missing: " << model_path();
  }
  static inline LoadedModel* model_ = nullptr;
  // Inside the fixture (and its TEST_F bodies) `Run` must name the record, not Test::Run().
  using Run = KvRun;

  // Prefill in chunks of `chunk` (later chunks attend over the cache the earlier ones wrote in
  // `dtype`), then max_tokens greedy tokens.
  static Run run(const std::vector<int32_t>& ids, DType dtype, int64_t max_tokens, const KvPolicy& policy = {},
                 bool all_logits = false, int64_t chunk = 16) {
    LlamaForward fwd(*model_);
    const int64_t vocab = model_->config.vocab_size;
    GenerateRequest req;
    req.prompt_ids = ids;
    req.max_tokens = max_tokens;
    req.prefill_chunk = chunk;
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

  // `prompt` is one entry of the golden fixture's "prompts", `fixed_ids` its "fixed_ids".
  static LogitDiff compare_logits(const Run& r, const Run& base, const nlohmann::json& prompt,
                                  const std::vector<int32_t>& fixed_ids) {
    const int64_t vocab = model_->config.vocab_size;
    LogitDiff d;
    EXPECT_EQ(r.prompt_logits.size(), base.prompt_logits.size());
    if (r.prompt_logits.size() != base.prompt_logits.size()) return d;
    for (size_t i = 0; i < r.prompt_logits.size(); ++i) {
      if (std::isnan(r.prompt_logits[i])) {
        ++d.nans;
        continue;
      }
      d.vs_base = std::max(d.vs_base, std::fabs(double{r.prompt_logits[i]} - base.prompt_logits[i]));
    }
    const size_t positions = r.prompt_logits.size() / vocab;
    for (size_t p = 0; p < positions; ++p) {
      const float* row = r.prompt_logits.data() + p * vocab;
      const float* b = base.prompt_logits.data() + p * vocab;
      d.argmax_same += std::max_element(row, row + vocab) - row == std::max_element(b, b + vocab) - b;
      const nlohmann::json& pos = prompt["positions"][p];
      const auto top_ids = pos["top_ids"].get<std::vector<int32_t>>();
      const auto top_logits = pos["top_logits"].get<std::vector<double>>();
      for (size_t i = 0; i < top_ids.size(); ++i)
        d.vs_transformers = std::max(d.vs_transformers, std::fabs(row[top_ids[i]] - top_logits[i]));
      const auto fixed = pos["fixed_logits"].get<std::vector<double>>();
      for (size_t i = 0; i < fixed_ids.size(); ++i)
        d.vs_transformers = std::max(d.vs_transformers, std::fabs(row[fixed_ids[i]] - fixed[i]));
    }
    return d;
  }

  // Every head must keep as many positions as the base's (a failure names the head).
  static SelectionDiff compare_kept(const Run& r, const Run& base) {
    SelectionDiff d;
    EXPECT_EQ(r.kept.size(), base.kept.size());
    for (size_t l = 0; l < std::min(r.kept.size(), base.kept.size()); ++l) {
      for (size_t g = 0; g < r.kept[l].size(); ++g) {
        const std::set<int32_t> a(base.kept[l][g].begin(), base.kept[l][g].end());
        const std::set<int32_t> b(r.kept[l][g].begin(), r.kept[l][g].end());
        EXPECT_EQ(a.size(), b.size()) << "layer " << l << " head " << g;
        int64_t diff = 0;
        for (int32_t x : b) diff += a.count(x) ? 0 : 1;
        d.swapped += diff;
        d.differing_heads += diff > 0;
        d.worst = std::max(d.worst, diff);
        d.kept_total += static_cast<int64_t>(a.size());
        ++d.heads;
      }
    }
    return d;
  }
};

}  // namespace snap::kv_dtype_test
