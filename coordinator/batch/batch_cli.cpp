// `snapserve batch` (see batch_cli.h): the input is read twice — once for its SHA-256 and
// the count of this shard's lines, once to run them — and each line's body goes through the
// same parse_api_request as `serve`, so a line fails in batch exactly as it would over
// HTTP. The main thread reads lines, keeps up to 2 x --max-num-seqs of them in the engine,
// and writes each finished one as a record (batch_io.h: one write + fdatasync). Records
// are written in completion order; `batch merge` (or the line numbers) gives input order.
#include "coordinator/batch/batch_cli.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/sha256.h"
#include "common/sys.h"
#include "coordinator/batch/batch_io.h"
#include "coordinator/engine/model_path.h"
#include "coordinator/http/openai.h"
#include "coordinator/http/serve_cli.h"
#include "coordinator/scheduler/engine.h"

namespace snap {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

int batch_fail(const std::string& message) {
  std::fprintf(stderr, "snapserve batch: error: %s\n", message.c_str());
  return 1;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// FNV-1a of the custom_id: the sampling seed of a line that sets none, so a rerun (or a
// resumed shard) draws the same tokens as the first run.
uint64_t seed_for(const std::string& custom_id) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : custom_id) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// --- preparing one line -------------------------------------------------------------------

struct Prepared {
  std::optional<ApiError> error;
  ApiRequest request;
  std::optional<BatchTruncation> truncated;
};

ApiRoute route_of(const BatchInput& in) {
  return in.url == BatchUrl::completions ? ApiRoute::completions : ApiRoute::chat_completions;
}

// The message whose content is longest, as a string (text parts joined); -1 when none.
int longest_message(json& body) {
  json* m = body.contains("messages") ? &body["messages"] : nullptr;
  if (!m || !m->is_array()) return -1;
  int best = -1;
  size_t best_len = 0;
  for (size_t i = 0; i < m->size(); ++i) {
    json& msg = (*m)[i];
    if (!msg.is_object() || !msg.contains("content")) continue;
    json& c = msg["content"];
    if (c.is_array()) {  // join text parts into one string (what the parser does anyway)
      std::string joined;
      for (const json& part : c) {
        if (part.is_object() && part.contains("text") && part["text"].is_string()) joined += part["text"].get<std::string>();
      }
      c = joined;
    }
    if (c.is_string() && c.get<std::string>().size() >= best_len) {
      best = static_cast<int>(i);
      best_len = c.get<std::string>().size();
    }
  }
  return best;
}

class LinePreparer {
 public:
  LinePreparer(const Tokenizer& tok, ApiContext ctx, std::string truncate, std::optional<json> default_kv)
      : tok_(tok), ctx_(std::move(ctx)), truncate_(std::move(truncate)), default_kv_(std::move(default_kv)) {
    relaxed_ = ctx_;
    relaxed_.context_length = 0;
    relaxed_.max_prompt_tokens = 0;
    relaxed_.max_tokens_limit = ctx_.context_length;
  }

  Prepared prepare(const BatchInput& in) const {
    Prepared p;
    json body = json::parse(in.body);  // parse_batch_line checked it is an object
    body.erase("model");                // a batch runs --model, whatever the line names
    body.erase("stream");               // one record per line: never streamed
    body.erase("stream_options");
    if (!body.contains("seed") || body["seed"].is_null()) body["seed"] = seed_for(in.custom_id);
    if (default_kv_ && (!body.contains("kv_compression") || body["kv_compression"].is_null())) {
      body["kv_compression"] = *default_kv_;
    }
    const ApiRoute route = route_of(in);
    ApiParse parsed = parse_api_request(route, dump(body), ctx_);
    if (!parsed.error || truncate_.empty()) {
      p.error = std::move(parsed.error);
      p.request = std::move(parsed.request);
      return p;
    }
    // Too long? Parse without the length limits to see the prompt's size.
    ApiParse loose = parse_api_request(route, dump(body), relaxed_);
    if (loose.error) {  // not a length problem
      p.error = std::move(parsed.error);
      return p;
    }
    const int64_t context = ctx_.context_length;
    const int64_t max_prompt = ctx_.max_prompt_tokens > 0 ? ctx_.max_prompt_tokens : context;
    const int64_t n0 = static_cast<int64_t>(loose.request.engine.prompt_ids.size());
    const bool explicit_tokens = (body.contains("max_tokens") && !body["max_tokens"].is_null()) ||
                                 (body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null());
    const int64_t reserve = explicit_tokens ? loose.request.engine.max_tokens
                            : route == ApiRoute::completions ? 16
                                                             : std::min<int64_t>(256, context / 4);
    const int64_t keep = std::min(max_prompt, context - reserve);
    if (n0 <= keep || keep < 1) {  // the length was not the problem, or nothing can fit
      p.error = std::move(parsed.error);
      return p;
    }
    const bool left = truncate_ == "left";
    if (route == ApiRoute::completions) {
      std::vector<int32_t> ids = loose.request.engine.prompt_ids;
      const bool bos = tok_.add_bos() && tok_.bos_id() >= 0 && ids.front() == tok_.bos_id();
      std::vector<int32_t> cut;
      if (left) {
        if (bos) cut.push_back(ids.front());
        cut.insert(cut.end(), ids.end() - (keep - (bos ? 1 : 0)), ids.end());
      } else {
        cut.assign(ids.begin(), ids.begin() + keep);
      }
      body["prompt"] = cut;
    } else {
      const int at = longest_message(body);
      if (at < 0) {
        p.error = std::move(parsed.error);
        return p;
      }
      json& content = body["messages"][at]["content"];
      const std::vector<int32_t> tokens = tok_.encode(content.get<std::string>(), false);
      int64_t drop = n0 - keep;
      for (int attempt = 0;; ++attempt) {
        if (drop >= static_cast<int64_t>(tokens.size()) || attempt == 8) {
          p.error = parsed.error;
          p.error->message += " (--truncate " + truncate_ + " cannot fit it: the longest message has " +
                              std::to_string(tokens.size()) + " tokens, " + std::to_string(n0 - keep) + " must go)";
          return p;
        }
        const int64_t rest = static_cast<int64_t>(tokens.size()) - drop;
        const std::vector<int32_t> kept =
            left ? std::vector<int32_t>(tokens.end() - rest, tokens.end()) : std::vector<int32_t>(tokens.begin(), tokens.begin() + rest);
        content = tok_.decode(kept, false);
        ApiParse again = parse_api_request(route, dump(body), relaxed_);
        if (again.error) {
          p.error = std::move(again.error);
          return p;
        }
        const int64_t n = static_cast<int64_t>(again.request.engine.prompt_ids.size());
        if (n <= keep) break;
        drop += n - keep;  // re-tokenizing at the cut can merge differently: cut a little more
      }
    }
    ApiParse final_parse = parse_api_request(route, dump(body), ctx_);
    if (final_parse.error) {
      p.error = std::move(final_parse.error);
      return p;
    }
    p.request = std::move(final_parse.request);
    p.truncated = BatchTruncation{truncate_, n0, static_cast<int64_t>(p.request.engine.prompt_ids.size())};
    return p;
  }

 private:
  const Tokenizer& tok_;
  ApiContext ctx_;
  ApiContext relaxed_;
  std::string truncate_;
  std::optional<json> default_kv_;
};

// --- the input ----------------------------------------------------------------------------

struct InputScan {
  std::string sha256;
  int64_t lines = 0;  // all lines
  int64_t owned = 0;  // non-blank lines of this shard
};

Result<InputScan> scan_input(const std::string& path, const ShardSpec& shard) {
  InputScan scan;
  SNAP_ASSIGN_OR_RETURN(scan.sha256, sha256_file(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot read the batch input");
  std::string text;
  while (std::getline(in, text)) {
    ++scan.lines;
    if (shard.owns(scan.lines) && !batch_line_is_blank(text)) ++scan.owned;
  }
  return scan;
}

// --- progress -----------------------------------------------------------------------------

struct Counters {
  int64_t written = 0;   // records written by this run
  int64_t errors = 0;    // of which error records
  int64_t resumed = 0;   // lines already in the output when this run started
  int64_t truncated = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t kv_full_bytes = 0;
  int64_t kv_resident_bytes = 0;
  int64_t layerwise_lines = 0;       // lines whose prompt was prefilled layer by layer
  int64_t layerwise_auto_lines = 0;  // of which the engine chose it (EngineConfig::auto_layerwise)
};

std::string format_seconds(double s) {
  char buf[32];
  if (s < 120) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}

// OUT.progress: what a scheduler, a dashboard or the next run reads about this shard.
json progress_record(const BatchArgs& a, const ShardSpec& shard, const InputScan& scan, const Counters& c, double elapsed,
                     const std::string& state) {
  return {{"input", std::filesystem::absolute(a.input).string()},
          {"input_sha256", scan.sha256},
          {"shard", shard.name()},
          {"records_total", scan.owned},
          {"records_done", c.resumed + c.written},
          {"records_written_this_run", c.written},
          {"errors_this_run", c.errors},
          {"prompt_tokens_this_run", c.prompt_tokens},
          {"completion_tokens_this_run", c.completion_tokens},
          {"elapsed_seconds_this_run", elapsed},
          {"state", state},
          {"updated_unix", static_cast<int64_t>(std::time(nullptr))}};
}

// --- running ------------------------------------------------------------------------------

// A line in the engine: one engine request per prompt, n choices each.
struct Pending {
  BatchInput in;
  ApiResponseMeta meta;
  std::optional<BatchTruncation> truncated;
  int n = 1;
  std::vector<ApiChoice> choices;  // prompt * n + choice
  int unfinished = 0;
  bool aborted = false;            // stopped by shutdown: no record, the line runs again
  std::optional<Status> error;
  std::vector<std::vector<int32_t>> echo_prompts;  // echo with logprobs: each prompt's ids
};

struct QueuedEvent {
  uint64_t key = 0;  // the line's Pending
  int prompt = 0;
  EngineEvent ev;
};

struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<QueuedEvent> events;
  std::atomic<int> signal{0};
  void push(uint64_t key, int prompt, const EngineEvent& ev) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back({key, prompt, ev});
    }
    cv.notify_one();
  }
};

std::optional<json> default_kv_compression(const BatchArgs& a) {
  const KvFlags& k = a.kv;
  if (k.policy.empty()) return std::nullopt;
  return json{{"policy", k.policy}, {"budget", k.budget}, {"window", k.window}, {"kernel", k.kernel},
              {"pooling", k.pooling}, {"gqa", k.gqa},       {"sinks", k.sinks},   {"layerwise", k.layerwise}};
}

}  // namespace

BatchCommands add_batch_subcommand(CLI::App& app, BatchArgs& a) {
  if (a.model.empty()) a.model = default_model_path();
  auto* b = app.add_subcommand(
      "batch",
      "Run an OpenAI Batch JSONL file offline: one result line per input line, exactly once, resumable after a kill "
      "(run the same command again); shards for Slurm job arrays; `batch merge` joins shard outputs");
  b->add_option("--input", a.input,
                "Input JSONL: one {\"custom_id\", \"method\": \"POST\", \"url\": \"/v1/completions\" or "
                "\"/v1/chat/completions\", \"body\": {...}} per line (the OpenAI Batch / vLLM run-batch format)")
      ->check(CLI::ExistingFile);
  b->add_option("--output", a.output,
                "Output JSONL, appended to and resumed from; with --shard I/N (N > 1) the shard writes OUTPUT.I-of-N. "
                "Records are in completion order and carry \"line\"; `batch merge` writes input order");
  b->add_option("--model", a.model, "GGUF file or Hugging Face directory (default: $SNAP_MODEL or the cached SmolLM2-135M-Instruct)");
  b->add_option("--shard", a.shard,
                "Run shard I of N (0-based): input lines k with (k-1) mod N == I (default: from SLURM_ARRAY_TASK_ID, "
                "SLURM_ARRAY_TASK_MIN and SLURM_ARRAY_TASK_COUNT under a Slurm job array, else 0/1)");
  b->add_option("--truncate", a.truncate,
                "A prompt longer than the context loses tokens instead of failing: left (keep the end) or right "
                "(keep the start); chat lines lose them from the longest message. Records say \"truncated\" "
                "(default: such lines get an error record)")
      ->check(CLI::IsMember({"left", "right"}));
  b->add_option("--kv-policy", a.kv.policy,
                "kv_compression for lines that set none: full, snapkv, streaming, h2o, pyramidkv, adakv (default: "
                "each line's own, full when absent); the --kv-* flags below go with it")
      ->check(CLI::IsMember({"full", "snapkv", "streaming", "h2o", "pyramidkv", "adakv"}));
  add_kv_options(b, a.kv);
  add_weight_dtype_option(b, a.weight_dtype);
  add_tp_options(b, a.parallel, "batch");
  b->add_option("--device", a.device,
                "Where the model runs: cpu (default; the reference) or cuda / cuda:N (serve's device engine: bf16 "
                "weights and KV cache in a device pool of --kv-cache-mib). With --tp N (srun --mpi=pmix, mpirun, --rank/--world-size/--leader) each rank "
                "holds its shard on its GPU (cuda = the rank's local rank)");
  add_device_tp_options(b, a.device_tp);
  b->add_option("--kv-cache-mib", a.kv_cache_mib, "KV block pool size in MiB (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  b->add_option("--max-num-seqs", a.max_num_seqs, "Lines running at once (default 16)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  b->add_option("--max-model-len", a.max_model_len, "Context length: prompt + max_tokens (default 0 = the model's)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  b->add_option("--prefill-chunk", a.prefill_chunk, "Prompt tokens per sequence per step (default 256)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  b->add_option("--progress-interval", a.progress_interval,
                "Seconds between progress lines on stderr and OUTPUT.progress updates (default 1 on a terminal, 10 otherwise)")
      ->check(CLI::Range(0.0, 1e6));
  b->add_option("--shutdown-timeout", a.shutdown_timeout,
                "After SIGTERM/SIGINT, seconds running lines get to finish and be written (default 10; Slurm's KillWait "
                "is 30)")
      ->check(CLI::Range(0.0, 1e6));

  auto* m = b->add_subcommand("merge",
                              "Join the shard outputs OUTPUT.I-of-N into OUTPUT in input order, checking that every input "
                              "line has exactly one record");
  m->add_option("--input", a.merge_input, "The batch input the shards ran")->required()->check(CLI::ExistingFile);
  m->add_option("--output", a.merge_output, "The --output the shards were given; written atomically")->required();
  m->add_option("--shards", a.merge_shards, "N: the number of shards")->required()->check(CLI::Range(2, 1000000));
  return {b, m};
}

int run_batch_merge(const BatchArgs& a) {
  auto r = merge_batch_outputs(a.merge_input, a.merge_output, a.merge_shards);
  if (!r.ok()) {
    std::fprintf(stderr, "snapserve batch merge: error: %s\n", r.status().message().c_str());
    return 1;
  }
  std::fprintf(stderr, "snapserve batch merge: %lld records (%lld errors) from %d shards written to %s\n",
               static_cast<long long>(r->input_records), static_cast<long long>(r->errors), a.merge_shards,
               a.merge_output.c_str());
  return 0;
}

int run_batch(const BatchArgs& a) {
  if (a.input.empty()) return batch_fail("--input FILE is required");
  if (a.output.empty()) return batch_fail("--output FILE is required");
  // Signals are taken by the thread below only (every later thread inherits the mask);
  // tensor-parallel workers keep them blocked and stop when rank 0 tells them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto device = parse_device(a.device);
  if (!device.ok()) return batch_fail(device.status().message());
  const bool on_device = device->kind == DeviceKind::cuda;
  if (const std::string e = on_device ? device_dtype_error(device->name(), a.kv.dtype, a.weight_dtype) : ""; !e.empty())
    return batch_fail(e);
  auto launch = start_tensor_parallel("batch", a.parallel);
  if (!launch.ok()) return batch_fail(launch.status().message());
  std::unique_ptr<comm::Communicator> comm = std::move(launch->comm);
  // --device cuda: this rank's GPU, checked before the model is read; with --tp the exchange.
  auto rank_device = open_rank_device(a.device, launch->launch, comm.get(), a.device_tp, a.parallel.collective_timeout_s);
  if (!rank_device.ok()) return batch_fail(rank_device.status().message());
  std::unique_ptr<comm::Communicator> exchange = std::move(rank_device->exchange);
  if (!launch->world().is_leader() && !on_device) return run_tp_worker(a.model, a.weight_dtype, *comm);

  // The input is checked and scanned (its SHA-256, which on a large corpus takes a while) before
  // the model is loaded when this process is alone, so that a bad input fails at once; in a
  // tensor-parallel group after the engine exists, whose idle reports keep the workers from
  // taking a long scan for a hung rank 0 (they give up on a silent rank 0 after
  // --collective-timeout, and wait --load-timeout for its engine). A failure then shuts the
  // engine down, which releases the workers.
  std::optional<ShardSpec> shard;
  Status early;
  std::string out_path, progress_path;
  InputScan scan;
  std::optional<BatchOutput> output;
  const auto check_input = [&] {
    auto parsed = a.shard.empty() ? shard_from_environment() : parse_shard(a.shard);
    if (!parsed.ok()) {
      early = parsed.status();
      return;
    }
    shard = *parsed;
    std::error_code ec;
    if (std::filesystem::equivalent(a.input, a.output, ec)) {
      early = invalid_argument("--output is the --input file");
      return;
    }
    out_path = shard_output_path(a.output, *shard);
    progress_path = out_path + ".progress";
    auto s = scan_input(a.input, *shard);
    if (!s.ok()) {
      early = s.status();
      return;
    }
    scan = std::move(s).value();
    auto o = BatchOutput::open(out_path, *shard);
    if (!o.ok()) {
      early = o.status();
      return;
    }
    output.emplace(std::move(o).value());
    if (output->records() == 0) return;
    std::ifstream pf(progress_path);
    if (!pf) return;
    try {
      const json prev = json::parse(pf);
      if (prev.value("input_sha256", "") != scan.sha256) {
        early = invalid_argument(out_path + " holds " + std::to_string(output->records()) + " records of a different input (" +
                                 progress_path + " records sha256 " + prev.value("input_sha256", "?") + ", " + a.input +
                                 " is now " + scan.sha256 + "); restore that input or move the output away");
      }
    } catch (const json::exception&) {
      // unreadable progress file: it is advisory; the output itself was checked
    }
  };
  if (!comm) check_input();

  EngineConfig cfg;
  cfg.comm = comm.get();
  cfg.device_exchange = exchange.get();
  cfg.device_exchange_dtype = rank_device->exchange_dtype;
  cfg.model_path = a.model;
  cfg.threads = launch->threads;
  // A failed tensor-parallel group (a rank hung or died) ends the job at once, non-zero and
  // before any of its lines is recorded as an error, so a requeue runs them again.
  cfg.on_group_failure = [](const std::string& why) {
    std::fprintf(stderr, "snapserve: batch: exiting, the tensor-parallel group failed: %s\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(3);
  };
  cfg.kv_cache_bytes = a.kv_cache_mib << 20;
  cfg.kv_dtype = kv_dtype_from_name(a.kv.dtype).value();  // checked by the flag
  cfg.weight_dtype = a.weight_dtype;
  cfg.max_num_seqs = a.max_num_seqs;
  cfg.max_waiting = int64_t{1} << 40;  // the loop below bounds what it hands the engine
  cfg.prefill_chunk = a.prefill_chunk;
  cfg.max_prompt_tokens = a.max_model_len > 0 ? a.max_model_len - 1 : 0;
  cfg.max_tokens_limit = a.max_model_len;
  if (on_device && !launch->world().is_leader()) {  // a device rank repeats rank 0's operations
    const Status st = run_device_engine_follower(rank_device->spec, cfg);
    if (!st.ok()) return batch_fail("rank " + std::to_string(launch->world().rank()) + ": " + st.message());
    return 0;
  }
  if (!early.ok()) return batch_fail(early.message());
  auto engine_or = on_device ? open_device_engine(rank_device->spec, cfg, nullptr) : Engine::create(cfg, nullptr);
  if (!engine_or.ok()) return batch_fail(engine_or.status().message());
  std::unique_ptr<Engine> engine = std::move(engine_or).value();
  if (comm) check_input();
  if (!early.ok()) {
    engine->shutdown(0);
    return batch_fail(early.message());
  }

  const int64_t context = a.max_model_len > 0 ? a.max_model_len : engine->model_config().max_position;
  ApiContext ctx;
  ctx.tokenizer = &engine->tokenizer();
  ctx.model_name = engine->model_name();
  ctx.context_length = context;
  ctx.max_prompt_tokens = cfg.max_prompt_tokens > 0 ? cfg.max_prompt_tokens : std::max<int64_t>(1, context - 1);
  ctx.max_tokens_limit = a.max_model_len > 0 ? a.max_model_len : context;
  const std::optional<json> default_kv = default_kv_compression(a);
  if (default_kv) {  // check the flags once, not on every line
    const ApiParse probe =
        parse_api_request(ApiRoute::completions, dump(json{{"prompt", "x"}, {"max_tokens", 1}, {"kv_compression", *default_kv}}), ctx);
    if (probe.error) {
      engine->shutdown(0);
      return batch_fail("--kv-* flags: " + probe.error->message);
    }
  }
  const LinePreparer preparer(engine->tokenizer(), ctx, a.truncate, default_kv);

  Counters c;
  c.resumed = output->records();
  const double interval = a.progress_interval > 0 ? a.progress_interval : (::isatty(STDERR_FILENO) ? 1.0 : 10.0);
  std::fprintf(stderr, "snapserve batch: %s, shard %s: %lld lines to run in %s (%lld already in %s%s), model %s\n",
               a.input.c_str(), shard->name().c_str(), static_cast<long long>(scan.owned - c.resumed), out_path.c_str(),
               static_cast<long long>(c.resumed), out_path.c_str(),
               output->dropped_partial_bytes() > 0
                   ? (", a partial last line of " + std::to_string(output->dropped_partial_bytes()) + " bytes cut").c_str()
                   : "",
               engine->model_name().c_str());
  std::fflush(stderr);

  EventQueue q;
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    q.signal.store(sig);
    q.cv.notify_all();
  });
  auto stop_signal_thread = [&] {
    if (q.signal.load() == 0) pthread_kill(signal_thread.native_handle(), SIGTERM);  // wake sigwait
    signal_thread.join();
  };

  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  auto save_progress = [&](const std::string& state) {
    Status st = write_file_atomic(progress_path, dump(progress_record(a, *shard, scan, c, elapsed(), state)) + "\n");
    if (!st.ok()) std::fprintf(stderr, "snapserve batch: warning: %s\n", st.message().c_str());
  };
  save_progress("running");

  std::map<uint64_t, Pending> pending;
  uint64_t next_key = 1;
  Status failure;  // an output write failed: stop, nothing more can be recorded
  auto write_record = [&](const BatchInput& in, const std::string& record, bool error) {
    if (!failure.ok()) return;
    Status st = output->append(in.line, record);
    if (!st.ok()) {
      failure = st;
      return;
    }
    ++c.written;
    if (error) ++c.errors;
  };
  auto write_error = [&](const BatchInput& in, const ApiError& e, const std::optional<BatchTruncation>& t) {
    ApiError named = e;
    named.message = "line " + std::to_string(in.line) + ": " + e.message;
    const ApiErrorInfo info = api_error_info(named.kind);
    write_record(in,
                 batch_output_record(in, info.http_status, "", api_error_body(named), info.code, named.message,
                                     t ? &*t : nullptr),
                 true);
  };
  // A line whose every choice finished: its record (none when a choice was aborted by a
  // shutdown: the line runs again next time).
  auto finish = [&](Pending& p) {
    if (p.aborted) return;
    for (size_t i = 0; i < p.choices.size(); ++i) {
      const EngineEvent& ev = p.choices[i].finished;
      if (p.n <= 1 || i % static_cast<size_t>(p.n) == 0) c.prompt_tokens += ev.prompt_tokens;
      c.completion_tokens += ev.completion_tokens;
      c.kv_full_bytes += ev.kv_full_equivalent_bytes;
      c.kv_resident_bytes += ev.kv_resident_bytes;
    }
    if (!p.choices.empty() && p.choices[0].finished.prefill_kind != "chunked") {
      ++c.layerwise_lines;
      c.layerwise_auto_lines += p.choices[0].finished.prefill_kind == "layerwise_auto";
    }
    if (p.error) return write_error(p.in, api_error_from_status(*p.error), p.truncated);
    if (p.truncated) ++c.truncated;
    if (!p.echo_prompts.empty()) {  // the echoed prompt's logprobs first, as over HTTP
      for (size_t k = 0; k < p.choices.size(); ++k) {
        const size_t pr = k / static_cast<size_t>(p.n);
        std::vector<ApiLogprob> all = api_prompt_logprobs(engine->tokenizer(), p.echo_prompts[pr],
                                                          p.choices[pr * static_cast<size_t>(p.n)].finished.prompt_logprobs);
        all.insert(all.end(), p.choices[k].logprobs.begin(), p.choices[k].logprobs.end());
        p.choices[k].logprobs = std::move(all);
      }
    }
    write_record(p.in,
                 batch_output_record(p.in, 200, p.meta.id, completion_response(p.meta, p.choices, p.n), "", "",
                                     p.truncated ? &*p.truncated : nullptr),
                 false);
  };
  auto drain = [&](std::deque<QueuedEvent>& batch) {
    for (QueuedEvent& qe : batch) {
      auto it = pending.find(qe.key);
      if (it == pending.end()) continue;
      Pending& p = it->second;
      const EngineEvent& ev = qe.ev;
      const size_t i = static_cast<size_t>(qe.prompt * p.n + ev.index);
      if (i >= p.choices.size()) continue;
      ApiChoice& ch = p.choices[i];
      ch.text += ev.text;
      if (ev.kind == EngineEvent::Kind::token) {
        if (p.meta.logprobs >= 0 && !ev.stop_token) ch.logprobs.push_back(api_logprob(engine->tokenizer(), ev));
        continue;
      }
      ch.finished = ev;
      if (ev.finish_reason == "abort") p.aborted = true;
      if (ev.finish_reason == "error" && !p.error) p.error = ev.error;
      if (--p.unfinished > 0) continue;
      finish(p);
      pending.erase(it);
    }
    batch.clear();
  };

  std::ifstream in(a.input, std::ios::binary);
  int64_t line_no = 0;
  bool input_done = false;
  const size_t cap = static_cast<size_t>(std::max<int64_t>(2, 2 * a.max_num_seqs));
  auto last_progress = Clock::now();
  int64_t last_tokens = 0;
  auto last_tokens_at = start;
  std::deque<QueuedEvent> got;

  while (failure.ok() && q.signal.load() == 0 && (!input_done || !pending.empty())) {
    // Hand the engine lines until `cap` run or wait.
    while (!input_done && pending.size() < cap && failure.ok()) {
      std::string text;
      if (!std::getline(in, text)) {
        input_done = true;
        break;
      }
      ++line_no;
      if (!shard->owns(line_no) || batch_line_is_blank(text) || output->done(line_no)) continue;
      BatchInput bi = parse_batch_line(line_no, text);
      if (bi.error) {
        write_error(bi, ApiError{ApiErrorKind::bad_request, *bi.error, ""}, std::nullopt);
        continue;
      }
      Prepared prep = preparer.prepare(bi);
      if (prep.error) {
        write_error(bi, *prep.error, prep.truncated);
        continue;
      }
      const uint64_t key = next_key++;
      Pending& p = pending[key];
      p.meta = api_response_meta(prep.request, engine->model_name());
      p.truncated = prep.truncated;
      p.in = std::move(bi);
      p.n = prep.request.engine.n;
      p.choices.assign(static_cast<size_t>(prep.request.num_choices()), ApiChoice{});
      if (prep.request.echo) {
        for (size_t k = 0; k < p.choices.size(); ++k) p.choices[k].text = prep.request.prompt_texts[k / static_cast<size_t>(p.n)];
        if (p.meta.logprobs >= 0) {
          p.echo_prompts.push_back(prep.request.engine.prompt_ids);
          for (const auto& more : prep.request.more_prompts) p.echo_prompts.push_back(more);
        }
      }
      const int prompts = prep.request.num_prompts();
      Status refused;
      for (int pr = 0; pr < prompts && refused.ok(); ++pr) {
        EngineRequest r = prep.request.engine;
        if (pr > 0) r.prompt_ids = prep.request.more_prompts[pr - 1];
        auto id = engine->submit(std::move(r), [&q, key, pr](const EngineEvent& ev) { q.push(key, pr, ev); });
        if (id.ok()) p.unfinished += p.n;
        else refused = id.status();
      }
      if (!refused.ok()) {
        // Prompts already submitted still run and finish; the line gets the error record then.
        p.error = refused;
        if (p.unfinished == 0) {
          BatchInput failed = std::move(p.in);
          pending.erase(key);
          write_error(failed, api_error_from_status(refused), std::nullopt);
        }
      }
    }
    {
      std::unique_lock<std::mutex> lock(q.mu);
      q.cv.wait_for(lock, std::chrono::milliseconds(200),
                    [&] { return !q.events.empty() || q.signal.load() != 0 || (input_done && pending.empty()); });
      got.swap(q.events);
    }
    drain(got);

    if (Clock::now() - last_progress >= std::chrono::duration<double>(interval)) {
      last_progress = Clock::now();
      const double dt = std::chrono::duration<double>(last_progress - last_tokens_at).count();
      const double tps = dt > 0 ? (c.completion_tokens - last_tokens) / dt : 0;
      last_tokens = c.completion_tokens;
      last_tokens_at = last_progress;
      const int64_t done = c.resumed + c.written;
      const double rate = elapsed() > 0 ? c.written / elapsed() : 0;
      const std::string eta = rate > 0 ? ", eta " + format_seconds((scan.owned - done) / rate) : "";
      std::fprintf(stderr, "snapserve batch: shard %s: %lld/%lld lines (%lld errors), %zu running, %.1f tok/s%s\n",
                   shard->name().c_str(), static_cast<long long>(done), static_cast<long long>(scan.owned),
                   static_cast<long long>(c.errors), pending.size(), tps, eta.c_str());
      std::fflush(stderr);
      save_progress("running");
    }
  }

  const int sig = q.signal.load();
  if (sig != 0 && failure.ok()) {
    std::fprintf(stderr, "snapserve batch: %s received: no new lines; %zu running get %.0f s to finish\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", pending.size(), a.shutdown_timeout);
    std::fflush(stderr);
  }
  // Running lines finish (or are cancelled at the deadline); finished ones are recorded.
  engine->shutdown(failure.ok() && sig != 0 ? a.shutdown_timeout : 0);
  {
    std::lock_guard<std::mutex> lock(q.mu);
    got.swap(q.events);
  }
  drain(got);
  engine.reset();
  stop_signal_thread();

  const int64_t done = c.resumed + c.written;
  const bool complete = failure.ok() && done == scan.owned;
  save_progress(complete ? "complete" : sig != 0 ? "stopped" : "failed");
  const double t = elapsed();
  std::string kv;
  if (c.kv_resident_bytes > 0 && c.kv_full_bytes > c.kv_resident_bytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " (%.2fx)", static_cast<double>(c.kv_full_bytes) / c.kv_resident_bytes);
    kv = "; KV cache: " + mib_text(c.kv_resident_bytes) + " resident at the ends of lines vs " + mib_text(c.kv_full_bytes) +
         " uncompressed" + buf + ", " + mib_text(c.kv_full_bytes - c.kv_resident_bytes) + " saved";
  }
  if (c.layerwise_lines > 0) {
    kv += "; " + std::to_string(c.layerwise_lines) + " lines prefilled layer by layer (" +
          std::to_string(c.layerwise_auto_lines) + " chosen automatically: lower peak)";
  }
  std::fprintf(stderr,
               "snapserve batch: shard %s: %lld records written this run (%lld errors, %lld truncated), %lld were already "
               "there, %lld of %lld done; %lld prompt + %lld completion tokens in %s (%.1f completion tok/s)%s\n",
               shard->name().c_str(), static_cast<long long>(c.written), static_cast<long long>(c.errors),
               static_cast<long long>(c.truncated), static_cast<long long>(c.resumed), static_cast<long long>(done),
               static_cast<long long>(scan.owned), static_cast<long long>(c.prompt_tokens),
               static_cast<long long>(c.completion_tokens), format_seconds(t).c_str(), t > 0 ? c.completion_tokens / t : 0.0,
               kv.c_str());
  if (!failure.ok()) return batch_fail(failure.message());
  if (!complete) {
    std::fprintf(stderr, "snapserve batch: stopped with %lld of %lld lines done; run the same command again to resume\n",
                 static_cast<long long>(done), static_cast<long long>(scan.owned));
    return 1;
  }
  std::fprintf(stderr, "snapserve batch: done: %s\n", out_path.c_str());
  return 0;
}

}  // namespace snap
