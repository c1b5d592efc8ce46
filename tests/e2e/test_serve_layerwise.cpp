// Automatic layer-wise prefill in `snapserve serve` (EngineConfig::auto_layerwise, the rule
// of coordinator/engine/prefill_choice.h): a ~1,500-token prompt with snapkv (budget 128) is
// admitted under a --kv-cache-mib that holds only its layer-wise peak and answers with
// kv.prefill = "layerwise_auto"; the same prompt with `full` is refused with the one-line
// peak error, and so is snapkv when the server is told --no-auto-layerwise; the tokens equal
// chunked prefill's (a server with room for it); an explicit layerwise says "layerwise" and
// a prompt within the budget stays "chunked".
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/snapserve_binary.h"
#include "tests/e2e/http_client.h"
#include "tests/e2e/server_process.h"

namespace snap {
namespace {

using nlohmann::json;
using snap::testing::post;
using snap::testing::Reply;

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// SmolLM2 with f32 KV: blocks of 16 tokens × 64 dims are 8,256 bytes; 30 layers × 3 KV heads.
// Chunked prefill of ~1,500 tokens holds 90 × ~94 blocks (~67 MiB); layer-wise (the engine's
// reservation: one layer full + every layer at twice the budget) 3 × 94 + 90 × 16 blocks
// (~14 MiB). 24 MiB (3,048 blocks) holds the second only.
constexpr int k_small_pool_mib = 24;
constexpr int k_large_pool_mib = 96;

std::unique_ptr<snap::testing::ServerProcess> start(int pool_mib, bool auto_layerwise) {
  std::vector<std::string> args = {snapserve_binary(), "serve", "--model", model_path(),
                                   "--port", "0", "--threads", "2", "--max-model-len", "2048",
                                   "--kv-cache-mib", std::to_string(pool_mib), "--shutdown-timeout", "2"};
  if (!auto_layerwise) args.push_back("--no-auto-layerwise");
  return std::make_unique<snap::testing::ServerProcess>(args);
}

std::string long_prompt() {
  std::string p;
  for (int i = 0; i < 60; ++i) {
    p += "Paragraph " + std::to_string(i) + ": the harbor town kept its lighthouse lit through every storm, and the "
         "keeper wrote the weather in a book. ";
  }
  return p + "The keeper's book recorded";
}

json body(const std::string& prompt, const json& kv) {
  return {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}, {"kv_compression", kv}};
}

const json k_snapkv = {{"policy", "snapkv"}, {"budget", 128}, {"window", 16}};

class ServeLayerwise : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_path())) GTEST_SKIP() << "default model missing: " << model_path();
  }
};

TEST_F(ServeLayerwise, SnapKvIsAdmittedUnderAPoolOnlyItsLayerwisePeakFits) {
  const std::string prompt = long_prompt();
  auto server = start(k_small_pool_mib, true);
  ASSERT_GT(server->port(), 0);
  const Reply r = post(server->port(), "/v1/completions", body(prompt, k_snapkv));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_GE(j["usage"]["prompt_tokens"].get<int64_t>(), 1200) << "the prompt must exceed what chunked prefill fits";
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(j["kv"]["prefill"], "layerwise_auto") << r.body;
  EXPECT_EQ(j["kv"]["policy"], "snapkv");
  const std::string auto_text = j["choices"][0]["text"];

  // full keeps the whole prompt in every layer: refused, naming the peak and the pool.
  const Reply full = post(server->port(), "/v1/completions", body(prompt, {{"policy", "full"}}));
  EXPECT_EQ(full.status, 400) << full.body;
  EXPECT_NE(full.body.find("KV blocks at its peak but the pool has 3048"), std::string::npos) << full.body;

  // Asked for explicitly: "layerwise"; a prompt within the budget has nothing to drop: "chunked".
  json explicit_kv = k_snapkv;
  explicit_kv["layerwise"] = true;
  const Reply asked = post(server->port(), "/v1/completions", body(prompt, explicit_kv));
  ASSERT_EQ(asked.status, 200) << asked.body;
  EXPECT_EQ(json::parse(asked.body)["kv"]["prefill"], "layerwise");
  EXPECT_EQ(json::parse(asked.body)["choices"][0]["text"], auto_text);
  const Reply short_prompt = post(server->port(), "/v1/completions", body("The keeper's book recorded", k_snapkv));
  ASSERT_EQ(short_prompt.status, 200) << short_prompt.body;
  EXPECT_EQ(json::parse(short_prompt.body)["kv"]["prefill"], "chunked");
  EXPECT_EQ(server->terminate(30), 0);

  // Without the automatic choice the same snapkv request needs chunked prefill's peak.
  auto manual = start(k_small_pool_mib, false);
  ASSERT_GT(manual->port(), 0);
  const Reply refused = post(manual->port(), "/v1/completions", body(prompt, k_snapkv));
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("KV blocks at its peak but the pool has 3048"), std::string::npos) << refused.body;
  EXPECT_EQ(manual->terminate(30), 0);

  // With room for chunked prefill, the tokens are layer-wise's.
  auto roomy = start(k_large_pool_mib, false);
  ASSERT_GT(roomy->port(), 0);
  const Reply chunked = post(roomy->port(), "/v1/completions", body(prompt, k_snapkv));
  ASSERT_EQ(chunked.status, 200) << chunked.body;
  EXPECT_EQ(json::parse(chunked.body)["kv"]["prefill"], "chunked");
  EXPECT_EQ(json::parse(chunked.body)["choices"][0]["text"], auto_text);
  EXPECT_EQ(roomy->terminate(30), 0);
}

}  // namespace
}  // namespace snap
