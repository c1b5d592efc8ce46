// Batch invariance with 16-bit KV: an engine whose pool holds f16 K/V gives each request the
// same tokens whether it runs alone or shares its steps with others (full, snapkv, h2o), as
// test_engine checks for the default f32 pool.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/engine/prompt.h"
#include "coordinator/scheduler/engine.h"
#include "tests/coordinator/event_collector.h"
#include "tests/worker/tiny_checkpoint.h"

namespace snap {
namespace {

using snap::testing::Collector;

TEST(KvDtypeEngine, F16BatchedRequestsGiveTheSameTokensAsAlone) {
  EngineConfig cfg;
  cfg.model_path = snap::testing::default_model_path();
  cfg.kv_cache_bytes = 64LL << 20;
  cfg.kv_dtype = DType::f16;
  cfg.max_num_seqs = 4;
  cfg.prefill_chunk = 64;
  auto e = Engine::create(cfg, nullptr);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  std::unique_ptr<Engine> engine = std::move(e).value();
  const KvPolicyKind kinds[] = {KvPolicyKind::full, KvPolicyKind::snapkv, KvPolicyKind::h2o};
  auto request = [&](int i) {
    std::string text = "Story " + std::to_string(i) + ": ";
    for (int k = 0; k < 20 + 9 * i; ++k) text += "the river " + std::to_string(k * (i + 3)) + " flows past the old mill, ";
    EngineRequest r;
    r.prompt_ids = prompt_ids_for_text(engine->tokenizer(), text + "and then");
    r.max_tokens = 8;
    r.ignore_eos = true;
    r.kv_policy.kind = kinds[i];
    r.kv_policy.budget = 64;
    r.kv_policy.window = 16;
    r.kv_policy.kernel = 5;
    return r;
  };
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 3; ++i) {
    Collector c;
    ASSERT_TRUE(engine->submit(request(i), c.sink()).ok());
    ASSERT_TRUE(c.wait(300));
    ASSERT_EQ(c.final_event.finish_reason, "length") << c.final_event.error.to_string();
    alone.push_back(c.tokens);
  }
  std::vector<std::unique_ptr<Collector>> together;
  for (int i = 0; i < 3; ++i) {
    together.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(engine->submit(request(i), together.back()->sink()).ok());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(together[i]->wait(300));
    EXPECT_EQ(together[i]->tokens, alone[i]) << kv_policy_name(kinds[i]);
    EXPECT_EQ(together[i]->final_event.completion_tokens, 8);
  }
  EXPECT_GE(engine->stats().peak_step_sequences, 2);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace snap
