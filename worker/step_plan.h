// StepPlan: what rank 0 (the coordinator) tells every rank of a tensor-parallel group to do
// in one step — open sequences with their KV policy, run one forward over some sequences'
// tokens (prompt chunks and decode tokens), dump KV selections, close sequences — and its
// byte encoding for the broadcast. Every rank runs the same plan on its own shard.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/policy.h"

namespace snap {

struct SequenceOpen {
  uint64_t seq = 0;
  KvPolicy policy;
  int64_t compress_at = 0;  // prompt tokens after which the policy compresses the cache
};

enum class LogitsWanted : uint8_t { none, last, all };

struct StepItem {
  uint64_t seq = 0;
  int32_t start_position = 0;  // where tokens[0] goes; every rank checks its cache agrees
  std::vector<int32_t> tokens;
  bool prefill = false;  // a prompt chunk (prefill items come first in a plan)
  // The whole prompt, one layer at a time, compressing each layer (alone in its plan).
  bool layerwise = false;
  LogitsWanted logits = LogitsWanted::last;  // produced on tp rank 0 only
};

struct SelectionDump {
  uint64_t seq = 0;
  std::string path;  // tp > 1: each rank writes path + ".rank<tp rank>"
  int64_t prompt_tokens = 0;
};

// A copy of an open sequence's KV cache (prompt prefilled, compressed) into a new sequence:
// the choices of an n > 1 request share one prefill and diverge from there.
struct SequenceFork {
  uint64_t src = 0;
  uint64_t dst = 0;
};

struct StepPlan {
  bool shutdown = false;  // the worker loops return; nothing else in the plan runs
  // > 0: (re)create the KV block pool with this many bytes per rank before anything else
  // (no sequence may be open).
  int64_t pool_bytes = 0;
  int32_t block_size = 16;
  DType kv_dtype = k_default_kv_dtype;  // K/V element type of that pool: f32, bf16, f16 or q8_0
  int64_t chunk = 512;  // prefill chunk of a layer-wise item
  std::vector<SequenceOpen> open;
  std::vector<SequenceFork> forks;  // after the opens, before the forward
  std::vector<StepItem> items;  // one forward over all of them (none: no forward)
  std::vector<SelectionDump> dumps;
  std::vector<uint64_t> close;  // freed after the rest
  // After the rest, every rank sends rank 0 its RankReport (worker.h), in one all_gather.
  bool report = false;
};

std::vector<uint8_t> encode_step_plan(const StepPlan& plan);
// data_loss naming what is malformed (truncated, unknown enum value, trailing bytes).
Result<StepPlan> decode_step_plan(std::span<const uint8_t> bytes);

}  // namespace snap
