// The lockstep protocol of tensor parallelism on the device (worker/device/device_generate.cpp):
// what tp rank 0 sends the other ranks for each request, so that they run the same loop on
// their shards — the prompt, limits, pool and chunking, the KV policy, whether every prompt
// row goes through the LM head, the selection dump's path — and the shutdown that ends their
// follow(). Sampling, stop ids and hooks stay on rank 0, which then sends each token it chose.
// Host code (no CUDA) so that CI tests the encoding.
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

}  // namespace snap
