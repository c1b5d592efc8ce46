// The lockstep protocol of tensor parallelism on the device (worker/device/device_generate.cpp):
// what tp rank 0 sends the other ranks for each request, so that they run the same loop on
// their shards — the prompt, limits, pool and chunking, the KV policy, whether every prompt
// row goes through the LM head, the selection dump's path — and the shutdown that ends their
// follow(). Sampling, stop ids and hooks stay on rank 0, which then sends each token it chose.
// And the serving engine's (worker/device/device_engine.cpp, serve --device cuda --tp N): one
// DeviceOp per device operation of rank 0's scheduler, which every other rank repeats on its
// shard in the same order. Host code (no CUDA) so that CI tests the encoding.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "coordinator/engine/generate.h"

namespace snap {

struct DeviceRequestHeader {
  bool shutdown = false;  // nothing else is sent: the followers return
  GenerateRequest req;    // prompt_ids, max_tokens, prefill_chunk, auto_layerwise, kv_block_size,
                          // kv_pool_bytes, context_limit, kv_policy, kv_selection_dump
  bool prompt_logits = false;  // every prompt row through the LM head (rank 0 dumps them)
};

std::vector<uint8_t> encode_device_request(const DeviceRequestHeader& h);
// data_loss naming what is wrong (truncated, a negative length, no policy, trailing bytes).
// The decoded request's kv_dtype is bf16 (the device's).
Result<DeviceRequestHeader> decode_device_request(std::span<const uint8_t> bytes);

// serve's lockstep: what rank 0's scheduler does to its pool and forward, for the others.
enum class DeviceOpKind : uint8_t {
  shutdown = 0,   // the server stops: the followers return
  open = 1,       // a pool sequence (the id rank 0's pool gave: `seq`) and the forward's capture
                  // armed for `policy` at `compress_at`
  forward = 2,    // prompt chunk `tokens` of `seq`; `all_logits`: every row through the LM head (echo)
  compress = 3,   // `policy` at `compress_at` on `seq`
  layerwise = 4,  // the whole prompt `tokens` of `seq` layer by layer, chunks of `chunk`, `policy`
  decode = 5,     // one row per sequence: `seqs[i]` with token `tokens[i]`
  release = 6,    // `seq` ends; `disarm`: during its prefill (the forward's capture is disarmed)
  report = 7,     // every rank's memory and exchange counters to rank 0 (one all_gather)
  fork = 8,       // n > 1: copies of `seq`'s KV as the new sequences `seqs` (the ids rank 0's pool gave)
};
struct DeviceOp {
  DeviceOpKind kind = DeviceOpKind::shutdown;
  int32_t seq = -1;
  int64_t compress_at = 0;
  int64_t chunk = 0;
  bool disarm = false;
  bool all_logits = false;
  KvPolicy policy;  // open, compress, layerwise
  std::vector<int32_t> seqs;
  std::vector<int32_t> tokens;
};
std::vector<uint8_t> encode_device_op(const DeviceOp& op);
// data_loss naming what is wrong (truncated, an unknown kind, a bad length, trailing bytes).
Result<DeviceOp> decode_device_op(std::span<const uint8_t> bytes);

}  // namespace snap
