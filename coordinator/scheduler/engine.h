// Engine: the serving core behind the HTTP front-end. It owns the model, the tokenizer and
// the KV block pool, and runs one scheduler thread that forms steps — decode tokens of
// every running sequence batched together, plus chunks of waiting prompts' prefill — so
// running streams keep flowing while new prompts are admitted (continuous batching).
// A request is admitted only when its KV reservation fits the pool (with SnapKV the size
// after compression is known in advance); past `max_waiting` queued requests submit()
// refuses (HTTP 429). Results flow back through a per-request EventSink.
// Tensor parallelism: with EngineConfig::comm the engine is group rank 0; it loads its
// shard and drives the other ranks (each in worker_loop) with one StepPlan per step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/status.h"
#include "coordinator/metrics/metrics.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "kernels/kernels.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/policy.h"
#include "worker/model/config.h"

namespace snap {

struct EngineConfig {
  std::string model_path;
  std::string served_model_name;  // /v1/models id; default: the file's base name
  int threads = 0;                // 0: all cores
  int64_t kv_cache_bytes = 512LL << 20;  // block pool size
  int kv_block_size = 16;
  DType kv_dtype = k_default_kv_dtype;  // K/V element type: f32, bf16, f16 or q8_0 (--kv-dtype)
  std::string weight_dtype = "auto";    // --weight-dtype (worker/model/weights.h apply_weight_dtype); cuda: bf16 or q8_0
  // A compressing request over its whole prompt that did not ask for layer-wise prefill
  // gets it when that peaks lower (coordinator/engine/prefill_choice.h), unless it wants
  // prompt logprobs; its finished event says which (prefill_kind).
  bool auto_layerwise = true;
  int64_t max_num_seqs = 16;      // sequences running at once
  int64_t max_waiting = 64;       // requests queued beyond the free sequence slots; more are refused
  int64_t prefill_chunk = 256;    // prompt tokens per sequence per step
  int64_t max_prompt_tokens = 0;  // 0: the model's context
  int64_t max_tokens_limit = 0;   // upper bound on a request's max_tokens; 0: the model's context
  // The tensor-parallel group this engine leads (group rank 0), or null for one process.
  // Must outlive the engine. KV sizes (kv_cache_bytes, reservations) are per rank.
  comm::Communicator* comm = nullptr;
  // serve --device cuda with tp > 1: the device forward's exchange (NCCL on device buffers),
  // or null: staged through `comm` (worker/device/device_engine.cpp).
  comm::Communicator* device_exchange = nullptr;
  DType device_exchange_dtype = DType::f32;  // its all-reduce's wire type: f32 or bf16
  // Faults of that group (coordinator/scheduler/group_watchdog.h): a step plan past its
  // deadline (step_timeout_seconds + an allowance for its tokens), a rank on this host that
  // died, or a communication error fails the group: every open request finishes with an
  // unavailable error (HTTP 503, an error event on a stream), healthy() turns false,
  // submit() refuses, and on_group_failure is called once, from any thread (the serving
  // process then exits non-zero so that its launcher restarts the group).
  double step_timeout_seconds = 20;
  std::function<void(const std::string& why)> on_group_failure;
  // A worker rank got a stop signal (its RankReport asks for a drain): called once.
  std::function<void()> on_drain_request;
};

struct EngineRequest {
  std::vector<int32_t> prompt_ids;
  int64_t max_tokens = 16;
  kernels::SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool ignore_eos = false;
  KvPolicy kv_policy;             // full by default
  double timeout_seconds = 0;     // 0: none; past it the request finishes with "timeout"
  // Logits processing before sampling (logits_processing.h): penalties, logit_bias, and
  // min_tokens masking of EOS and stop_token_ids.
  float presence_penalty = 0.0f;    // OpenAI: minus this once a token has appeared in the output
  float frequency_penalty = 0.0f;   // OpenAI: minus this per appearance in the output
  float repetition_penalty = 1.0f;  // HF/vLLM: tokens of prompt or output, logit / p if > 0 else * p
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the token's logit
  int64_t min_tokens = 0;           // EOS and stop_token_ids cannot be sampled before this many tokens
  std::vector<int32_t> stop_token_ids;  // sampling one ends the output (finish "stop"); not part of it
  int logprobs = -1;  // -1: none; k >= 0: each output token's log-probability and the k most likely
  // Choices of this prompt: the prompt is prefilled (and compressed) once, then its KV cache
  // is copied into n - 1 more sequences that sample on their own (choice c uses seed + c).
  // Events carry the choice in EngineEvent::index; each choice ends with its own finished
  // event. n counts against max_num_seqs and the KV reservation covers all n copies.
  int n = 1;
  // >= 0: the log-probability of every prompt token after the first given the ones before it,
  // with this many alternatives (OpenAI's echo with logprobs, what log-likelihood harnesses
  // use). Each prompt chunk then runs in a step of its own with every position's logits.
  // With it, max_tokens may be 0 (score the prompt, generate nothing).
  int prompt_logprobs = -1;
};

// One prompt token's log-probability given the tokens before it.
struct PromptLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

struct EngineEvent {
  enum class Kind : uint8_t { token, finished };
  Kind kind = Kind::token;
  int index = 0;           // the choice (0 .. EngineRequest::n - 1)
  std::string text;        // newly decoded text (always whole UTF-8 characters); may be empty
  int32_t token_id = -1;   // kind == token
  // kind == token: EOS or a stop_token_id that ended the output (not part of the completion).
  bool stop_token = false;
  // kind == token with EngineRequest::logprobs >= 0: log-softmax of the model's raw logits
  // (before penalties, logit_bias, temperature and filters, like vLLM's default) at token_id,
  // and the `logprobs` most likely tokens, most likely first (lower id first on ties).
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  // kind == finished:
  std::string finish_reason;  // "stop", "length", "abort" (cancelled), "timeout", "error"
  std::string stop_string;      // "stop" by a stop string: which one
  int32_t stop_token_id = -1;   // "stop" by one of stop_token_ids: which one (-1: EOS or none)
  Status error;               // set when finish_reason == "error"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // kind == finished of choice 0, with EngineRequest::prompt_logprobs >= 0: prompt tokens
  // 1 .. N-1 (the first has no context to be scored in).
  std::vector<PromptLogprob> prompt_logprobs;
  int64_t kv_resident_bytes = 0;         // at the end of the request
  int64_t kv_full_equivalent_bytes = 0;  // what the uncompressed cache would have held
  std::string prefill_kind = "chunked";  // "chunked", "layerwise" (asked) or "layerwise_auto"
};

// Called on the engine thread, in order, ending with exactly one `finished` event. Must
// not block (queue the event and return).
using EventSink = std::function<void(const EngineEvent&)>;

struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  // Since start: the most sequences one step's forward carried (decode tokens of running
  // sequences plus a prompt chunk), and the most KV blocks ever in use at once (this rank).
  int64_t peak_step_sequences = 0;
  int64_t peak_kv_blocks_used = 0;
};

class Engine {
 public:
  // Loads the model and tokenizer, allocates the pool, starts the scheduler thread.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& cfg, ServerMetrics* metrics);
  virtual ~Engine() = default;

  // Validates (prompt length, max_tokens, policy: invalid_argument with a message naming
  // the field) and queues. resource_exhausted when the queue is full. Returns a request id.
  virtual Result<uint64_t> submit(EngineRequest request, EventSink sink) = 0;
  // Cancels a queued or running request (client disconnected): its blocks are freed and
  // its sink receives finished/"abort". Unknown ids are ignored.
  virtual void cancel(uint64_t id) = 0;

  virtual const Tokenizer& tokenizer() const = 0;
  virtual const ModelConfig& model_config() const = 0;
  virtual const std::string& model_name() const = 0;
  // True when the model is loaded and the scheduler (and every worker rank) answers.
  virtual bool healthy() const = 0;
  virtual EngineStats stats() const = 0;
  // Stops accepting, lets running requests finish until `deadline_seconds` from now, then
  // cancels the rest and joins the scheduler thread.
  virtual void shutdown(double deadline_seconds) = 0;
};

}  // namespace snap
