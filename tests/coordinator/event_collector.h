// Collects one engine request's events for a test; wait() blocks until the finished event.
// The state lives behind a shared_ptr that the sink holds, so an event that arrives after
// the Collector has gone (a failed ASSERT returned before the request finished, while the
// engine is still running) lands in live memory instead of a destroyed mutex: the test
// fails with its message instead of hanging.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/scheduler/engine.h"

namespace snap::testing {

struct CollectorState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::string text;
  bool done = false;
  EngineEvent final_event;
  std::chrono::steady_clock::time_point first_token_at, finished_at;
};

class Collector {
 public:
  Collector() = default;
  Collector(const Collector&) = delete;
  Collector& operator=(const Collector&) = delete;

  EventSink sink() {
    return [s = s_](const EngineEvent& ev) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->text += ev.text;
      if (ev.kind == EngineEvent::Kind::token) {
        if (s->tokens.empty()) s->first_token_at = std::chrono::steady_clock::now();
        s->tokens.push_back(ev.token_id);
      }
      if (ev.kind == EngineEvent::Kind::finished) {
        s->finished_at = std::chrono::steady_clock::now();
        s->done = true;
        s->final_event = ev;
        s->cv.notify_all();
      }
    };
  }
  bool wait(double seconds = 120) {
    std::unique_lock<std::mutex> lock(s_->mu);
    return s_->cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return s_->done; });
  }

 private:
  std::shared_ptr<CollectorState> s_ = std::make_shared<CollectorState>();

 public:
  // Read after wait() returned true.
  std::vector<int32_t>& tokens = s_->tokens;
  std::string& text = s_->text;
  bool& done = s_->done;
  EngineEvent& final_event = s_->final_event;
  std::chrono::steady_clock::time_point& first_token_at = s_->first_token_at;
  std::chrono::steady_clock::time_point& finished_at = s_->finished_at;
};

}  // namespace snap::testing
