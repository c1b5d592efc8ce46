// The engine's threads under load, on a tiny random model (tools/make_random_model.py) so
// that it also runs under ThreadSanitizer within CI's time (scripts/test.sh): client
// threads submit and cancel at once while another polls stats(); every request ends with
// exactly one finished event per choice and nothing after it, every block returns to the
// pool, and a shutdown with requests in flight finishes each of them once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/scheduler/engine.h"
#include "tests/worker/tiny_checkpoint.h"

namespace snap {
namespace {

// Counts events per choice; anything after a choice's finished event is a failure.
struct Tally {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, int> finished;  // choice -> finished events
  int after_finish = 0;         // events that arrived after their choice's finished event
  int tokens = 0;
  std::string reasons;
  int n = 1;

  EventSink sink() {
    return [this](const EngineEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (finished[ev.index] > 0) ++after_finish;
      if (ev.kind == EngineEvent::Kind::token) ++tokens;
      if (ev.kind == EngineEvent::Kind::finished) {
        ++finished[ev.index];
        reasons += ev.finish_reason + " ";
        cv.notify_all();
      }
    };
  }
  bool all_finished() {
    for (int c = 0; c < n; ++c) {
      if (finished[c] == 0) return false;
    }
    return true;
  }
  bool wait(double seconds) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return all_finished(); });
  }
};

class EngineThreads : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("engine_threads");
    const std::string cmd = std::string("python3 ") + SNAP_SOURCE_DIR + "/tools/make_random_model.py --shape tiny-llama3 " +
                            "--layers 2 --max-position 1024 --out " + dir_->path() + "/m > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  std::unique_ptr<Engine> make_engine() {
    EngineConfig c;
    c.model_path = dir_->path() + "/m";
    c.threads = 1;
    c.kv_cache_bytes = 32LL << 20;
    c.max_num_seqs = 4;
    c.max_waiting = 256;
    c.prefill_chunk = 16;
    auto e = Engine::create(c, nullptr);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static EngineRequest request(std::mt19937& rng) {
    EngineRequest r;
    const int len = 8 + static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) r.prompt_ids.push_back(static_cast<int32_t>(3 + rng() % 200));
    r.max_tokens = 2 + static_cast<int>(rng() % 12);
    r.ignore_eos = true;
    r.sampling.temperature = 0.8f;
    r.sampling.seed = rng();
    r.n = rng() % 4 == 0 ? 2 : 1;
    if (rng() % 2) {
      r.kv_policy.kind = KvPolicyKind::snapkv;
      r.kv_policy.budget = 16;
      r.kv_policy.window = 4;
      r.kv_policy.kernel = 3;
    }
    return r;
  }
  static inline testing::TempDir* dir_ = nullptr;
};

TEST_F(EngineThreads, ConcurrentSubmitCancelAndStats) {
  std::unique_ptr<Engine> engine = make_engine();
  ASSERT_TRUE(engine);
  constexpr int k_clients = 4, k_each = 12;
  std::vector<std::unique_ptr<Tally>> tallies(k_clients * k_each);
  std::atomic<bool> polling{true};
  std::thread poller([&] {
    while (polling.load()) {
      const EngineStats st = engine->stats();
      EXPECT_LE(st.kv_blocks_used, st.kv_blocks_total);
      EXPECT_TRUE(engine->healthy());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::vector<std::thread> clients;
  for (int t = 0; t < k_clients; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      for (int i = 0; i < k_each; ++i) {
        auto& tally = tallies[t * k_each + i];
        tally = std::make_unique<Tally>();
        EngineRequest r = request(rng);
        tally->n = r.n;
        auto id = engine->submit(std::move(r), tally->sink());
        ASSERT_TRUE(id.ok()) << id.status().to_string();
        if (rng() % 3 == 0) {  // cancel some at once, some a little later
          if (rng() % 2) std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 20));
          engine->cancel(*id);
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  for (auto& t : tallies) {
    ASSERT_TRUE(t->wait(300)) << "a request never finished";
  }
  polling = false;
  poller.join();
  for (auto& t : tallies) {
    std::lock_guard<std::mutex> lock(t->mu);
    for (int c = 0; c < t->n; ++c) EXPECT_EQ(t->finished[c], 1) << t->reasons;
    EXPECT_EQ(t->after_finish, 0) << t->reasons;
    EXPECT_EQ(t->reasons.find("error"), std::string::npos) << t->reasons;
  }
  // stats() is what the scheduler published after its last step, and a request's final event
  // goes out inside that step (a cancel, or the reap before the publish): wait for the next
  // publish (the loop wakes at least every 200 ms) instead of reading it at the last event.
  EngineStats st = engine->stats();
  for (int i = 0; i < 100 && (st.running != 0 || st.kv_blocks_used != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    st = engine->stats();
  }
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.running, 0);
}

TEST_F(EngineThreads, ShutdownWithRequestsInFlightFinishesEachOnce) {
  std::unique_ptr<Engine> engine = make_engine();
  ASSERT_TRUE(engine);
  std::mt19937 rng(99);
  std::vector<std::unique_ptr<Tally>> tallies;
  for (int i = 0; i < 24; ++i) {
    tallies.push_back(std::make_unique<Tally>());
    EngineRequest r = request(rng);
    r.max_tokens = 200;  // still running when the shutdown comes
    tallies.back()->n = r.n;
    ASSERT_TRUE(engine->submit(std::move(r), tallies.back()->sink()).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread late([&] {  // a submit racing the shutdown: accepted and finished, or refused
    EngineRequest r = request(rng);
    r.n = 1;
    Tally t;
    auto id = engine->submit(std::move(r), t.sink());
    if (id.ok()) {
      EXPECT_TRUE(t.wait(60));
    }
  });
  engine->shutdown(0.05);
  late.join();
  for (auto& t : tallies) {
    ASSERT_TRUE(t->wait(60));
    std::lock_guard<std::mutex> lock(t->mu);
    for (int c = 0; c < t->n; ++c) EXPECT_EQ(t->finished[c], 1) << t->reasons;
    EXPECT_EQ(t->after_finish, 0) << t->reasons;
  }
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace snap
