// Where `snapserve eval run` sends its prompts: the in-process engine (continuous batching,
// the task's KV policy and question placement applied exactly), or any OpenAI-compatible
// server at a URL (/v1/chat/completions or /v1/completions, greedy, not streamed; the
// kv_compression field is sent only when a policy is asked for, which only snapserve knows).
// complete() blocks and may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/policy.h"

namespace snap::eval {

struct CompletionJob {
  std::vector<int32_t> prompt_ids;  // engine
  std::string prompt_text;          // url (chat: the user message)
  int64_t max_tokens = 32;
  KvPolicy policy;                  // context_tokens set for context-only placement
  bool send_policy = true;          // url: send kv_compression
};

struct Completion {
  std::string text;
  std::string finish_reason;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t kv_resident_bytes = 0;
  int64_t kv_full_equivalent_bytes = 0;
  double seconds = 0;
};

class EvalBackend {
 public:
  virtual ~EvalBackend() = default;
  virtual Result<Completion> complete(const CompletionJob& job) = 0;
  virtual std::string describe() const = 0;  // "engine" or the URL
  virtual std::string model_name() const = 0;
  virtual void shutdown() {}
};

struct EngineBackendOptions {
  std::string model_path;
  int threads = 0;
  int64_t kv_cache_mib = 1024;
  int64_t max_num_seqs = 4;
  int64_t prefill_chunk = 256;
  DType kv_dtype = k_default_kv_dtype;  // the engine's KV pool element type (--kv-dtype)
};
Result<std::unique_ptr<EvalBackend>> make_engine_backend(const EngineBackendOptions& o);

struct UrlBackendOptions {
  std::string url;       // http://host:port[/prefix]
  std::string api_key;
  std::string model;     // "" = the first id of GET /v1/models
  bool chat = true;
  double timeout_s = 600;
};
Result<std::unique_ptr<EvalBackend>> make_url_backend(const UrlBackendOptions& o);

}  // namespace snap::eval
