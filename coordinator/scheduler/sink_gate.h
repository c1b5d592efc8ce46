// SinkGate: between a request's sequences and its EventSink, for the serving engines (the
// CPU engine, coordinator/scheduler/engine.cpp, and the device engine,
// worker/device/device_engine.cpp), so that a tensor-parallel group failure seen by the
// watchdog's thread can end every open request while the scheduler thread is stuck inside a
// collective.
#pragma once

#include <mutex>
#include <utility>
#include <vector>

#include "coordinator/scheduler/engine.h"

namespace snap {

// Between a request's sequences and its EventSink: lets through each choice's events up to
// and including its one finished event, and nothing after. fail() ends every choice not yet
// finished with an error, from any thread, so the sink still sees exactly one finished
// event per choice whichever thread (scheduler or watchdog) gets there first.
class SinkGate {
 public:
  SinkGate(EventSink sink, int n) : sink_(std::move(sink)), finished_(static_cast<size_t>(n), false), open_(n) {}
  // Returns true when this was the last choice's finished event.
  bool deliver(const EngineEvent& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t i = static_cast<size_t>(ev.index);
    if (i >= finished_.size() || finished_[i]) return false;
    if (ev.kind == EngineEvent::Kind::finished) {
      finished_[i] = true;
      --open_;
    }
    sink_(ev);
    return open_ == 0;
  }
  void fail(const Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < finished_.size(); ++i) {
      if (finished_[i]) continue;
      EngineEvent ev;
      ev.kind = EngineEvent::Kind::finished;
      ev.index = static_cast<int>(i);
      ev.finish_reason = "error";
      ev.error = st;
      finished_[i] = true;
      sink_(ev);
    }
    open_ = 0;
  }

 private:
  std::mutex mu_;
  EventSink sink_;
  std::vector<bool> finished_;
  int open_;
};

}  // namespace snap
