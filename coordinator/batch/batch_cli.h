// `snapserve batch`: offline inference over an OpenAI Batch JSONL corpus (the format of
// OpenAI's Batch API and vLLM's run-batch) with the same engine, API parsing and SnapKV
// policies as `serve`, no HTTP. Exactly-once output that survives a SIGKILL (see
// batch_io.h), shards for Slurm job arrays (--shard I/N or the SLURM_ARRAY_* variables),
// tensor parallelism under mpirun/srun (--tp N), prompt truncation (--truncate), progress
// on stderr, and `snapserve batch merge` to join shard outputs in input order.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "coordinator/engine/tp_launch.h"
#include "coordinator/http/serve_cli.h"

namespace snap {

struct BatchArgs {
  std::string model;  // default: $SNAP_MODEL or the cached SmolLM2-135M-Instruct
  std::string weight_dtype = "auto";  // --weight-dtype (cuda: auto, bf16, q8_0)
  std::string input;
  std::string output;
  std::string shard;     // "I/N"; "" = from SLURM_ARRAY_* or 0/1
  std::string truncate;  // "", "left" or "right"
  TpFlags parallel;
  std::string device = "cpu";    // --device cpu | cuda[:N] (coordinator/engine/device_spec.h)
  DeviceTpFlags device_tp;  // --tp-comm, --tp-exchange-dtype: the device forward's exchange with --tp > 1
  // The kv_compression of lines that have none (policy "" = the lines' own, full when absent).
  KvFlags kv;
  int64_t kv_cache_mib = 512;
  int64_t max_num_seqs = 16;
  int64_t max_model_len = 0;
  int64_t prefill_chunk = 256;
  double progress_interval = 0;  // seconds between progress lines; 0: 1 on a terminal, 10 otherwise
  double shutdown_timeout = 10;  // after SIGTERM, seconds running lines get to finish
  // `batch merge`
  std::string merge_input;
  std::string merge_output;
  int merge_shards = 0;
};

// Registers `batch` and its nested `merge`; returns the two subcommands.
struct BatchCommands {
  CLI::App* batch = nullptr;
  CLI::App* merge = nullptr;
};
BatchCommands add_batch_subcommand(CLI::App& app, BatchArgs& args);

// Exit codes: 0 every owned line has a record (error records included); 1 stopped (signal)
// or failed (unreadable input, an output that is not ours, a model that does not load);
// 2 bad flags.
int run_batch(const BatchArgs& args);
int run_batch_merge(const BatchArgs& args);

}  // namespace snap
