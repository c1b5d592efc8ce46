// ServerMetrics: every metric of issue 5 appears in /metrics' text from the start (with
// zeros), recorded values land in the right series with the right labels and buckets,
// counters are exposed under exactly one _total, and `promtool check metrics` accepts it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "coordinator/metrics/metrics.h"
#include "tests/prom_text.h"

namespace {

namespace fs = std::filesystem;

// "name{labels} value" lines → map from "name{labels}" (model_name left out) to value.
std::map<std::string, double> parse_samples(const std::string& text) { return snap::testing::prom_samples(text); }

// The value of one series; fails the test (and returns NaN) when it is absent.
double sample(const std::map<std::string, double>& samples, const std::string& key) {
  auto it = samples.find(key);
  EXPECT_NE(it, samples.end()) << "series missing from /metrics: " << key;
  return it == samples.end() ? std::nan("") : it->second;
}

const char* const k_gauges[] = {"snapserve_num_requests_running", "snapserve_num_requests_waiting",
                                "snapserve_kv_cache_usage_ratio",
                                "snapserve_kv_cache_resident_bytes",
                                "snapserve_kv_cache_full_equivalent_bytes",
                                "snapserve_process_resident_memory_bytes"};
const char* const k_counters[] = {"snapserve_prompt_tokens_total",
                                  "snapserve_generation_tokens_total",
                                  "snapserve_request_success_total", "snapserve_comm_bytes_total",
                                  "snapserve_comm_seconds_total", "snapserve_busy_seconds_total",
                                  "snapserve_request_rejected_total", "snapserve_decode_rows_total"};
const char* const k_histograms[] = {
    "snapserve_time_to_first_token_seconds",  "snapserve_time_per_output_token_seconds",
    "snapserve_e2e_request_latency_seconds",  "snapserve_request_queue_time_seconds",
    "snapserve_request_prefill_time_seconds", "snapserve_kv_compression_ratio",
    "snapserve_snapkv_selection_seconds",     "snapserve_step_latency_seconds",
    "snapserve_inter_token_latency_seconds"};

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST(Metrics, FreshRegistryShowsEveryFamilyWithZeros) {
  const std::string k_model = "SmolLM2-135M-Instruct";
  snap::ServerMetrics m(k_model);
  const std::string text = m.serialize();
  for (const char* g : k_gauges) {
    EXPECT_TRUE(contains(text, std::string("# TYPE ") + g + " gauge\n")) << g;
    EXPECT_TRUE(contains(text, std::string("# HELP ") + g + " ")) << g;
  }
  for (const char* c : k_counters) {
    EXPECT_TRUE(contains(text, std::string("# TYPE ") + c + " counter\n")) << c;
  }
  for (const char* h : k_histograms) {
    EXPECT_TRUE(contains(text, std::string("# TYPE ") + h + " histogram\n")) << h;
  }
  const auto s = parse_samples(text);
  EXPECT_EQ(sample(s, "snapserve_num_requests_running"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_kv_cache_resident_bytes{rank=\"0\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_generation_tokens_total"), 0.0);
  for (const char* reason : {"stop", "length", "abort", "timeout", "error"}) {
    EXPECT_EQ(sample(s, std::string("snapserve_request_success_total{finished_reason=\"") +
                            reason + "\"}"),
              0.0);
  }
  EXPECT_EQ(sample(s, "snapserve_time_to_first_token_seconds_count"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_step_latency_seconds_count{phase=\"decode\",rank=\"0\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_request_rejected_total{reason=\"shutting_down\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_decode_rows_total{sampled_on=\"device\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_decode_rows_total{sampled_on=\"host\"}"), 0.0);
  // Every series carries the served model's name, as vLLM's do.
  std::istringstream lines(text);
  std::string line;
  int series = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    ++series;
    EXPECT_NE(line.find("model_name=\"" + k_model + "\""), std::string::npos) << line;
  }
  EXPECT_GT(series, 50);
}

TEST(Metrics, CounterNamesCarryExactlyOneTotalSuffix) {
  snap::ServerMetrics m("model");
  m.add_prompt_tokens(3);
  const std::string text = m.serialize();
  EXPECT_FALSE(contains(text, "_total_total")) << text;
  const auto s = parse_samples(text);
  EXPECT_EQ(sample(s, "snapserve_prompt_tokens_total"), 3.0);
}

TEST(Metrics, RecordedValuesLandInTheirSeries) {
  snap::ServerMetrics m("model");
  m.set_num_requests_running(3);
  m.set_num_requests_waiting(7);
  m.set_kv_cache_usage_ratio(0.25);
  m.set_kv_cache_resident_bytes(0, 1048576);
  m.set_kv_cache_resident_bytes(1, 524288);
  m.set_kv_cache_full_equivalent_bytes(1, 4194304);
  m.set_process_resident_memory_bytes(2, 123456789);
  m.add_prompt_tokens(64);
  m.add_prompt_tokens(36);
  m.add_generation_tokens(8);
  m.add_request_success("stop");
  m.add_request_success("stop");
  m.add_request_success("length");
  m.add_comm_bytes(1, "all_reduce", 4608);
  m.add_comm_bytes(1, "all_reduce", 4608);
  m.add_comm_seconds(2, "all_gather", 0.25);
  m.add_comm_seconds(2, "all_gather", 0.5);
  m.add_busy_seconds(1, 1.5);
  m.add_http_response("/v1/completions", 200);
  m.add_http_response("/v1/completions", 200);
  m.add_http_response("/v1/chat/completions", 429);
  m.add_request_rejected("queue_full");
  m.set_rank_last_report_time(1, 1.7e9);

  const auto s = parse_samples(m.serialize());
  EXPECT_EQ(sample(s, "snapserve_num_requests_running"), 3.0);
  EXPECT_EQ(sample(s, "snapserve_num_requests_waiting"), 7.0);
  EXPECT_EQ(sample(s, "snapserve_kv_cache_usage_ratio"), 0.25);
  EXPECT_EQ(sample(s, "snapserve_kv_cache_resident_bytes{rank=\"0\"}"), 1048576.0);
  EXPECT_EQ(sample(s, "snapserve_kv_cache_resident_bytes{rank=\"1\"}"), 524288.0);
  EXPECT_EQ(sample(s, "snapserve_kv_cache_full_equivalent_bytes{rank=\"1\"}"), 4194304.0);
  EXPECT_EQ(sample(s, "snapserve_process_resident_memory_bytes{rank=\"2\"}"), 123456789.0);
  EXPECT_EQ(sample(s, "snapserve_prompt_tokens_total"), 100.0);
  EXPECT_EQ(sample(s, "snapserve_generation_tokens_total"), 8.0);
  EXPECT_EQ(sample(s, "snapserve_request_success_total{finished_reason=\"stop\"}"), 2.0);
  EXPECT_EQ(sample(s, "snapserve_request_success_total{finished_reason=\"length\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_request_success_total{finished_reason=\"abort\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_comm_bytes_total{op=\"all_reduce\",rank=\"1\"}"), 9216.0);
  EXPECT_EQ(sample(s, "snapserve_comm_seconds_total{op=\"all_gather\",rank=\"2\"}"), 0.75);
  EXPECT_EQ(sample(s, "snapserve_busy_seconds_total{rank=\"1\"}"), 1.5);
  EXPECT_EQ(sample(s, "snapserve_http_requests_total{code=\"200\",route=\"/v1/completions\"}"), 2.0);
  EXPECT_EQ(sample(s, "snapserve_http_requests_total{code=\"429\",route=\"/v1/chat/completions\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_request_rejected_total{reason=\"queue_full\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_rank_last_report_timestamp_seconds{rank=\"1\"}"), 1.7e9);
  EXPECT_EQ(sample(s, "snapserve_busy_seconds_total{rank=\"0\"}"), 0.0);
}

TEST(Metrics, HistogramObservationsFillCumulativeBuckets) {
  snap::ServerMetrics m("model");
  m.observe_time_to_first_token(0.05);   // between the 0.04 and 0.06 boundaries
  m.observe_time_to_first_token(3000.0);  // past the last boundary (2560): +Inf only
  m.observe_time_per_output_token(0.02);
  m.observe_e2e_request_latency(1.2);
  m.observe_request_queue_time(0.1);
  m.observe_request_prefill_time(0.4);
  m.observe_kv_compression_ratio("snapkv", 4.0);
  m.observe_inter_token_latency(0.03);
  m.observe_snapkv_selection(0.003);
  m.observe_step_latency("decode", 1, 0.02);

  const auto s = parse_samples(m.serialize());
  const std::string ttft = "snapserve_time_to_first_token_seconds";
  EXPECT_EQ(sample(s, ttft + "_bucket{le=\"0.001\"}"), 0.0);
  EXPECT_EQ(sample(s, ttft + "_bucket{le=\"0.04\"}"), 0.0);
  EXPECT_EQ(sample(s, ttft + "_bucket{le=\"0.06\"}"), 1.0);
  EXPECT_EQ(sample(s, ttft + "_bucket{le=\"2560\"}"), 1.0);
  EXPECT_EQ(sample(s, ttft + "_bucket{le=\"+Inf\"}"), 2.0);
  EXPECT_EQ(sample(s, ttft + "_count"), 2.0);
  EXPECT_NEAR(sample(s, ttft + "_sum"), 3000.05, 1e-9);

  EXPECT_EQ(sample(s, "snapserve_time_per_output_token_seconds_bucket{le=\"0.01\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_time_per_output_token_seconds_bucket{le=\"0.025\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_e2e_request_latency_seconds_bucket{le=\"1\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_e2e_request_latency_seconds_bucket{le=\"1.5\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_e2e_request_latency_seconds_bucket{le=\"7680\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_request_queue_time_seconds_count"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_request_prefill_time_seconds_bucket{le=\"0.3\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_request_prefill_time_seconds_bucket{le=\"0.5\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_kv_compression_ratio_bucket{policy=\"snapkv\",le=\"3\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_kv_compression_ratio_bucket{policy=\"snapkv\",le=\"4\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_kv_compression_ratio_bucket{policy=\"snapkv\",le=\"64\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_kv_compression_ratio_count{policy=\"full\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_inter_token_latency_seconds_bucket{le=\"0.025\"}"), 0.0);
  EXPECT_EQ(sample(s, "snapserve_inter_token_latency_seconds_bucket{le=\"0.05\"}"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_snapkv_selection_seconds_count"), 1.0);
  EXPECT_EQ(sample(s, "snapserve_step_latency_seconds_count{phase=\"decode\",rank=\"1\"}"), 1.0);
  EXPECT_EQ(
      sample(s, "snapserve_step_latency_seconds_bucket{phase=\"decode\",rank=\"1\",le=\"0.025\"}"),
      1.0);
  EXPECT_EQ(sample(s, "snapserve_step_latency_seconds_count{phase=\"prefill\",rank=\"0\"}"), 0.0);
}

TEST(Metrics, ConcurrentRecordingAndSerializingLosesNothing) {
  snap::ServerMetrics m("model");
  constexpr int k_per_thread = 2000;
  std::thread a([&] {
    for (int i = 0; i < k_per_thread; ++i) m.add_generation_tokens(1);
  });
  std::thread b([&] {
    for (int i = 0; i < k_per_thread; ++i) m.observe_step_latency("decode", i % 3, 0.01);
  });
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(m.serialize().empty());
  a.join();
  b.join();
  const auto s = parse_samples(m.serialize());
  EXPECT_EQ(sample(s, "snapserve_generation_tokens_total"), double(k_per_thread));
  double steps = 0;
  for (int r = 0; r < 3; ++r) {
    steps += sample(s, "snapserve_step_latency_seconds_count{phase=\"decode\",rank=\"" +
                           std::to_string(r) + "\"}");
  }
  EXPECT_EQ(steps, double(k_per_thread));
}

TEST(Metrics, PromtoolAcceptsTheExposition) {
  const char* promtool = "/usr/bin/promtool";
  ASSERT_TRUE(fs::exists(promtool))
      << promtool << " missing: install the Debian package `prometheus` (scripts/setup.sh)";
  snap::ServerMetrics m("SmolLM2-135M-Instruct");
  m.set_kv_cache_resident_bytes(1, 1000);
  m.add_request_success("stop");
  m.add_comm_bytes(0, "all_reduce", 10);
  m.observe_time_to_first_token(0.2);
  m.observe_step_latency("prefill", 1, 0.5);

  const fs::path dir = fs::temp_directory_path() / ("snap_metrics_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path in = dir / "metrics.txt", out = dir / "promtool.out";
  {
    std::ofstream f(in);
    f << m.serialize();
  }
  const std::string cmd =
      std::string(promtool) + " check metrics <" + in.string() + " >" + out.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream o(out);
  const std::string report((std::istreambuf_iterator<char>(o)), {});
  fs::remove_all(dir);
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 0) << "promtool check metrics:\n" << report;
}

}  // namespace
