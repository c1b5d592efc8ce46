// The backend seam of `snapserve generate`: where the forward pass runs. `cpu` (the default
// and the reference) is LlamaForward behind a StepDriver (coordinator/engine/generate.h);
// `cuda[:N]` is DeviceForward (worker/device/) on GPU N, behind DeviceGenerator below. The
// tokenizer, prompt building, sampling and the report stay on the host for both; only token
// ids go in and logits (or a greedy id) come out of the device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "common/status.h"
#include "coordinator/engine/generate.h"
#include "worker/model/weights.h"

namespace snap {

enum class DeviceKind : uint8_t { cpu, cuda };

struct DeviceSpec {
  DeviceKind kind = DeviceKind::cpu;
  int ordinal = 0;  // cuda:N
  std::string name() const { return kind == DeviceKind::cpu ? "cpu" : "cuda:" + std::to_string(ordinal); }
};

// "cpu", "cuda" (= cuda:0) or "cuda:N"; anything else is a one-line error naming the text.
Result<DeviceSpec> parse_device(const std::string& text);

// `--device cuda` on tensor-parallel rank with local rank `local_rank`: cuda:(local_rank modulo
// the devices present), so that one process per GPU needs no flag per rank.
Result<DeviceSpec> device_for_local_rank(int local_rank);

// Whether this binary was built with the CUDA backend (configure with -DSNAP_ENABLE_CUDA=ON
// where nvcc is found).
bool build_has_cuda();
// Whether the device path can run its exchange over NCCL: a build with NCCL whose device
// buffers are a GPU's (not the host twin's, kernels/cuda/host).
bool device_nccl_usable();

// Fails fast, before any model is loaded: "this build has no CUDA (...)", "no CUDA device
// (cudaGetDeviceCount: error 35 ...)", or an ordinal past the devices present. On success the
// device is the current one of this thread.
Status check_device(const DeviceSpec& spec);

// How a device run loads its model, by --weight-dtype (auto, bf16 or q8_0; the CLI refuses the
// rest): row-major blocks (no CPU matvec tiles); auto keeps a GGUF's block-format (Q8_0 .. Q2_K)
// matrices in their blocks, as the CPU's load does, q8_0 quantizes every projection and the LM head at load; everything
// else is bf16, on the host as on the device.
inline LoadOptions device_load_options(const std::string& weight_dtype) {
  LoadOptions opts;
  opts.keep_quantized = weight_dtype == "auto";
  opts.matvec_tiles = false;
  opts.weight_dtype = weight_dtype == "q8_0" ? DType::q8_0 : DType::bf16;
  return opts;
}

// generate() on one device: the model uploaded once (bf16 or block formats: DeviceWeights), one request at a time, each on a
// fresh device KV pool sized as the CPU sizes its pool. Every KV policy runs on the device
// (full, snapkv, pyramidkv, adakv, h2o, streaming), selecting what the CPU selects on the same
// K/V (near-ties excepted). hooks.on_prefilled is not called (there is no host PagedKvCache);
// every other hook is, as on the CPU.
class DeviceGenerator {
 public:
  virtual ~DeviceGenerator() = default;
  virtual Result<GenerateResult> generate(const GenerateRequest& request, const GenerateHooks& hooks = {}) = 0;
  // One line for the report: the device, its weights, the last request's KV pool (allocated
  // and peak in use) and scratch, and the device memory in use by this process.
  virtual std::string describe_memory() const = 0;

  // Tensor parallelism (open_device_generator with a group): tp rank 0 calls generate();
  // every other rank calls follow(), which runs each request rank 0 starts — its header (the
  // prompt, policy and limits) and then each decoded token id arrive over the control group —
  // on its own shard until rank 0 calls shutdown(). One rank alone: follow() and shutdown()
  // return at once.
  virtual Status follow() = 0;
  virtual Status shutdown() = 0;
  // The communicator the forward's all-reduces and logits gathers ran on (null alone), and
  // its counters when the last request's prefill ended and when its last token was sent
  // (before the per-rank memory report's gather, which is not the request's traffic).
  virtual const comm::Communicator* exchange_comm() const = 0;
  virtual comm::CommStats exchange_after_prefill() const = 0;
  virtual comm::CommStats exchange_at_end() const = 0;
};

// Uploads `model` (loaded with matvec_tiles = false; its block-format matrices stay in their
// blocks, the rest become bf16) to the device check_device chose.
// `model` must outlive the generator (its config is read). With tensor parallelism `model`
// is this rank's shard (LoadOptions tp_rank/tp_size) and:
//  - control: the group's host communicator (MPI or TCP), for the request headers and the
//    token ids;
//  - exchange: the communicator of the forward's activations — NCCL on device buffers, or
//    the control communicator itself (host-staged: device -> host -> collective -> device).
// Both must outlive the generator. exchange_dtype: the all-reduce's wire type, f32 or bf16
// (worker/device/device_exchange.h).
Result<std::unique_ptr<DeviceGenerator>> open_device_generator(const DeviceSpec& spec, const LoadedModel& model,
                                                               comm::Communicator* control = nullptr,
                                                               comm::Communicator* exchange = nullptr,
                                                               DType exchange_dtype = DType::f32);

struct EngineConfig;
class Engine;
class ServerMetrics;

// `serve --device cuda[:N]`: the serving Engine (coordinator/scheduler/engine.h) over the
// device forward (worker/device/device_engine.cpp): the same interface, continuous batching
// (one prompt chunk + one decode row per running sequence each step), admission by the
// device pool's blocks, cancel, drain, and the device's memory in /metrics. Checks the device
// first (check_device), then loads the model and uploads it. Refused in one line per request:
// n > 1 and prompt logprobs.
// Tensor parallelism (cfg.comm a group of tp > 1; this is tp rank 0): every rank loads its
// shard (agreed over cfg.comm), the forward's exchange is cfg.device_exchange (NCCL) or cfg.comm
// staged, and the other ranks run run_device_engine_follower with the same cfg; /metrics gets
// every rank's device memory and exchange counters. A failure of the group ends every request
// with an unavailable error and calls cfg.on_group_failure.
Result<std::unique_ptr<Engine>> open_device_engine(const DeviceSpec& spec, const EngineConfig& cfg,
                                                   ServerMetrics* metrics);
// A tp rank other than 0 of `serve --device cuda --tp N`: loads its shard, then repeats rank
// 0's device operations until rank 0 stops (ok) or something fails (the error).
Status run_device_engine_follower(const DeviceSpec& spec, const EngineConfig& cfg);

}  // namespace snap
