// GroupWatchdog: rank 0's guard over its tensor-parallel group. Every step plan rank 0
// drives is armed with a deadline; a thread checks it every 100 ms, and also whether a
// rank on this host has died (its process is gone or a zombie). Either calls the failure
// handler once, from the watchdog thread, so the engine can fail every open request and the
// process can exit while the scheduler thread is still stuck inside a collective.
//
// Deadline of a plan of T tokens: base + T × max(1 ms, 10 × the measured seconds per token,
// an average over earlier plans). base is --step-timeout (default 20 s): a decode step takes
// milliseconds, so 20 s is a rank that is hung (stopped, a partition) and not a slow step; a
// long prefill step or a layer-wise prefill of a whole prompt gets its tokens' worth more.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace snap {

struct GroupPeer {
  int rank = 0;
  int64_t pid = 0;
  bool same_host = false;  // only then can its process be checked from here
};

class GroupWatchdog {
 public:
  using FailureHandler = std::function<void(const std::string& why)>;

  GroupWatchdog(double step_timeout_seconds, FailureHandler on_failure);
  ~GroupWatchdog();
  GroupWatchdog(const GroupWatchdog&) = delete;
  GroupWatchdog& operator=(const GroupWatchdog&) = delete;

  // The other ranks of the group (from their first RankReport).
  void set_peers(std::vector<GroupPeer> peers);

  // Around one plan of `tokens` tokens (prompt chunk + decode tokens; 0 for plans that only
  // open, close or report): arm() before it is sent, disarm() once it returned.
  void arm(int64_t tokens);
  void disarm();
  // The deadline a plan of `tokens` tokens gets now, in seconds.
  double deadline_seconds(int64_t tokens) const;

  // True once the handler has been called (it is called at most once).
  bool fired() const { return fired_.load(); }

 private:
  void loop();
  // "rank 2 (pid 123) died" etc. for the peers on this host; empty when all look alive.
  std::string dead_peers() const;
  std::string stopped_peers() const;
  void fire(const std::string& why);

  const double base_seconds_;
  FailureHandler on_failure_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<GroupPeer> peers_;
  bool armed_ = false;
  double armed_at_ = 0;
  double deadline_ = 0;        // absolute, now_seconds() clock
  int64_t armed_tokens_ = 0;
  double seconds_per_token_ = 0;  // running average over plans with tokens; 0 until the first
  bool stop_ = false;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

}  // namespace snap
