// Worker: one rank of the model — its shard (LlamaForward), a KV block pool, and the KV
// cache and compressor of every open sequence — executing StepPlans. Rank 0 drives its
// group through a StepDriver (broadcast the plan, then run it locally); the other ranks
// sit in worker_loop() running whatever arrives until a shutdown plan. Every rank runs
// the same plan on its own heads, so KV, scores and selections never leave their rank.
#pragma once

#include <cstdint>
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

 private:
  Status run_items(const StepPlan& plan, std::span<float* const> logits);
  Status write_selection(const SelectionDump& dump) const;

  LlamaForward& forward_;
  std::unique_ptr<BlockPool> pool_;
  std::map<uint64_t, Sequence> seqs_;
};

// Rank 0's side: run() sends the plan to the group (one broadcast of its size, one of its
// bytes), then runs it on the local worker. Without a group (comm null or of size 1) it
// just runs it.
class StepDriver {
 public:
  StepDriver(Worker& local, comm::Communicator* comm);
  Worker& local() { return local_; }
  comm::Communicator* comm() { return comm_; }
  Status run(const StepPlan& plan, std::span<float* const> logits = {});
  // Ends the other ranks' worker_loop. Idempotent.
  Status shutdown();

 private:
  Worker& local_;
  comm::Communicator* comm_;
  bool shut_down_ = false;
};

// The other ranks: receive plans from group rank 0 and run them until a shutdown plan.
// A plan's own error is printed and the loop goes on (rank 0 saw the same error and
// decides); a communication error or a malformed plan returns.
Status worker_loop(Worker& worker, comm::Communicator& comm);

}  // namespace snap
