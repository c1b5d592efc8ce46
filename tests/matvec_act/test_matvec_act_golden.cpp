// The decode matvec modes (kernels/matvec_act.h) end to end against transformers: every
// position of the SmolLM2 golden prompts (tests/fixtures/golden/smollm2_q4_1.json) is computed
// through the matvec path (prefill in chunks of 4 tokens, below matmul_cpu's sgemm threshold of
// 8, so every q4_1 projection and the q8_0 LM head run the mode's kernel; test_golden's chunks
// of 16 take the sgemm path for most positions). f32act, q16x2act and q8x3act must stay within
// test_golden's tolerance (2e-3) at every checked logit, with the same argmax. q16act and q8act
// are measured (here: 6.7e-3 and 1.6, over the tolerance) and q16act's error must be below 1/50
// of q8act's (its activation step is 1/258 of q8act's), so a mode that does not switch fails;
// q16x2act's and q8x3act's (steps of 2^-31 and 2^-22 of max|x|) below 1/10 of q16act's.
// Exits 77 when the default model is absent (scripts/setup.sh fetches it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/engine/generate.h"
#include "kernels/matvec_act.h"
#include "worker/model/llama.h"
#include "worker/model/weights.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double k_tol = 2e-3;     // tests/e2e/test_golden.cpp's SmolLM2 tolerance, unchanged
constexpr int64_t k_chunk = 4;     // < k_matmul_gemm_min_tokens_quant (8): the matvec path

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

json golden() {
  std::ifstream in(std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/golden/smollm2_q4_1.json");
  EXPECT_TRUE(in);
  return json::parse(in);
}

struct Restore {
  kernels::MatvecAct saved = kernels::matvec_act();
  ~Restore() { kernels::matvec_act_set(saved); }
};

// Logits of every prompt position under `act`: [ids.size(), vocab].
std::vector<float> logits_with(const LoadedModel& m, const std::vector<int32_t>& ids, kernels::MatvecAct act) {
  const Restore restore;
  kernels::matvec_act_set(act);
  LlamaForward fwd(m);
  const int64_t vocab = m.config.vocab_size;
  std::vector<float> out(ids.size() * vocab);
  GenerateRequest req;
  req.prompt_ids = ids;
  req.max_tokens = 0;
  req.prefill_chunk = k_chunk;
  GenerateHooks hooks;
  hooks.on_prompt_logits = [&](int64_t p, const float* row) { std::copy_n(row, vocab, out.data() + p * vocab); };
  auto r = generate(fwd, req, hooks);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return out;
}

struct Diff {
  double max_diff = 0;  // over every top-k and fixed id of every position
  int argmax_mismatch = 0;
};

Diff compare(const json& prompt, const json& fixed_ids_json, const std::vector<float>& logits, int64_t vocab) {
  Diff d;
  const auto fixed_ids = fixed_ids_json.get<std::vector<int32_t>>();
  for (size_t p = 0; p < prompt["positions"].size(); ++p) {
    const json& pos = prompt["positions"][p];
    const float* row = logits.data() + p * vocab;
    const auto top_ids = pos["top_ids"].get<std::vector<int32_t>>();
    const auto top_logits = pos["top_logits"].get<std::vector<double>>();
    const auto fixed = pos["fixed_logits"].get<std::vector<double>>();
    for (size_t i = 0; i < top_ids.size(); ++i) d.max_diff = std::max(d.max_diff, std::fabs(row[top_ids[i]] - top_logits[i]));
    for (size_t i = 0; i < fixed_ids.size(); ++i) d.max_diff = std::max(d.max_diff, std::fabs(row[fixed_ids[i]] - fixed[i]));
    const auto argmax = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    if (argmax != top_ids[0] && top_logits[0] - top_logits[1] > 2 * k_tol) ++d.argmax_mismatch;
  }
  return d;
}

TEST(MatvecActGolden, EveryPositionThroughTheMatvecAgainstTransformers) {
  if (!fs::exists(model_path())) {
    std::printf("skipped: default model missing: %s\n", model_path().c_str());
    std::exit(77);
  }
  auto m = load_model(model_path());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const json g = golden();
  const int64_t vocab = m->config.vocab_size;
  for (const json& prompt : g["prompts"]) {
    const auto ids = prompt["ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(prompt["positions"].size(), ids.size());
    Diff by_mode[5];
    const kernels::MatvecAct modes[5] = {kernels::MatvecAct::f32, kernels::MatvecAct::q16, kernels::MatvecAct::q8,
                                         kernels::MatvecAct::q16x2, kernels::MatvecAct::q8x3};
    for (int i = 0; i < 5; ++i) {
      by_mode[i] = compare(prompt, g["fixed_ids"], logits_with(*m, ids, modes[i]), vocab);
      std::printf("%s %s: %zu positions via the matvec, max |logit - transformers| = %.3g, argmax mismatches %d\n",
                  prompt["name"].get<std::string>().c_str(), kernels::matvec_act_name(modes[i]), ids.size(),
                  by_mode[i].max_diff, by_mode[i].argmax_mismatch);
    }
    for (int i : {0, 3, 4}) {
      EXPECT_LE(by_mode[i].max_diff, k_tol) << prompt["name"] << " " << kernels::matvec_act_name(modes[i]);
      EXPECT_EQ(by_mode[i].argmax_mismatch, 0) << prompt["name"] << " " << kernels::matvec_act_name(modes[i]);
    }
    EXPECT_LT(by_mode[3].max_diff * 10, by_mode[1].max_diff) << prompt["name"] << ": q16x2act vs q16act";
    EXPECT_LT(by_mode[4].max_diff * 10, by_mode[1].max_diff) << prompt["name"] << ": q8x3act vs q16act";
    EXPECT_GT(by_mode[1].max_diff, by_mode[0].max_diff) << prompt["name"] << ": q16act no worse than f32act?";
    EXPECT_LT(by_mode[1].max_diff * 50, by_mode[2].max_diff) << prompt["name"] << ": q16act vs q8act";
  }
}

}  // namespace
}  // namespace snap
