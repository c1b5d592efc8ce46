// The continuous-batching engine on the real default model: requests run together give
// exactly the tokens they give alone (greedy, every KV policy); the queue bound refuses;
// cancellation and completion return every KV block; stop strings, timeouts, validation
// and shutdown behave as a client expects.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/engine/prompt.h"
#include "coordinator/scheduler/engine.h"
#include "tests/coordinator/event_collector.h"
#include "tests/worker/tiny_checkpoint.h"

namespace snap {
namespace {

using snap::testing::Collector;

EngineConfig config() {
  EngineConfig c;
  c.model_path = snap::testing::default_model_path();
  c.kv_cache_bytes = 256LL << 20;
  c.max_num_seqs = 8;
  c.max_waiting = 16;
  c.prefill_chunk = 64;
  return c;
}

std::vector<int32_t> prompt(const Engine& e, int i) {
  std::string text = "Story " + std::to_string(i) + ": ";
  for (int k = 0; k < 20 + 9 * i; ++k) text += "the river " + std::to_string(k * (i + 3)) + " flows past the old mill, ";
  return prompt_ids_for_text(e.tokenizer(), text + "and then");
}

KvPolicy policy(KvPolicyKind kind) {
  KvPolicy p;
  p.kind = kind;
  p.budget = 64;
  p.window = 16;
  p.kernel = 5;
  return p;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::create(config(), nullptr);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e).value();
  }
  EngineRequest request(int i, KvPolicyKind kind, int64_t max_tokens = 10) {
    EngineRequest r;
    r.prompt_ids = prompt(*engine_, i);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.kv_policy = policy(kind);
    return r;
  }
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, BatchedRequestsGiveTheSameTokensAsAlone) {
  const KvPolicyKind kinds[] = {KvPolicyKind::full, KvPolicyKind::snapkv, KvPolicyKind::streaming,
                                KvPolicyKind::h2o, KvPolicyKind::pyramidkv, KvPolicyKind::adakv};
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 6; ++i) {
    Collector c;
    ASSERT_TRUE(engine_->submit(request(i, kinds[i]), c.sink()).ok());
    ASSERT_TRUE(c.wait());
    ASSERT_EQ(c.final_event.finish_reason, "length") << c.final_event.error.to_string();
    alone.push_back(c.tokens);
  }
  std::vector<std::unique_ptr<Collector>> together;
  for (int i = 0; i < 6; ++i) {
    together.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(engine_->submit(request(i, kinds[i]), together.back()->sink()).ok());
  }
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(together[i]->wait());
    EXPECT_EQ(together[i]->tokens, alone[i]) << kv_policy_name(kinds[i]);
    EXPECT_EQ(together[i]->final_event.completion_tokens, 10);
    if (kinds[i] != KvPolicyKind::full) {
      EXPECT_LT(together[i]->final_event.kv_resident_bytes, together[i]->final_event.kv_full_equivalent_bytes);
    }
  }
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
  // They really shared steps: some forward carried several sequences at once.
  EXPECT_GE(engine_->stats().peak_step_sequences, 2);
}

// n choices share one prefill and compression: choice c of a request with seed S samples
// exactly what a request of its own with seed S + c does (so the forked KV equals a fresh
// prefill's, bit for bit), under SnapKV and full; cancelling the request ends every choice.
TEST_F(EngineTest, ChoicesForkTheCompressedCache) {
  for (KvPolicyKind kind : {KvPolicyKind::snapkv, KvPolicyKind::full}) {
    EngineRequest r = request(4, kind, 12);
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 1234;
    r.n = 3;
    struct Multi {
      std::mutex mu;
      std::condition_variable cv;
      std::vector<std::vector<int32_t>> tokens = std::vector<std::vector<int32_t>>(3);
      std::vector<EngineEvent> finals = std::vector<EngineEvent>(3);
      int done = 0;
    };
    // Shared with the sink, so that a failed ASSERT below cannot leave it writing to a dead frame.
    auto shared_m = std::make_shared<Multi>();
    Multi& m = *shared_m;
    ASSERT_TRUE(engine_->submit(r, [shared_m](const EngineEvent& ev) {
                  Multi& m = *shared_m;
                  std::lock_guard<std::mutex> lock(m.mu);
                  if (ev.kind == EngineEvent::Kind::token) m.tokens[ev.index].push_back(ev.token_id);
                  else {
                    m.finals[ev.index] = ev;
                    ++m.done;
                    m.cv.notify_all();
                  }
                }).ok());
    {
      std::unique_lock<std::mutex> lock(m.mu);
      ASSERT_TRUE(m.cv.wait_for(lock, std::chrono::seconds(120), [&] { return m.done == 3; }));
    }
    for (int c = 0; c < 3; ++c) {
      EngineRequest alone = request(4, kind, 12);
      alone.sampling.temperature = 0.9f;
      alone.sampling.seed = 1234 + c;
      Collector one;
      ASSERT_TRUE(engine_->submit(alone, one.sink()).ok());
      ASSERT_TRUE(one.wait());
      EXPECT_EQ(m.finals[c].finish_reason, "length") << kv_policy_name(kind) << " choice " << c;
      EXPECT_EQ(m.finals[c].index, c);
      EXPECT_EQ(m.tokens[c], one.tokens) << kv_policy_name(kind) << " choice " << c;
      EXPECT_EQ(m.finals[c].kv_resident_bytes, one.final_event.kv_resident_bytes) << "each choice holds a whole copy";
    }
    EXPECT_NE(m.tokens[0], m.tokens[1]) << "choices sampled alike (seeds not per choice?)";
  }
  for (int i = 0; i < 100 && engine_->stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);

  // Cancel the request mid-decode: all three choices end "abort", every block returns.
  EngineRequest r = request(2, KvPolicyKind::snapkv, 400);
  r.n = 3;
  struct Cancelled {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> reasons;
    int tokens = 0;
  };
  auto shared_c = std::make_shared<Cancelled>();
  std::mutex& mu = shared_c->mu;
  std::condition_variable& cv = shared_c->cv;
  std::vector<std::string>& reasons = shared_c->reasons;
  int& tokens = shared_c->tokens;
  auto id = engine_->submit(r, [shared_c](const EngineEvent& ev) {
    std::lock_guard<std::mutex> lock(shared_c->mu);
    if (ev.kind == EngineEvent::Kind::token) ++shared_c->tokens;
    else shared_c->reasons.push_back(ev.finish_reason);
    shared_c->cv.notify_all();
  });
  ASSERT_TRUE(id.ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return tokens >= 9; }));
  }
  engine_->cancel(id.value());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return reasons.size() == 3; }));
  }
  EXPECT_EQ(reasons, (std::vector<std::string>{"abort", "abort", "abort"}));
  for (int i = 0; i < 100 && engine_->stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, CancelAndCompletionReturnEveryBlock) {
  Collector c;
  auto id = engine_->submit(request(3, KvPolicyKind::full, 200), c.sink());
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 400 && engine_->stats().kv_blocks_used == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(engine_->stats().kv_blocks_used, 0);
  engine_->cancel(id.value());
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.final_event.finish_reason, "abort");
  for (int i = 0; i < 100 && engine_->stats().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
  EXPECT_EQ(engine_->stats().running, 0);
}

TEST_F(EngineTest, StopStringEndsTheOutputBeforeIt) {
  Collector free_run;
  EngineRequest r = request(1, KvPolicyKind::full, 24);
  ASSERT_TRUE(engine_->submit(r, free_run.sink()).ok());
  ASSERT_TRUE(free_run.wait());
  ASSERT_GE(free_run.text.size(), 8u);
  // Stop at a piece of the free-running text: the output is exactly what came before it.
  const std::string stop = free_run.text.substr(free_run.text.size() / 2, 3);
  r.stop = {stop};
  Collector c;
  ASSERT_TRUE(engine_->submit(r, c.sink()).ok());
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.final_event.finish_reason, "stop");
  EXPECT_EQ(c.text, free_run.text.substr(0, free_run.text.find(stop)));
}

TEST_F(EngineTest, InvalidRequestsAreRefusedWithAMessage) {
  Collector c;
  EngineRequest r = request(0, KvPolicyKind::full);
  r.max_tokens = 0;
  auto s = engine_->submit(r, c.sink());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("max_tokens"), std::string::npos);
  r = request(0, KvPolicyKind::full);
  r.prompt_ids.clear();
  EXPECT_FALSE(engine_->submit(r, c.sink()).ok());
  r = request(0, KvPolicyKind::full);
  r.prompt_ids.assign(9000, 100);
  s = engine_->submit(r, c.sink());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("tokens"), std::string::npos);
  r = request(0, KvPolicyKind::snapkv);
  r.kv_policy.budget = 8;
  s = engine_->submit(r, c.sink());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("window"), std::string::npos);
}

// Admission by exact KV reservations on a pool of 2900 blocks (30 layers x 3 KV heads = 90
// heads, 16 tokens a block): an oversize request is refused with its numbers; two full
// requests of 2520 blocks each run one after the other; two SnapKV requests reserve their
// prefill peak (2250) but only 450 after compression, so the second starts while the first
// still decodes; nothing ever fails for want of a block.
TEST(EngineAdmission, ReservationsQueueAndCompressionFreesRoom) {
  EngineConfig cfg = config();
  const int64_t block_bytes = 2 * 16 * 64 * 4 + 16 * 4;
  cfg.kv_cache_bytes = 2900 * block_bytes;
  cfg.max_num_seqs = 4;
  auto e = Engine::create(cfg, nullptr);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  ASSERT_EQ(engine.model_config().num_layers * engine.model_config().num_kv_heads, 90);
  for (int i = 0; i < 100 && engine.stats().kv_blocks_total == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(engine.stats().kv_blocks_total, 2900);
  std::vector<int32_t> ids = prompt(engine, 9);
  ASSERT_GE(ids.size(), 400u);
  ids.resize(400);
  auto request = [&](KvPolicyKind kind, int64_t max_tokens) {
    EngineRequest r;
    r.prompt_ids = ids;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.kv_policy.kind = kind;
    if (kind == KvPolicyKind::snapkv) {
      r.kv_policy.budget = 32;
      r.kv_policy.window = 8;
    }
    return r;
  };

  Collector unused;
  auto oversize = engine.submit(request(KvPolicyKind::full, 2000), unused.sink());  // 90 x 150 blocks
  ASSERT_FALSE(oversize.ok());
  EXPECT_EQ(oversize.status().code(), StatusCode::k_invalid_argument);
  EXPECT_NE(oversize.status().message().find("needs 13500 KV blocks at its peak but the pool has 2900"), std::string::npos)
      << oversize.status().message();

  Collector a, b;  // full: 90 x ceil(440 / 16) = 2520 blocks each
  ASSERT_TRUE(engine.submit(request(KvPolicyKind::full, 40), a.sink()).ok());
  ASSERT_TRUE(engine.submit(request(KvPolicyKind::full, 40), b.sink()).ok());
  ASSERT_TRUE(a.wait());
  ASSERT_TRUE(b.wait());
  EXPECT_EQ(a.final_event.finish_reason, "length") << a.final_event.error.to_string();
  EXPECT_EQ(b.final_event.finish_reason, "length") << b.final_event.error.to_string();
  EXPECT_GE(b.first_token_at, a.finished_at) << "the second full request ran while the first held its blocks";

  Collector c, d;  // snapkv: prefill peak 90 x 25 = 2250, then 90 x ceil(72 / 16) = 450
  ASSERT_TRUE(engine.submit(request(KvPolicyKind::snapkv, 40), c.sink()).ok());
  ASSERT_TRUE(engine.submit(request(KvPolicyKind::snapkv, 40), d.sink()).ok());
  ASSERT_TRUE(c.wait());
  ASSERT_TRUE(d.wait());
  EXPECT_EQ(c.final_event.finish_reason, "length") << c.final_event.error.to_string();
  EXPECT_EQ(d.final_event.finish_reason, "length") << d.final_event.error.to_string();
  EXPECT_LT(d.first_token_at, c.finished_at) << "compression did not free room for the second request";
  EXPECT_LT(c.final_event.kv_resident_bytes, c.final_event.kv_full_equivalent_bytes);

  for (int i = 0; i < 100 && engine.stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
  // A full request filled its reservation (90 x 28 blocks); nothing went past the pool.
  EXPECT_GE(engine.stats().peak_kv_blocks_used, 2520);
  EXPECT_LE(engine.stats().peak_kv_blocks_used, 2900);
  engine.shutdown(1.0);
}

TEST(EngineQueue, FullQueueRefusesAndTimeoutFinishes) {
  EngineConfig cfg = config();
  cfg.max_num_seqs = 1;
  cfg.max_waiting = 1;
  auto e = Engine::create(cfg, nullptr);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  auto& engine = *e.value();
  std::vector<std::unique_ptr<Collector>> cs;
  int refused = 0;
  for (int i = 0; i < 4; ++i) {
    cs.push_back(std::make_unique<Collector>());
    EngineRequest r;
    r.prompt_ids = prompt(engine, i);
    r.max_tokens = 4000;  // far more than 1 s of decoding here
    r.ignore_eos = true;
    r.timeout_seconds = 1.0;
    auto s = engine.submit(r, cs.back()->sink());
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), StatusCode::k_resource_exhausted);
      ++refused;
      cs.pop_back();
    }
  }
  // One runs (or is about to), one waits, two are refused, however far the engine thread got.
  EXPECT_EQ(refused, 2);
  for (auto& c : cs) {
    ASSERT_TRUE(c->wait());
    EXPECT_EQ(c->final_event.finish_reason, "timeout");
    EXPECT_LT(c->final_event.completion_tokens, 4000);
  }
  engine.shutdown(1.0);
  EXPECT_FALSE(engine.healthy());
}

}  // namespace
}  // namespace snap
