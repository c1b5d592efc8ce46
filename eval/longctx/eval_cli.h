// The long-context subcommands of `snapserve eval`:
//   eval run     a sweep of generated tasks through the engine or an OpenAI URL -> JSONL
//   eval report  JSONL records -> markdown tables + SVG heatmaps and curves
//   eval tasks   the generated tasks themselves (JSONL), to inspect or to check a seed
// add_longctx_eval_commands registers them on the `eval` parent; each callback runs its
// command and stores the exit code in *rc.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "eval/longctx/sweep.h"

namespace snap::eval {

struct RunArgs {
  SweepFlags sweep;
  std::string output;
  std::string model;          // engine model, and the tokenizer for --url
  std::string url;            // "" = in process
  std::string api_key;
  std::string served_model;   // --url: the request's model field ("" = ask /v1/models)
  std::string haystack_dir;
  bool no_chat = false;       // completions prompts instead of the chat template
  bool server_policy = false; // --url: send no kv_compression (the server's own KV)
  int64_t max_tokens = 0;     // 0: per task
  int concurrency = 4;
  int threads = 0;
  int64_t kv_cache_mib = 1024;
  int64_t prefill_chunk = 256;
  std::string kv_dtype = "f32";  // in process: the engine's KV element type; not f32 names the cases
  double timeout_s = 600;
  double progress_interval = 5;
};

struct ReportArgs {
  std::vector<std::string> inputs;
  std::string output_dir;
  std::string title = "snapserve eval report";
};

int run_eval(const RunArgs& a);
int run_eval_tasks(const RunArgs& a);
int run_eval_report(const ReportArgs& a);

void add_longctx_eval_commands(CLI::App& eval, int* rc);

}  // namespace snap::eval
