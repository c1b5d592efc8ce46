// `snapserve serve`: the flags (ServeArgs, registered by add_serve_subcommand) and
// run_serve(), which loads the engine, starts the HTTP server, logs
// "snapserve: serving MODEL on http://HOST:PORT" to stderr, and on SIGTERM/SIGINT stops
// gracefully within --shutdown-timeout and exits 0. Under mpirun/srun with N processes
// (`--tp N`), rank 0 serves HTTP and leads; the other ranks run their shard's worker loop
// until rank 0 stops.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/engine/tp_launch.h"

namespace snap {

struct ServeArgs {
  std::string model;  // default: $SNAP_MODEL or the cached SmolLM2-135M-Instruct
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;  // default: $SNAPSERVE_API_KEY
  std::string served_model_name;
  TpFlags parallel;  // --tp, --threads, --rank, --world-size, --leader
  std::string device = "cpu";  // --device cpu | cuda[:N] (coordinator/engine/device_spec.h)
  DeviceTpFlags device_tp;  // --tp-comm, --tp-exchange-dtype: the device forward's exchange with --tp > 1
  int http_threads = 2;
  int64_t kv_cache_mib = 512;
  std::string kv_dtype;  // --kv-dtype; empty: k_default_kv_dtype
  std::string weight_dtype = "auto";  // --weight-dtype (apply_weight_dtype); cuda: auto, bf16, q8_0
  bool no_auto_layerwise = false;  // --no-auto-layerwise (EngineConfig::auto_layerwise = false)
  int64_t max_num_seqs = 16;
  int64_t max_waiting = 64;
  int64_t max_model_len = 0;
  int64_t prefill_chunk = 256;
  int64_t max_body_bytes = 1 << 20;
  int max_connections = 256;
  double request_timeout = 600;
  double read_timeout = 10;
  double shutdown_timeout = 10;
  double step_timeout = 20;  // tensor-parallel watchdog base deadline per step plan
  std::vector<std::string> allowed_origins;  // CORS; empty: off
  std::string perspective_scorer;  // ID@VERSION behind POST /v1alpha1/comments:analyze; empty: off
  double perspective_qps = 0;      // that route's quota (429 beyond); 0: none
};

// --threads, --tp, --rank, --world-size and --leader on a tensor-parallel subcommand.
void add_tp_options(CLI::App* cmd, TpFlags& flags, const std::string& subcommand);
// --tp-comm and --tp-exchange-dtype: with --device cuda and --tp N > 1 (generate, serve, batch).
void add_device_tp_options(CLI::App* cmd, DeviceTpFlags& flags);

// The KV policy's parameters as flags (`generate`, `batch`). --kv-policy itself is each
// subcommand's own (its default differs).
struct KvFlags {
  std::string policy;
  int64_t budget = 1024;
  int window = 32;
  int kernel = 31;
  std::string pooling = "avg";
  std::string gqa = "mean";
  int sinks = 4;
  bool layerwise = false;
  std::string dtype;  // --kv-dtype: f32, bf16, f16, q8_0; empty: k_default_kv_dtype
};
// --kv-budget, --kv-window, --kv-kernel, --kv-pooling, --kv-gqa, --kv-sinks, --kv-layerwise,
// --kv-dtype.
void add_kv_options(CLI::App* cmd, KvFlags& flags);
// --kv-dtype alone (serve, whose KV policy is per request).
void add_kv_dtype_option(CLI::App* cmd, std::string& dtype);
// --weight-dtype (generate, serve, batch): auto, f32, f16, bf16 or q8_0 (worker/model/weights.h).
void add_weight_dtype_option(CLI::App* cmd, std::string& dtype);
// The one-line refusal of storage --device cuda lacks, or empty: --kv-dtype other than bf16
// (empty: the default), --weight-dtype other than auto, bf16 or q8_0.
std::string device_dtype_error(const std::string& device_name, const std::string& kv_dtype,
                               const std::string& weight_dtype);

// A tensor-parallel rank other than 0 (of `serve` or `batch`): loads its shard of
// `model_path` (with --weight-dtype `weight_dtype`), then runs the plans rank 0 sends until rank 0 stops. Exit code.
int run_tp_worker(const std::string& model_path, const std::string& weight_dtype, comm::Communicator& comm);

void add_serve_subcommand(CLI::App& app, ServeArgs& args);
int run_serve(const ServeArgs& args);

}  // namespace snap
