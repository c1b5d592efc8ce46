// GroupWatchdog: deadlines per step plan and liveness of the ranks on this host.
#include "coordinator/scheduler/group_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/sys.h"

namespace snap {

namespace {
constexpr double k_min_seconds_per_token = 1e-3;
constexpr double k_token_slack = 10.0;  // a plan may take 10x the tokens' average time
constexpr auto k_poll = std::chrono::milliseconds(100);
}  // namespace

GroupWatchdog::GroupWatchdog(double step_timeout_seconds, FailureHandler on_failure)
    : base_seconds_(step_timeout_seconds), on_failure_(std::move(on_failure)) {
  thread_ = std::thread([this] { loop(); });
}

GroupWatchdog::~GroupWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GroupWatchdog::set_peers(std::vector<GroupPeer> peers) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_ = std::move(peers);
}

double GroupWatchdog::deadline_seconds(int64_t tokens) const {
  std::lock_guard<std::mutex> lock(mu_);
  const double per_token = std::max(k_min_seconds_per_token, k_token_slack * seconds_per_token_);
  return base_seconds_ + static_cast<double>(tokens) * per_token;
}

void GroupWatchdog::arm(int64_t tokens) {
  const double allowed = deadline_seconds(tokens);
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  armed_at_ = now_seconds();
  deadline_ = armed_at_ + allowed;
  armed_tokens_ = tokens;
}

void GroupWatchdog::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_) return;
  armed_ = false;
  if (armed_tokens_ > 0) {
    const double sample = (now_seconds() - armed_at_) / static_cast<double>(armed_tokens_);
    seconds_per_token_ = seconds_per_token_ == 0 ? sample : 0.8 * seconds_per_token_ + 0.2 * sample;
  }
}

std::string GroupWatchdog::dead_peers() const {
  std::string out;
  for (const GroupPeer& p : peers_) {
    if (!p.same_host) continue;
    const char state = process_state(p.pid);
    if (state == 0 || state == 'Z' || state == 'X') {
      out += (out.empty() ? "" : ", ") + std::string("rank ") + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) +
             ") died";
    }
  }
  return out;
}

std::string GroupWatchdog::stopped_peers() const {
  std::string out;
  for (const GroupPeer& p : peers_) {
    if (p.same_host && (process_state(p.pid) == 'T' || process_state(p.pid) == 't')) {
      out += (out.empty() ? "" : ", ") + std::string("rank ") + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) +
             ") is stopped";
    }
  }
  return out;
}

void GroupWatchdog::fire(const std::string& why) {
  if (fired_.exchange(true)) return;
  on_failure_(why);
}

void GroupWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !fired_.load()) {
    cv_.wait_for(lock, k_poll, [&] { return stop_; });
    if (stop_) break;
    std::string why = dead_peers();
    if (why.empty() && armed_ && now_seconds() > deadline_) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "a step plan of %lld tokens did not finish within its deadline of %.1f s (--step-timeout)",
                    static_cast<long long>(armed_tokens_), deadline_ - armed_at_);
      why = buf;
      const std::string stopped = stopped_peers();
      why += stopped.empty() ? ": a rank of the group is hung or unreachable" : ": " + stopped;
    }
    if (why.empty()) continue;
    lock.unlock();
    fire(why);
    lock.lock();
  }
}

}  // namespace snap
