// ServerMetrics on prometheus-cpp 1.0.1: one registry, the metric families of
// metrics.h, and the text exposition for /metrics. Series that a dashboard expects
// to see before the first request (label-less ones, rank="0", every finished_reason)
// are created at construction, because the serializer omits families without series.
// prometheus-cpp's Family::Add, Counter, Gauge and Histogram are internally locked.
#include "coordinator/metrics/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <string>
#include <vector>

namespace snap {

namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// Boundaries follow vLLM's so that dashboards' bucket selectors port unchanged.
const Histogram::BucketBoundaries k_ttft_buckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries k_tpot_buckets = {
    0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
    0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0};
const Histogram::BucketBoundaries k_request_latency_buckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// full-equivalent bytes / resident bytes: 1 for `full`, N/B for snapkv.
const Histogram::BucketBoundaries k_ratio_buckets = {1.0, 1.5, 2.0,  3.0,  4.0,  6.0, 8.0,
                                                     12.0, 16.0, 24.0, 32.0, 48.0, 64.0};
// Selection is one scoring pass per layer and head: sub-millisecond for short prompts.
const Histogram::BucketBoundaries k_selection_buckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};
// One engine step: a decode step of a small model is ~ms, a 2K prefill chunk ~s.
const Histogram::BucketBoundaries k_step_buckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
    0.3,   0.5,    0.75,  1.0,  2.5,   5.0,  10.0,  20.0, 40.0};

const char* const k_finished_reasons[] = {"stop", "length", "abort", "timeout", "error"};
const char* const k_comm_ops[] = {"all_reduce", "broadcast", "all_gather"};
const char* const k_policies[] = {"full", "snapkv", "streaming", "h2o", "pyramidkv", "adakv"};
const char* const k_reject_reasons[] = {"queue_full", "shutting_down"};

}  // namespace

// ---------------------------------------------------------------------------------

struct ServerMetrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();

  Family<Gauge>* num_requests_running = nullptr;
  Family<Gauge>* num_requests_waiting = nullptr;
  Family<Gauge>* kv_cache_usage_ratio = nullptr;
  Family<Gauge>* kv_cache_resident_bytes = nullptr;
  Family<Gauge>* kv_cache_full_equivalent_bytes = nullptr;
  Family<Gauge>* process_resident_memory_bytes = nullptr;
  Family<Counter>* prompt_tokens = nullptr;
  Family<Counter>* generation_tokens = nullptr;
  Family<Counter>* request_success = nullptr;
  Family<Counter>* comm_bytes = nullptr;
  Family<Counter>* comm_seconds = nullptr;
  Family<Counter>* busy_seconds = nullptr;
  Family<Counter>* http_requests = nullptr;
  Family<Counter>* request_rejected = nullptr;
  Family<Counter>* decode_rows = nullptr;
  Family<Gauge>* rank_last_report = nullptr;
  Family<Gauge>* device_memory_bytes = nullptr;
  Family<Histogram>* inter_token_latency = nullptr;
  Family<Histogram>* time_to_first_token = nullptr;
  Family<Histogram>* time_per_output_token = nullptr;
  Family<Histogram>* e2e_request_latency = nullptr;
  Family<Histogram>* request_queue_time = nullptr;
  Family<Histogram>* request_prefill_time = nullptr;
  Family<Histogram>* kv_compression_ratio = nullptr;
  Family<Histogram>* snapkv_selection = nullptr;
  Family<Histogram>* step_latency = nullptr;

  // Every family carries model_name as a constant label, as vLLM's metrics do (its
  // dashboards filter on it).
  std::map<std::string, std::string> constant;
  Family<Gauge>* gauge(const std::string& name, const std::string& help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Labels(constant).Register(*registry);
  }
  Family<Counter>* counter(const std::string& name, const std::string& help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Labels(constant).Register(*registry);
  }
  Family<Histogram>* histogram(const std::string& name, const std::string& help) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Labels(constant).Register(*registry);
  }

  // Per-family boundaries, used whenever a labelled histogram series is first created.
  static Histogram& step_series(Family<Histogram>* f, const std::string& phase, int rank) {
    return f->Add({{"phase", phase}, {"rank", std::to_string(rank)}}, k_step_buckets);
  }
};

ServerMetrics::ServerMetrics(const std::string& model_name) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.constant = {{"model_name", model_name}};
  const std::string model = " (model " + model_name + ")";
  // Rank 0 gathers the other ranks' figures once a second (one all_gather between steps).
  const std::string k_lag = "; ranks other than 0 are gathered once a second, so their values lag by up to 1 s";

  m.num_requests_running =
      m.gauge("snapserve_num_requests_running", "Number of requests in prefill or decode" + model);
  m.num_requests_waiting = m.gauge("snapserve_num_requests_waiting",
                                   "Number of requests queued, waiting for KV memory or a slot");
  m.kv_cache_usage_ratio = m.gauge("snapserve_kv_cache_usage_ratio",
                                   "Fraction of KV cache pool blocks in use, 0 to 1");
  m.kv_cache_resident_bytes = m.gauge("snapserve_kv_cache_resident_bytes",
                                      "Bytes of KV cache resident on this rank, after compression" + k_lag);
  m.kv_cache_full_equivalent_bytes =
      m.gauge("snapserve_kv_cache_full_equivalent_bytes",
              "Bytes the KV cache of the running sequences would take on this rank uncompressed" + k_lag);
  m.process_resident_memory_bytes = m.gauge("snapserve_process_resident_memory_bytes",
                                            "Resident set size of the rank's process in bytes" + k_lag);
  // No series until a device engine sets one (a family without series is not exported).
  m.device_memory_bytes = m.gauge("snapserve_device_memory_bytes",
                                  "GPU memory of the rank's device in bytes, by kind: kv_pool_used, kv_pool_free, "
                                  "kv_pool_peak (most KV blocks ever in use), weights, scratch, in_use (all of "
                                  "this device's memory in use), total (serve --device cuda)");

  // prometheus-cpp 1.0.1 exposes a counter under exactly the family name, so the
  // _total suffix belongs in the name (tested in test_metrics.cpp).
  m.prompt_tokens = m.counter("snapserve_prompt_tokens_total", "Number of prompt tokens processed");
  m.generation_tokens =
      m.counter("snapserve_generation_tokens_total", "Number of generated tokens");
  m.request_success = m.counter("snapserve_request_success_total",
                                "Number of finished requests, by finished_reason");
  m.comm_bytes = m.counter("snapserve_comm_bytes_total",
                           "Bytes sent by collective operations, by rank and op" + k_lag);
  m.comm_seconds = m.counter("snapserve_comm_seconds_total",
                             "Seconds inside collective operations, waiting for other ranks included (a worker "
                             "rank's broadcast time includes waiting for the next step), by rank and op" + k_lag);
  m.busy_seconds = m.counter("snapserve_busy_seconds_total", "Seconds a rank spent running step plans, by rank" + k_lag);

  m.http_requests = m.counter("snapserve_http_requests_total",
                              "HTTP responses by route (a served path or \"other\") and status code");
  m.request_rejected = m.counter("snapserve_request_rejected_total",
                                 "Requests refused before running, by reason (queue_full: 429 past --max-waiting)");
  m.decode_rows = m.counter("snapserve_decode_rows_total",
                            "Decode rows by where their next token was chosen (serve --device cuda): device (greedy "
                            "rows needing nothing else of their logits: the GPU's argmax, no logits copied to the host) "
                            "or host (logits copied and sampled on the CPU)");
  m.rank_last_report = m.gauge("snapserve_rank_last_report_timestamp_seconds",
                               "Unix time of the last report rank 0 received from each rank (about once a second "
                               "while the group is alive; rank 0 included)");

  m.time_to_first_token = m.histogram("snapserve_time_to_first_token_seconds",
                                      "Time from request arrival to the first token, in seconds");
  m.time_per_output_token = m.histogram(
      "snapserve_time_per_output_token_seconds",
      "Per request: decode time over generated tokens minus one (the first token excluded), in seconds");
  m.inter_token_latency = m.histogram("snapserve_inter_token_latency_seconds",
                                      "Time between two consecutive output tokens of a request, in seconds");
  m.e2e_request_latency = m.histogram("snapserve_e2e_request_latency_seconds",
                                      "Time from request arrival to its last token, in seconds");
  m.request_queue_time = m.histogram("snapserve_request_queue_time_seconds",
                                     "Time a request waited in the queue before admission, in seconds");
  m.request_prefill_time = m.histogram("snapserve_request_prefill_time_seconds",
                                       "Time from admission to the end of prefill, in seconds");
  m.kv_compression_ratio =
      m.histogram("snapserve_kv_compression_ratio",
                  "Per compressed request: full-equivalent KV bytes over resident KV bytes (1 = uncompressed), "
                  "by KV policy");
  m.snapkv_selection = m.histogram("snapserve_snapkv_selection_seconds",
                                   "Time spent selecting SnapKV positions per sequence, in seconds");
  m.step_latency = m.histogram("snapserve_step_latency_seconds",
                               "Duration of one engine step on a rank, by phase, in seconds");

  // Pre-created series: a fresh server shows every family with zeros.
  m.num_requests_running->Add({});
  m.num_requests_waiting->Add({});
  m.kv_cache_usage_ratio->Add({});
  m.kv_cache_resident_bytes->Add({{"rank", "0"}});
  m.kv_cache_full_equivalent_bytes->Add({{"rank", "0"}});
  m.process_resident_memory_bytes->Add({{"rank", "0"}});
  m.prompt_tokens->Add({});
  m.generation_tokens->Add({});
  for (const char* reason : k_finished_reasons) m.request_success->Add({{"finished_reason", reason}});
  for (const char* op : k_comm_ops) m.comm_bytes->Add({{"rank", "0"}, {"op", op}});
  for (const char* op : k_comm_ops) m.comm_seconds->Add({{"rank", "0"}, {"op", op}});
  m.busy_seconds->Add({{"rank", "0"}});
  m.time_to_first_token->Add({}, k_ttft_buckets);
  m.time_per_output_token->Add({}, k_tpot_buckets);
  m.e2e_request_latency->Add({}, k_request_latency_buckets);
  m.request_queue_time->Add({}, k_request_latency_buckets);
  m.request_prefill_time->Add({}, k_request_latency_buckets);
  for (const char* p : k_policies) m.kv_compression_ratio->Add({{"policy", p}}, k_ratio_buckets);
  m.inter_token_latency->Add({}, k_tpot_buckets);
  for (const char* r : k_reject_reasons) m.request_rejected->Add({{"reason", r}});
  for (const char* on : {"device", "host"}) m.decode_rows->Add({{"sampled_on", on}});
  m.snapkv_selection->Add({}, k_selection_buckets);
  Impl::step_series(m.step_latency, "prefill", 0);
  Impl::step_series(m.step_latency, "decode", 0);
}

ServerMetrics::~ServerMetrics() = default;

// --- gauges ------------------------------------------------------------------------

void ServerMetrics::set_num_requests_running(int64_t n) {
  impl_->num_requests_running->Add({}).Set(static_cast<double>(n));
}
void ServerMetrics::set_num_requests_waiting(int64_t n) {
  impl_->num_requests_waiting->Add({}).Set(static_cast<double>(n));
}
void ServerMetrics::set_kv_cache_usage_ratio(double r) {
  impl_->kv_cache_usage_ratio->Add({}).Set(r);
}
void ServerMetrics::set_kv_cache_resident_bytes(int rank, int64_t bytes) {
  impl_->kv_cache_resident_bytes->Add({{"rank", std::to_string(rank)}})
      .Set(static_cast<double>(bytes));
}
void ServerMetrics::set_kv_cache_full_equivalent_bytes(int rank, int64_t bytes) {
  impl_->kv_cache_full_equivalent_bytes->Add({{"rank", std::to_string(rank)}})
      .Set(static_cast<double>(bytes));
}
void ServerMetrics::set_process_resident_memory_bytes(int rank, int64_t bytes) {
  impl_->process_resident_memory_bytes->Add({{"rank", std::to_string(rank)}})
      .Set(static_cast<double>(bytes));
}

// --- counters (negative increments are ignored by prometheus-cpp) --------------------

void ServerMetrics::add_prompt_tokens(int64_t n) {
  impl_->prompt_tokens->Add({}).Increment(static_cast<double>(n));
}
void ServerMetrics::add_generation_tokens(int64_t n) {
  impl_->generation_tokens->Add({}).Increment(static_cast<double>(n));
}
void ServerMetrics::add_request_success(const std::string& finished_reason) {
  impl_->request_success->Add({{"finished_reason", finished_reason}}).Increment();
}
void ServerMetrics::add_comm_bytes(int rank, const std::string& op, int64_t bytes) {
  impl_->comm_bytes->Add({{"rank", std::to_string(rank)}, {"op", op}})
      .Increment(static_cast<double>(bytes));
}
void ServerMetrics::add_comm_seconds(int rank, const std::string& op, double s) {
  impl_->comm_seconds->Add({{"rank", std::to_string(rank)}, {"op", op}}).Increment(s);
}
void ServerMetrics::add_busy_seconds(int rank, double s) {
  impl_->busy_seconds->Add({{"rank", std::to_string(rank)}}).Increment(s);
}
void ServerMetrics::add_http_response(const std::string& route, int status) {
  impl_->http_requests->Add({{"route", route}, {"code", std::to_string(status)}}).Increment();
}
void ServerMetrics::add_request_rejected(const std::string& reason) {
  impl_->request_rejected->Add({{"reason", reason}}).Increment();
}
void ServerMetrics::add_decode_rows(const std::string& sampled_on, int64_t n) {
  impl_->decode_rows->Add({{"sampled_on", sampled_on}}).Increment(static_cast<double>(n));
}
void ServerMetrics::set_rank_last_report_time(int rank, double unix_seconds) {
  impl_->rank_last_report->Add({{"rank", std::to_string(rank)}}).Set(unix_seconds);
}
void ServerMetrics::set_device_memory_bytes(int rank, const std::string& kind, int64_t bytes) {
  impl_->device_memory_bytes->Add({{"rank", std::to_string(rank)}, {"kind", kind}}).Set(static_cast<double>(bytes));
}

// --- histograms --------------------------------------------------------------------

void ServerMetrics::observe_time_to_first_token(double s) {
  impl_->time_to_first_token->Add({}, k_ttft_buckets).Observe(s);
}
void ServerMetrics::observe_time_per_output_token(double s) {
  impl_->time_per_output_token->Add({}, k_tpot_buckets).Observe(s);
}
void ServerMetrics::observe_e2e_request_latency(double s) {
  impl_->e2e_request_latency->Add({}, k_request_latency_buckets).Observe(s);
}
void ServerMetrics::observe_request_queue_time(double s) {
  impl_->request_queue_time->Add({}, k_request_latency_buckets).Observe(s);
}
void ServerMetrics::observe_request_prefill_time(double s) {
  impl_->request_prefill_time->Add({}, k_request_latency_buckets).Observe(s);
}
void ServerMetrics::observe_inter_token_latency(double s) {
  impl_->inter_token_latency->Add({}, k_tpot_buckets).Observe(s);
}
void ServerMetrics::observe_kv_compression_ratio(const std::string& policy, double full_equivalent_over_resident) {
  impl_->kv_compression_ratio->Add({{"policy", policy}}, k_ratio_buckets).Observe(full_equivalent_over_resident);
}
void ServerMetrics::observe_snapkv_selection(double s) {
  impl_->snapkv_selection->Add({}, k_selection_buckets).Observe(s);
}
void ServerMetrics::observe_step_latency(const std::string& phase, int rank, double s) {
  Impl::step_series(impl_->step_latency, phase, rank).Observe(s);
}

std::string ServerMetrics::serialize() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace snap
