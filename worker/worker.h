// Worker: one rank of the model — its shard (LlamaForward), a KV block pool, and the KV
// cache and compressor of every open sequence — executing StepPlans. Rank 0 drives its
// group through a StepDriver (broadcast the plan, then run it locally); the other ranks
// sit in worker_loop() running whatever arrives until a shutdown plan. Every rank runs
// the same plan on its own heads, so KV, scores and selections never leave their rank.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "common/status.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/compressor.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/llama.h"
#include "worker/step_plan.h"

namespace snap {

// What a rank tells rank 0 for the metrics (StepPlan::report).
struct RankReport {
  int64_t kv_resident_bytes = 0;         // blocks in use in this rank's pool
  int64_t kv_full_equivalent_bytes = 0;  // what its sequences' uncompressed KV would take
  int64_t rss_bytes = 0;                 // process resident memory
  int64_t all_reduce_bytes = 0;          // comm counters (communicator.h), cumulative
  int64_t broadcast_bytes = 0;
  int64_t all_gather_bytes = 0;
  double all_reduce_seconds = 0;  // inside collectives, waiting included, cumulative
  double broadcast_seconds = 0;
  double all_gather_seconds = 0;
  double busy_seconds = 0;        // running step plans (Worker::run), cumulative
  // Identity and requests, for rank 0's watchdog (coordinator/scheduler/group_watchdog.h):
  int64_t pid = 0;               // this process
  int64_t host_id = 0;           // hash of the host name: pids are comparable only on one host
  int64_t drain_requested = 0;   // 1 once this rank got SIGTERM/SIGINT/SIGUSR1: drain the group
};

class Worker {
 public:
  // forward must outlive the worker.
  explicit Worker(LlamaForward& forward);

  LlamaForward& forward() { return forward_; }
  const ModelConfig& config() const { return forward_.config(); }
  const TpShard& shard() const { return forward_.shard(); }

  // Runs one plan on this rank. logits: one pointer per plan item ([vocab_size], or
  // [num_tokens, vocab_size] for LogitsWanted::all; null = not wanted) on the rank that
  // has the LM head; empty on the others. Errors leave the plan half done: pool
  // exhaustion happens at the same point on every rank (same shapes, same pool size).
  Status run(const StepPlan& plan, std::span<float* const> logits = {});

  struct Sequence {
    std::unique_ptr<PagedKvCache> cache;
    std::unique_ptr<KvCompressor> compressor;
  };
  // An open sequence of this rank, or null.
  const Sequence* sequence(uint64_t seq) const;
  const BlockPool* pool() const { return pool_.get(); }
  // This rank's figures; comm (may be null) gives the byte counters.
  RankReport report(const comm::Communicator* comm) const;
  // A stop signal reached this rank (any thread may call it): its next report asks rank 0
  // to drain the whole group.
  void request_drain() { drain_requested_ = true; }

 private:
  Status run_plan(const StepPlan& plan, std::span<float* const> logits);
  Status run_items(const StepPlan& plan, std::span<float* const> logits);
  Status write_selection(const SelectionDump& dump) const;

  LlamaForward& forward_;
  double busy_seconds_ = 0;
  std::atomic<bool> drain_requested_{false};
  std::unique_ptr<BlockPool> pool_;
  std::map<uint64_t, Sequence> seqs_;
};

// Rank 0's side: run() sends the plan to the group (one broadcast of its size, one of its
// bytes), then runs it on the local worker. Without a group (comm null or of size 1) it
// just runs it.
class StepDriver {
 public:
  // An internal error on this rank means its state no longer matches the plan; going on
  // would desynchronise the group's collectives. `on_internal_error` decides what then
  // happens (the engine fails the group, tells its clients, and exits); by default the job
  // is aborted at once (Communicator::abort_job).
  using InternalErrorHandler = std::function<void(const Status&)>;
  StepDriver(Worker& local, comm::Communicator* comm);
  void set_internal_error_handler(InternalErrorHandler handler) { on_internal_error_ = std::move(handler); }
  Worker& local() { return local_; }
  comm::Communicator* comm() { return comm_; }
  // reports: when plan.report, every rank's RankReport, indexed by group rank.
  Status run(const StepPlan& plan, std::span<float* const> logits = {}, std::vector<RankReport>* reports = nullptr);
  // Ends the other ranks' worker_loop. Idempotent.
  Status shutdown();

 private:
  Worker& local_;
  comm::Communicator* comm_;
  InternalErrorHandler on_internal_error_;
  bool shut_down_ = false;
};

// Every rank of a group calls this once after loading its shard, with how that went: an
// error on any rank becomes an error on all ("rank 2: <message>" on that rank, "another
// rank failed to load its shard" elsewhere), so no rank goes on alone and none hangs.
// Its all-reduce waits at most the load timeout (--load-timeout) for the ranks still loading:
// one stuck reading its shard fails the others naming it. On success it arms the
// communicator's collective timeout (Communicator::arm_collective_timeout).
// Without a group it returns `local`.
Status agree_on_load(comm::Communicator* comm, const Status& local);

// The other ranks: receive plans from group rank 0 and run them until a shutdown plan.
// A plan's own error is printed and the loop goes on (rank 0 saw the same error and
// decides: pool exhaustion and bad requests happen alike on every rank); an internal error
// (this rank's state disagrees with the plan) ends the whole job through
// Communicator::abort_job, on any rank; a communication error or a malformed plan returns.
// Waits for a plan are bounded (Communicator::BroadcastBound): the first by --load-timeout,
// the others by --collective-timeout, so rank 0 must send one at least that often (the
// engines send a report at least once a second when idle).
Status worker_loop(Worker& worker, comm::Communicator& comm);

// Seconds between rank 0's reports (the engines' heartbeat while idle): 1, or a quarter of
// the armed collective timeout when that is shorter, which bounds the workers' waits.
double report_interval_seconds(const comm::Communicator* comm);
// How long an idle engine loop sleeps between looks at its queue: 200 ms, or half the report
// interval when that is shorter, so that the reports keep their interval.
std::chrono::milliseconds idle_wait(const comm::Communicator* comm);

}  // namespace snap
