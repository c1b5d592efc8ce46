// Prometheus metrics of the service, named after vLLM's (prefix snapserve_ instead of
// vllm:) so existing dashboards port by a rename, plus our KV-compression and per-rank
// series. One registry per process; rank 0 exports every rank's numbers (workers report
// theirs to rank 0 each step), so one scrape target shows the whole job.
// Thread-safe: the engine thread records, the HTTP thread serializes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace snap {

class ServerMetrics {
 public:
  // model_name labels nothing today but is kept for /metrics' HELP text.
  explicit ServerMetrics(const std::string& model_name);
  ~ServerMetrics();

  // --- scheduler state (gauges)
  void set_num_requests_running(int64_t n);
  void set_num_requests_waiting(int64_t n);
  void set_kv_cache_usage_ratio(double r);  // blocks in use / pool blocks, 0..1
  // --- per rank (gauges), label rank="N"
  void set_kv_cache_resident_bytes(int rank, int64_t bytes);
  void set_kv_cache_full_equivalent_bytes(int rank, int64_t bytes);
  void set_process_resident_memory_bytes(int rank, int64_t bytes);
  // --- counters
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  void add_request_success(const std::string& finished_reason);  // stop | length | abort | timeout
  void add_comm_bytes(int rank, const std::string& op, int64_t bytes);  // all_reduce | broadcast | all_gather
  // Wall time inside collectives (waiting for other ranks included), and a rank's time
  // running step plans: imbalance and communication cost, per rank.
  void add_comm_seconds(int rank, const std::string& op, double s);
  void add_busy_seconds(int rank, double s);
  // Every HTTP response: route is a known path ("/v1/completions", ...) or "other"; code
  // the status ("200", "429"). Request and error rates for dashboards.
  void add_http_response(const std::string& route, int status);
  // Requests refused before running: reason "queue_full" (429 from --max-waiting).
  void add_request_rejected(const std::string& reason);
  // Decode rows by where their next token was chosen (serve --device cuda): "device" (greedy
  // rows that need nothing else of their logits: the GPU's argmax, no logits to the host) or
  // "host" (logits copied to the host and sampled there).
  void add_decode_rows(const std::string& sampled_on, int64_t n);
  // Unix time at which rank 0 last received a rank's report (rank 0's own included): a
  // rank whose value stops advancing is silent (hung, or the group is stuck).
  void set_rank_last_report_time(int rank, double unix_seconds);
  // GPU memory of a rank's device (serve --device cuda), label kind: kv_pool_used,
  // kv_pool_free, kv_pool_peak, weights, scratch, in_use, total.
  void set_device_memory_bytes(int rank, const std::string& kind, int64_t bytes);
  // --- histograms (seconds unless named otherwise)
  void observe_time_to_first_token(double s);
  // Per request: decode time / (generated tokens - 1), as `vllm bench serve`'s TPOT.
  void observe_time_per_output_token(double s);
  // Each gap between two consecutive tokens of a request.
  void observe_inter_token_latency(double s);
  void observe_e2e_request_latency(double s);
  void observe_request_queue_time(double s);
  void observe_request_prefill_time(double s);
  // policy: full | snapkv | streaming | h2o | pyramidkv | adakv
  void observe_kv_compression_ratio(const std::string& policy, double full_equivalent_over_resident);
  void observe_snapkv_selection(double s);
  void observe_step_latency(const std::string& phase, int rank, double s);  // phase: prefill | decode

  // The Prometheus text exposition format (version 0.0.4) of every series.
  std::string serialize() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace snap
