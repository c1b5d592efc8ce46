// `snapserve serve`: flag registration and the process lifecycle — signals blocked before
// any thread starts (so only the sigwaits below see them), engine, HTTP server, one
// "serving" line on stderr (tests read the port from it), graceful stop, exit 0.
// Stop signals: SIGTERM/SIGINT drain (running requests get --shutdown-timeout); SIGUSR1
// too, because mpirun forwards it to every rank at once while it turns SIGTERM into a
// kill (SIGTERM reaches the ranks after odls_base_sigkill_timeout, default 1 s, and SIGKILL
// as long again after it; so under mpirun a SIGTERM drains for half that time only). A
// worker rank's stop signal asks rank 0 (through its next RankReport) to drain the group.
// A failed group (GroupWatchdog) ends the process with exit code 3 once its clients have
// their error events.
#include "coordinator/http/serve_cli.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "coordinator/engine/device_spec.h"
#include "coordinator/http/cpu_flags.h"
#include "coordinator/engine/model_path.h"
#include "coordinator/engine/tp_launch.h"
#include "coordinator/http/server.h"
#include "coordinator/metrics/metrics.h"
#include "coordinator/scheduler/engine.h"
#include "worker/model/weights.h"
#include "worker/worker.h"

namespace snap {
namespace {

int serve_fail(const std::string& message) {
  std::fprintf(stderr, "snapserve: error: %s\n", message.c_str());
  return 1;
}

}  // namespace

namespace {

// Stop signals of the serving processes: blocked in every thread, taken by sigwait.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) sigaddset(&set, sig);
  return set;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return "a signal";
  }
}

// Seconds between mpirun's SIGTERM to the ranks and its SIGKILL.
double mpirun_kill_grace() {
  const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  const double s = v ? std::atof(v) : 0.0;
  return s > 0 ? s : 1.0;
}

}  // namespace

int run_tp_worker(const std::string& model_path, const std::string& weight_dtype, comm::Communicator& comm) {
  LoadOptions opts;
  const Status named = apply_weight_dtype(weight_dtype, &opts);  // checked by the flag
  CHECK(named.ok()) << named.to_string();
  opts.tp_rank = comm.group_rank();
  opts.tp_size = comm.group_size();
  auto model = load_model(model_path, opts);
  Status loaded = agree_on_load(&comm, model.ok() ? Status() : model.status());
  if (!loaded.ok()) return serve_fail(loaded.message());
  LlamaForward forward(*model, &comm);
  Worker worker(forward);
  // A stop signal to a worker rank drains the whole group: rank 0 reads the request in this
  // rank's next report (about once a second), drains, and its shutdown plan ends this loop.
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::atomic<bool> leaving{false};
  std::thread signals([&] {
    for (;;) {
      int sig = 0;
      sigwait(&set, &sig);
      if (leaving.load()) return;
      std::fprintf(stderr, "snapserve: rank %d: %s received, asking rank 0 to drain the group\n", comm.world().rank(),
                   signal_name(sig));
      worker.request_drain();
    }
  });
  Status st = worker_loop(worker, comm);
  leaving = true;
  pthread_kill(signals.native_handle(), SIGUSR2);
  signals.join();
  if (!st.ok()) return serve_fail("rank " + std::to_string(comm.world().rank()) + ": " + st.message());
  return 0;
}

void add_tp_options(CLI::App* cmd, TpFlags& f, const std::string& subcommand) {
  cmd->add_option("--threads", f.threads, "Compute threads per rank (default: the cores divided by the ranks)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--tp", f.tp,
                  "Tensor-parallel ranks: must equal the processes the launcher started (`mpirun -np N snapserve " +
                      subcommand + " --tp N`, `srun --mpi=pmix -n N ...`, a LeaderWorkerSet group, or N processes "
                      "started with --rank/--world-size/--leader); attention heads, the MLP and the LM head are "
                      "split over them and each rank compresses its own heads' KV (default: the launcher's "
                      "process count, 1 alone)")
      ->check(CLI::Range(1, 4096));
  auto* rank = cmd->add_option("--rank", f.rank, "This process's rank, for launchers without MPI (with --world-size, --leader)")
                   ->check(CLI::Range(0, 4095));
  auto* size = cmd->add_option("--world-size", f.world_size, "Processes in the group, for launchers without MPI")
                   ->check(CLI::Range(1, 4096));
  cmd->add_option("--leader", f.leader,
                  "HOST[:PORT] where rank 0 listens for the others (TCP; default port 29517, or "
                  "$SNAP_RENDEZVOUS_PORT); under a LeaderWorkerSet, LWS_LEADER_ADDRESS");
  rank->needs(size);
  size->needs(rank);
  cmd->add_option("--collective-timeout", f.collective_timeout_s,
                  "Seconds an all-reduce or gather inside a step may wait for the other ranks, and a worker rank for "
                  "rank 0's next step (an idle rank 0 reports at least every second), once every rank has "
                  "loaded, before this rank gives up naming the rank(s) it waited for and the group fails "
                  "(default 120; 0: no limit): a hung rank never hangs the job. TCP (--leader), MPI (mpirun, srun) "
                  "and NCCL enforce it; under MPI the job then ends (MPI_Abort)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--load-timeout", f.load_timeout_s,
                  "Seconds the ranks wait for each other to load their shards (and the other ranks for rank 0's "
                  "first step after it loads its tokenizer) before the group fails naming the rank(s) still loading "
                  "(default 1800; 0: no limit): a rank stuck reading its weights never hangs the job")
      ->check(CLI::Range(0.0, 864000.0));
  add_cpu_flags(cmd);
}

void add_kv_dtype_option(CLI::App* cmd, std::string& dtype) {
  cmd->add_option("--kv-dtype", dtype,
                  std::string("Element type of the cached keys and values: f32, bf16, f16 or q8_0 (default ") +
                      dtype_name(k_default_kv_dtype) +
                      "); attention converts them to f32 in registers and accumulates in f32. 16 bits halve the KV "
                      "memory; q8_0 (int8 values, one f16 scale per 32 of a head's row) takes 0.27x of f32; see "
                      "README, \"KV cache dtype\", for the accuracy measured")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0"}));
}

void add_weight_dtype_option(CLI::App* cmd, std::string& dtype) {
  cmd->add_option("--weight-dtype", dtype,
                  "Storage of the projection weights on the CPU: auto (default: a GGUF's q8_0/q4_0/q4_1/q5_0/q5_1 and q2_k-q6_k "
                  "matrices kept as they are, so a Q4_K_M or Q3_K_M file stays in its blocks; the rest f32), f32, f16, bf16, or q8_0 (every projection and the LM head "
                  "quantized at load as llama.cpp's Q8_0, one f16 scale per 32 weights: 0.27x the bytes of f32, "
                  "for Hugging Face f32/bf16 checkpoints and any GGUF; see README \"Quantize at load\"). "
                  "--device cuda: auto keeps a GGUF's q8_0/q4_0/q4_1/q5_0/q5_1 and q2_k-q6_k blocks on the GPU (a Q4_K_M or "
                  "Q5_K_M file in its own 4.5-6.5 bits a weight, Q3_K_M or Q2_K in 2.6-4; the rest bf16), bf16 "
                  "dequantizes everything to bf16, q8_0 as above (0.53x bf16's bytes a decode step reads)")
      ->check(CLI::IsMember({"auto", "f32", "f16", "bf16", "q8_0"}));
}

std::string device_dtype_error(const std::string& device_name, const std::string& kv_dtype,
                               const std::string& weight_dtype) {
  if (!kv_dtype.empty() && kv_dtype != "bf16")
    return "--device " + device_name + " keeps the KV cache in bf16; --kv-dtype " + kv_dtype + " is CPU-only";
  if (weight_dtype == "auto" || weight_dtype == "bf16" || weight_dtype == "q8_0") return "";
  return "--device " + device_name + " stores the weights in bf16 or q8_0; --weight-dtype " + weight_dtype +
         " is CPU-only";
}

void add_kv_options(CLI::App* cmd, KvFlags& f) {
  cmd->add_option("--kv-budget", f.budget, "Tokens kept per KV head per layer, window included (default 1024)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--kv-window", f.window, "SnapKV observation window W (default 32)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--kv-kernel", f.kernel, "SnapKV pooling kernel, odd (default 31)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--kv-pooling", f.pooling, "SnapKV pooling: avg (default) or max")->check(CLI::IsMember({"avg", "max"}));
  cmd->add_option("--kv-gqa", f.gqa, "Score aggregation over a GQA group: mean (default) or max")
      ->check(CLI::IsMember({"mean", "max"}));
  cmd->add_option("--kv-sinks", f.sinks, "streaming: attention-sink tokens kept (default 4)")->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--kv-layerwise", f.layerwise,
                "Prefill one layer at a time and compress it at once (peak memory: one layer's full KV); "
                "`generate`, `serve` and `batch` do so by themselves for a compressing policy over the whole prompt "
                "when that peaks lower, and say so");
  add_kv_dtype_option(cmd, f.dtype);
}

void add_device_tp_options(CLI::App* cmd, DeviceTpFlags& f) {
  cmd->add_option("--tp-comm", f.comm,
                  "With --device cuda and --tp N > 1, how the ranks' activations meet: nccl (device buffers, one GPU "
                  "per rank), host (staged through the launcher's MPI or TCP communicator; ranks may share a GPU) or "
                  "auto (default: nccl when this build has it). Both sum in rank order: the same bits")
      ->check(CLI::IsMember({"auto", "nccl", "host"}));
  cmd->add_option("--tp-exchange-dtype", f.exchange_dtype,
                  "With --device cuda and --tp N > 1, the all-reduces' wire type: f32 (default: the activations' "
                  "own, the same bits as one GPU up to the sums' order) or bf16 (half the bytes; each rank's "
                  "partial sum rounded to bf16 once, so logits move slightly)")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

void add_serve_subcommand(CLI::App& app, ServeArgs& a) {
  if (a.model.empty()) a.model = default_model_path();
  auto* s = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API (completions, chat, SSE streaming)");
  s->add_option("--model", a.model, "GGUF file or Hugging Face directory (default: $SNAP_MODEL or the cached SmolLM2-135M-Instruct)");
  s->add_option("--host", a.host, "Address to bind (default 127.0.0.1; 0.0.0.0 for every interface)");
  s->add_option("--port", a.port, "Port (default 8000; 0 picks a free one, printed on stderr)")->check(CLI::Range(0, 65535));
  s->add_option("--api-key", a.api_key, "Require Authorization: Bearer KEY on /v1/* (default: $SNAPSERVE_API_KEY; none)")
      ->envname("SNAPSERVE_API_KEY");
  s->add_option("--served-model-name", a.served_model_name, "Model id in the API (default: the model file's name)");
  add_tp_options(s, a.parallel, "serve");
  s->add_option("--device", a.device,
                "Where the model runs: cpu (default; the reference) or cuda / cuda:N (the whole model on GPU N: bf16 "
                "weights and KV cache in a device pool of --kv-cache-mib, every kv policy, layer-wise prefill, continuous "
                "batching, n > 1 and echo logprobs; Llama-family and Gemma 3 models; fails at once, before the model is read, "
                "without a GPU or in a build without CUDA). With --tp N each rank serves its shard from its GPU "
                "(cuda = the rank's local rank, cuda:N = GPU N on every rank), a pool of --kv-cache-mib per rank");
  add_device_tp_options(s, a.device_tp);
  s->add_option("--http-threads", a.http_threads, "HTTP I/O threads (default 2)")->check(CLI::Range(1, 256));
  s->add_option("--kv-cache-mib", a.kv_cache_mib, "KV block pool size in MiB (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  add_kv_dtype_option(s, a.kv_dtype);
  add_weight_dtype_option(s, a.weight_dtype);
  s->add_flag("--no-auto-layerwise", a.no_auto_layerwise,
              "Never choose layer-wise prefill by itself (by default a request with a compressing kv policy over its "
              "whole prompt and no prompt logprobs is prefilled layer by layer when that peaks lower in KV memory; "
              "the response's kv.prefill says chunked, layerwise or layerwise_auto)");
  s->add_option("--max-num-seqs", a.max_num_seqs, "Sequences running at once (default 16)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--max-waiting", a.max_waiting, "Requests that may wait for a sequence slot (or KV room) before more get 429; requests a free slot takes at once never count (default 64; 0: never queue)")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  s->add_option("--max-model-len", a.max_model_len, "Context length: prompt + max_tokens (default 0 = the model's)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  s->add_option("--prefill-chunk", a.prefill_chunk, "Prompt tokens per sequence per step (default 256)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  s->add_option("--max-body-bytes", a.max_body_bytes, "Largest request body (default 1 MiB; larger gets 413)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 34));
  s->add_option("--max-connections", a.max_connections, "Concurrent connections (default 256; beyond gets 503)")
      ->check(CLI::Range(1, 1 << 20));
  s->add_option("--request-timeout", a.request_timeout, "Seconds a request may run (default 600; 0 = none)")
      ->check(CLI::Range(0.0, 1e9));
  s->add_option("--read-timeout", a.read_timeout, "Seconds to receive one request's headers and body (default 10)")
      ->check(CLI::Range(0.1, 1e6));
  s->add_option("--allowed-origins", a.allowed_origins,
                "CORS: origins whose browser pages may call the API, comma-separated, e.g. "
                "https://app.example.com (\"*\": any; default: none, no CORS headers)")
      ->delimiter(',');
  s->add_option("--perspective-scorer", a.perspective_scorer,
                "Serve the Perspective API's POST /v1alpha1/comments:analyze with this pinned local scorer, "
                "e.g. tcc-toxic@0.3.0 (default: off; with --api-key, clients send ?key=KEY)");
  s->add_option("--perspective-qps", a.perspective_qps,
                "Quota of that route in requests per second, 429 RESOURCE_EXHAUSTED beyond (default 0: none)")
      ->check(CLI::Range(0.0, 1e9));
  s->add_option("--shutdown-timeout", a.shutdown_timeout,
                "Seconds running requests get to finish after SIGTERM/SIGINT/SIGUSR1 before they are cancelled "
                "(default 10). Under mpirun send SIGUSR1 to mpirun for a full drain: it forwards SIGUSR1 at "
                "once but kills the ranks soon after a SIGTERM")
      ->check(CLI::Range(0.0, 1e6));
  s->add_option("--step-timeout", a.step_timeout,
                "Tensor parallelism: seconds a step plan may take before the group counts as failed (a rank "
                "hung, stopped or unreachable), plus an allowance for its tokens of 10x the measured time per "
                "token; a rank on this host that dies fails it at once. Then every open request gets an error "
                "(503 / an error event), /health turns 503 and the process exits 3 so that the launcher "
                "restarts the group (default 20)")
      ->check(CLI::Range(0.1, 1e6));
}

int run_serve(const ServeArgs& a) {
  // Every thread started from here on inherits the mask; sigwait below takes the signals.
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a vanished client is a write error, not a dead server

  // Tensor parallelism: the launcher's processes form one group. Worker ranks keep the
  // signal mask above: they stop when rank 0 tells them, after draining.
  // --device cuda: checked before anything is loaded, so a machine without a GPU fails at once.
  auto device = parse_device(a.device);
  if (!device.ok()) return serve_fail(device.status().message());
  const bool on_device = device->kind == DeviceKind::cuda;
  if (const std::string e = on_device ? device_dtype_error(device->name(), a.kv_dtype, a.weight_dtype) : ""; !e.empty())
    return serve_fail(e);
  auto launch = start_tensor_parallel("serve", a.parallel);
  if (!launch.ok()) return serve_fail(launch.status().message());
  const comm::World* world = &launch->world();
  std::unique_ptr<comm::Communicator> comm = std::move(launch->comm);
  const int threads = launch->threads;
  // --device cuda: this rank's GPU (with --tp, `cuda` is the local rank's), checked before
  // anything is loaded; with --tp the forward's exchange (NCCL, or null: staged through comm).
  auto rank_device = open_rank_device(a.device, launch->launch, comm.get(), a.device_tp, a.parallel.collective_timeout_s);
  if (!rank_device.ok()) return serve_fail(rank_device.status().message());
  const DeviceSpec dev = rank_device->spec;
  std::unique_ptr<comm::Communicator> exchange = std::move(rank_device->exchange);
  const auto on_rank = [&](const std::string& m) {
    return world->size() > 1 ? "rank " + std::to_string(world->rank()) + ": " + m : m;
  };

  EngineConfig cfg;
  cfg.comm = comm.get();
  cfg.device_exchange = exchange.get();
  cfg.device_exchange_dtype = rank_device->exchange_dtype;
  cfg.model_path = a.model;
  cfg.served_model_name = a.served_model_name;
  cfg.threads = threads;
  cfg.kv_cache_bytes = a.kv_cache_mib << 20;
  cfg.kv_dtype = kv_dtype_from_name(a.kv_dtype).value();  // checked by the flag
  cfg.weight_dtype = a.weight_dtype;
  cfg.auto_layerwise = !a.no_auto_layerwise;
  cfg.max_num_seqs = a.max_num_seqs;
  cfg.max_waiting = a.max_waiting;
  cfg.prefill_chunk = a.prefill_chunk;
  cfg.max_prompt_tokens = a.max_model_len > 0 ? a.max_model_len - 1 : 0;
  cfg.max_tokens_limit = a.max_model_len;
  if (!world->is_leader()) {
    if (!on_device) return run_tp_worker(a.model, a.weight_dtype, *comm);
    // A device rank follows rank 0's operations until it stops the group; stop signals are
    // for rank 0 (blocked here, as on the CPU: the launcher's SIGTERM reaches rank 0 too).
    const Status st = run_device_engine_follower(dev, cfg);
    if (!st.ok()) return serve_fail(on_rank(st.message()));
    return 0;
  }
  // A failed group wakes the sigwait below (SIGUSR2 with group_failed set); a worker's
  // drain request is a SIGTERM to ourselves.
  static std::atomic<bool> group_failed{false};
  const pthread_t main_thread = pthread_self();
  cfg.step_timeout_seconds = a.step_timeout;
  cfg.on_group_failure = [main_thread](const std::string&) {
    group_failed = true;
    pthread_kill(main_thread, SIGUSR2);
  };
  cfg.on_drain_request = [main_thread] { pthread_kill(main_thread, SIGUSR1); };
  std::unique_ptr<PerspectiveHandler> perspective;
  if (!a.perspective_scorer.empty()) {
    auto scorer = scoring::make_scorer(a.perspective_scorer, scoring::ScorerOptions{});
    if (!scorer.ok()) return serve_fail("--perspective-scorer: " + scorer.status().message());
    perspective = std::make_unique<PerspectiveHandler>(std::move(scorer).value(), a.api_key, a.perspective_qps);
  }
  const std::string metrics_name =
      a.served_model_name.empty() ? std::filesystem::path(a.model).filename().string() : a.served_model_name;
  auto metrics = std::make_unique<ServerMetrics>(metrics_name);
  auto engine = on_device ? open_device_engine(dev, cfg, metrics.get()) : Engine::create(cfg, metrics.get());
  if (!engine.ok()) return serve_fail(engine.status().message());
  // "serving" below means ready: wait for the scheduler thread's first heartbeat.
  const auto ready_by = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(*engine)->healthy() && std::chrono::steady_clock::now() < ready_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!(*engine)->healthy()) {
    (*engine)->shutdown(0);
    return serve_fail("the engine did not become healthy within 60 s");
  }

  HttpServerConfig hc;
  hc.host = a.host;
  hc.port = a.port;
  hc.io_threads = a.http_threads;
  hc.api_key = a.api_key;
  hc.max_body_bytes = a.max_body_bytes;
  hc.max_connections = a.max_connections;
  hc.read_timeout_seconds = a.read_timeout;
  hc.request_timeout_seconds = a.request_timeout;
  hc.context_length = a.max_model_len;
  hc.allowed_origins = a.allowed_origins;
  hc.perspective = perspective.get();
  if (const char* f = std::getenv("SNAP_FAULT_PEER_CHECK_BEFORE_WRITE"); f != nullptr && std::string(f) == "1") {
    hc.fault_peer_check_before_write = true;
  }
  auto server = HttpServer::start(hc, engine->get(), metrics.get());
  if (!server.ok()) {
    (*engine)->shutdown(0);
    return serve_fail(server.status().message());
  }
  const std::string host = a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
  std::fprintf(stderr, "snapserve: serving %s on http://%s:%d\n", (*engine)->model_name().c_str(), host.c_str(),
               (*server)->port());
  std::fflush(stderr);

  int sig = 0;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig != SIGUSR2 || group_failed.load()) break;  // SIGUSR2 is only our own wake-up
  }
  if (group_failed.load()) {
    // The error events are queued on the HTTP threads: give them a moment to reach the
    // clients, then exit without touching the group (no rank would answer).
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    std::fprintf(stderr, "snapserve: exiting (exit code 3): the tensor-parallel group failed\n");
    std::fflush(stderr);
    std::_Exit(3);
  }
  double deadline = a.shutdown_timeout;
  if (sig == SIGTERM && launch->launch.launcher == comm::Launcher::mpirun && world->size() > 1) {
    deadline = std::min(deadline, 0.5 * mpirun_kill_grace());
    std::fprintf(stderr, "snapserve: SIGTERM under mpirun: Open MPI kills the ranks %.1f s after it, so running "
                 "requests get %.1f s (send SIGUSR1 to mpirun for a full drain)\n", mpirun_kill_grace(), deadline);
  }
  std::fprintf(stderr, "snapserve: %s received, stopping (deadline %.1f s)\n", signal_name(sig), deadline);
  (*server)->stop(deadline);
  server->reset();
  engine->reset();
  std::fprintf(stderr, "snapserve: stopped\n");
  return 0;
}

}  // namespace snap
