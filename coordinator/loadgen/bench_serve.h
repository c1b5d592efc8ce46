// `snapserve bench serve`: a load generator for an OpenAI-compatible server, like
// `vllm bench serve`. C client threads, one keep-alive connection each, send R streaming
// requests with synthetic prompts of about L tokens and report TTFT, TPOT, ITL and
// end-to-end latency (mean, p50, p90, p99) and throughput as a table and as JSON.
// Server errors, refusals (429) and timeouts are counted as failures, never a crash.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace snap {

struct BenchServeArgs {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // "" = ask the server's /v1/models (omitted if that fails)
  int concurrency = 1;
  int64_t prompt_len = 256;  // approximate; the server's usage gives the exact count
  int64_t max_tokens = 128;
  int64_t requests = 16;
  uint64_t seed = 0;
  std::string api_key;
  std::string kv_policy;     // "" = server default; else sent as kv_compression.policy
  int64_t kv_budget = 0;     // > 0: sent as kv_compression.budget
  bool chat = false;         // /v1/chat/completions instead of /v1/completions
  bool ignore_eos = false;
  std::string json_path;     // "" = no JSON file
  double timeout_s = 600;    // per request, connect to last byte
};

// Registers `bench` with its `serve` subcommand on app, filling args.
void add_bench_subcommand(CLI::App& app, BenchServeArgs& args);

// Runs the benchmark; prints the table to stdout. 0 when at least one request completed
// (and the JSON file, if asked, was written); 1 on a bad argument or if all failed.
int run_bench_serve(const BenchServeArgs& args);

}  // namespace snap
