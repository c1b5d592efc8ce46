// One sequence, start to finish: prefill the prompt ids (compressing the KV cache by the
// request's policy), then sample and decode token by token until max_tokens, a stop id,
// or the context limit. Used by `snapserve generate` and by the tests. Every forward goes
// out as a StepPlan through a StepDriver, so the same loop drives one process or a
// tensor-parallel group (rank 0 runs this; the other ranks run worker_loop).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"
#include "worker/kv/policy.h"
#include "worker/model/llama.h"
#include "worker/worker.h"

namespace snap {

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;
  int64_t max_tokens = 128;
  kernels::SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
  int64_t prefill_chunk = 512;    // tokens per prefill forward (bounds scratch memory)
  KvPolicy kv_policy;             // full by default
  // A compressing policy over the whole prompt prefills layer by layer (as with
  // kv_policy.layerwise) whenever that peaks lower in memory: one layer's full KV plus the
  // compressed rest and the prompt's hidden states, against every layer's full KV. Same
  // selections and tokens (test_kv_policies); false keeps chunked prefill.
  bool auto_layerwise = true;
  int kv_block_size = 16;         // tokens per KV block
  DType kv_dtype = k_default_kv_dtype;  // K/V element type: f32, bf16 or f16
  // KV block pool size; 0 sizes it for this request uncompressed (prompt + max_tokens).
  // Too small a pool ends the request with resource_exhausted, never a crash.
  int64_t kv_pool_bytes = 0;
  // Positions allowed; 0 = the model's context. Larger values run RoPE past the trained
  // context (for memory measurements with synthetic prompts, not for quality).
  int64_t context_limit = 0;
  // When set, every rank writes the kept positions of its KV heads after prefill (JSON;
  // with tp > 1 to this path + ".rank<r>").
  std::string kv_selection_dump;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;     // prompt forward passes, compression included
  double decode_seconds = 0;      // all decode steps (tokens after the first)
  double selection_seconds = 0;   // KV selection (scores, pooling, top-k, compaction)
  // KV figures are this rank's (rank 0's); with tensor parallelism every rank holds the
  // same amount for its own heads.
  int64_t kv_resident_bytes = 0;  // blocks held at the end
  int64_t kv_stored_bytes = 0;    // K/V bytes of the tokens held at the end
  int64_t kv_full_equivalent_bytes = 0;  // what an uncompressed cache would hold at the end
  int64_t kv_pool_peak_bytes = 0;        // most blocks ever in use × block bytes
  DType kv_dtype = DType::f32;           // element type of the cached K/V
  bool layerwise = false;                // prefill ran layer by layer (asked for, or chosen by auto_layerwise)
  int64_t scratch_peak_bytes = 0;        // activation scratch at its largest (LlamaForward::peak_scratch_bytes)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (including a final stop id, if any)
  std::string finish_reason;    // "stop" or "length"
  GenerateStats stats;
};

struct GenerateHooks {
  // Called with each generated id as soon as it is sampled; return false to stop.
  std::function<bool(int32_t)> on_token;
  // When set, called with the logits of every prompt position (row of vocab_size floats).
  std::function<void(int64_t position, const float* logits)> on_prompt_logits;
  // Called with the logits each token is sampled from (after prefill, then each decode step).
  std::function<void(const float* logits)> on_step_logits;
  // Called once after prefill with the cache as compressed (kept positions per head).
  std::function<void(const PagedKvCache&)> on_prefilled;
};

// The checks every backend makes before it runs a request (prompt ids in the vocabulary, the
// context, the policy's own validate(), context-only vs layer-wise, the chunk): a one-line
// invalid_argument naming what is wrong. A backend adds its own refusals after these.
Status validate_generate_request(const ModelConfig& config, const GenerateRequest& request);

// Runs the request through `driver` (rank 0 of its group). The sequence is closed on
// every rank before this returns, also on error.
Result<GenerateResult> generate(StepDriver& driver, const GenerateRequest& request, const GenerateHooks& hooks = {});
// One process: a local worker over `model`.
Result<GenerateResult> generate(LlamaForward& model, const GenerateRequest& request, const GenerateHooks& hooks = {});

}  // namespace snap
