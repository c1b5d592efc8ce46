// `serve --device cuda`: the serving Engine (coordinator/scheduler/engine.h) over DeviceForward
// on one GPU — the device twin of the CPU engine (coordinator/scheduler/engine.cpp) behind the
// same interface, so the HTTP front-end does not know which one it drives. One scheduler
// thread owns the device, the pool and every sequence. Each step: take new requests and
// cancellations, admit waiting requests whose KV reservation fits the device pool's blocks,
// run one prompt chunk of the oldest prefilling sequence (forward) and one decode row of every
// decoding sequence (decode_batch: row-invariant, so a stream's tokens do not depend on what
// shares its step), compress a sequence the step its context is complete, then sample on the
// host (penalties, logit_bias, logprobs as on the CPU), detokenize, cut stop strings, stream.
// Reservations: max(the prompt uncompressed + one layer's compaction copy, n × (the compressed
// size + max_tokens)), shrunk to the second once compressed. n > 1 (as on the CPU): choice 0
// prefills, then the pool copies its cache for choices 1..n-1 (DeviceKvPool::fork), which
// decode as rows of their own with seeds seed + c. echo's prompt logprobs: each prompt chunk's
// every row through the LM head to the host, scored there as the CPU engine scores them.
// Prefill is one sequence at a time (the forward's window/H2O capture is per prefill), decode
// rows of all of them every step. A
// layer-wise prefill (asked, or chosen as the CPU engine chooses it) runs the whole prompt in
// its step and reserves one layer's full KV instead of every layer's.
// Tensor parallelism (serve --device cuda --tp N): every rank holds its shard on its GPU
// (DeviceShard: heads, MLP slice, vocabulary rows, its KV heads' pool). Rank 0 runs this
// scheduler; before each device operation it sends the others a DeviceOp
// (coordinator/engine/device_request.h) over the launcher's communicator, and they repeat it
// on their shards in the same order (run_device_engine_follower), so every pool holds the same
// sequences in the same blocks and admission decided on rank 0 holds everywhere. The forward's
// all-reduces and the LM head's gather run over the exchange (NCCL, or staged through that
// communicator). A failed operation or exchange, or rank 0's GroupWatchdog (--step-timeout,
// for a rank that hangs where no collective timeout would end the wait), fails the group:
// every open request ends at once with an unavailable error through its SinkGate, from
// whichever thread saw it, and on_group_failure is called (the server exits, its launcher
// restarts the group). About once a second a `report` op gathers every rank's device memory and exchange
// counters for rank 0's /metrics.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common/sys.h"
#include "coordinator/engine/device_spec.h"
#include "coordinator/engine/prefill_choice.h"
#include "coordinator/scheduler/engine.h"
#include "coordinator/scheduler/group_watchdog.h"
#include "coordinator/scheduler/sink_gate.h"
#include "coordinator/scheduler/logits_processing.h"
#include "coordinator/scheduler/out_of_memory.h"
#include "coordinator/scheduler/token_stream.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/engine/device_request.h"
#include "worker/device/device_exchange.h"
#include "worker/device/device_forward.h"
#include "worker/device/device_kv_pool.h"
#include "worker/device/device_weights.h"
#include "worker/model/weights.h"
#include "worker/worker.h"

namespace snap {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool grouped(const EngineConfig& cfg) { return cfg.comm != nullptr && cfg.comm->group_size() > 1; }

// One rank's device side of the engine: its shard of the model on its GPU, the KV pool of its
// KV heads, the exchange (tp > 1) and the forward.
struct DeviceShard {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<DeviceWeights> weights;
  cudaStream_t stream = nullptr;
  std::unique_ptr<DeviceKvPool> pool;
  std::unique_ptr<DeviceExchange> exchange;
  std::unique_ptr<DeviceForward> fwd;

  DeviceShard() = default;
  DeviceShard(const DeviceShard&) = delete;
  DeviceShard& operator=(const DeviceShard&) = delete;
  ~DeviceShard() {
    fwd.reset();
    exchange.reset();
    pool.reset();
    weights.reset();
    if (stream) cudaStreamDestroy(stream);
  }

  Status open(const DeviceSpec& spec, const EngineConfig& cfg) {
    SNAP_RETURN_IF_ERROR(check_device(spec));
    LoadOptions opts = device_load_options(cfg.weight_dtype);
    if (grouped(cfg)) {
      opts.tp_rank = cfg.comm->group_rank();
      opts.tp_size = cfg.comm->group_size();
    }
    SNAP_ASSIGN_OR_RETURN(LoadedModel m, load_model(cfg.model_path, opts));
    model = std::make_unique<LoadedModel>(std::move(m));
    SNAP_RETURN_IF_ERROR(device_supports(model->config, spec.name()));
    SNAP_ASSIGN_OR_RETURN(weights, DeviceWeights::upload(*model));
    const cudaError_t e = cudaStreamCreate(&stream);
    if (e != cudaSuccess) return unavailable("--device " + spec.name() + ": cudaStreamCreate: " + cudaGetErrorString(e));
    const ModelConfig& c = model->config;
    const DeviceKvShape shape{c.num_layers, weights->shard.num_kv_heads, c.head_dim, cfg.kv_block_size};
    SNAP_ASSIGN_OR_RETURN(pool, DeviceKvPool::create(shape, cfg.kv_cache_bytes, stream));
    if (grouped(cfg))
      exchange = std::make_unique<DeviceExchange>(cfg.device_exchange ? *cfg.device_exchange : *cfg.comm, stream,
                                                  cfg.device_exchange_dtype);
    fwd = std::make_unique<DeviceForward>(c, *weights, *pool, exchange.get());
    return Status::ok_status();
  }

  // Loads on every rank; with a group, no rank goes on alone (agree_on_load), and the
  // exchange's collective timeout is armed once all have loaded.
  Status open_agreed(const DeviceSpec& spec, const EngineConfig& cfg) {
    Status st = open(spec, cfg);
    if (!grouped(cfg)) return st;
    SNAP_RETURN_IF_ERROR(agree_on_load(cfg.comm, st));
    if (cfg.device_exchange) cfg.device_exchange->arm_collective_timeout();  // agree_on_load armed cfg.comm
    return Status::ok_status();
  }
};

// What each rank reports to rank 0 (the `report` op): int64 fields, gathered as f32 pairs
// (the gather copies bits).
struct RankDeviceReport {
  int64_t weights = 0, pool_used = 0, pool_free = 0, pool_peak = 0, scratch = 0, in_use = 0, total = 0, rss = 0;
  int64_t all_reduce_bytes = 0, all_gather_bytes = 0, broadcast_bytes = 0;
  int64_t all_reduce_us = 0, all_gather_us = 0, broadcast_us = 0;
  int64_t pid = 0, host_id = 0;  // for rank 0's watchdog: a dead rank on its host is seen at once
};
constexpr int k_report_floats = sizeof(RankDeviceReport) / sizeof(float);

// The forward's exchange counters and the lockstep's broadcasts (on the launcher's
// communicator), without the reports' own gathers when both are one communicator.
RankDeviceReport local_report(const DeviceShard& d, const comm::Communicator* control, int64_t peak_blocks,
                              int64_t reports_before) {
  RankDeviceReport r;
  const int64_t bb = d.pool->block_bytes();
  r.weights = d.weights->bytes;
  r.pool_used = d.pool->used_blocks() * bb;
  r.pool_free = d.pool->free_blocks() * bb;
  r.pool_peak = std::max(peak_blocks, d.pool->peak_used_blocks()) * bb;
  r.scratch = d.fwd->scratch_bytes();
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    r.in_use = static_cast<int64_t>(total_b - free_b);
    r.total = static_cast<int64_t>(total_b);
  }
  r.rss = current_rss_bytes();
  r.pid = current_pid();
  r.host_id = host_id();
  if (control == nullptr) return r;  // one process: no exchange
  const comm::Communicator& ex = d.exchange ? d.exchange->comm() : *control;
  const comm::CommStats xs = ex.stats(), cs = control->stats();
  r.all_reduce_bytes = xs[comm::CommOp::all_reduce_sum].bytes;
  r.all_gather_bytes = xs[comm::CommOp::all_gather].bytes;
  if (&ex == control) r.all_gather_bytes -= reports_before * static_cast<int64_t>(sizeof(RankDeviceReport));
  r.broadcast_bytes = cs[comm::CommOp::broadcast].bytes;
  r.all_reduce_us = static_cast<int64_t>(xs[comm::CommOp::all_reduce_sum].seconds * 1e6);
  r.all_gather_us = static_cast<int64_t>(xs[comm::CommOp::all_gather].seconds * 1e6);
  r.broadcast_us = static_cast<int64_t>(cs[comm::CommOp::broadcast].seconds * 1e6);
  return r;
}

Status gather_reports(const DeviceShard& d, comm::Communicator& control, int64_t peak_blocks, int64_t* reports,
                      std::vector<RankDeviceReport>* all) {
  RankDeviceReport mine = local_report(d, &control, peak_blocks, *reports);
  all->assign(static_cast<size_t>(control.group_size()), RankDeviceReport{});
  SNAP_RETURN_IF_ERROR(control.all_gather(&mine, all->data(), k_report_floats, DType::f32));
  ++*reports;
  return Status::ok_status();
}

// Page-locked host floats the GPU copies into directly: a decode step's logits, [rows, vocab]. A
// pageable destination goes through the driver's own staging buffer at about half the speed,
// and at 32 rows of a 128K vocabulary that is 16 MB per step. Grows by doubling; where pinned
// memory cannot be had it falls back to ordinary memory (slower, same results).
class HostLogits {
 public:
  HostLogits() = default;
  HostLogits(const HostLogits&) = delete;
  HostLogits& operator=(const HostLogits&) = delete;
  ~HostLogits() { release(); }
  float* reserve(size_t n) {
    if (n <= size_) return data_;
    const size_t want = std::max(n, 2 * size_);  // before release() forgets the old size
    release();
    if (cudaMallocHost(reinterpret_cast<void**>(&data_), want * sizeof(float)) == cudaSuccess) {
      pinned_ = true;
    } else {
      cudaGetLastError();  // not sticky; clear it
      fallback_.resize(want);
      data_ = fallback_.data();
    }
    size_ = want;
    return data_;
  }

 private:
  void release() {
    if (pinned_) cudaFreeHost(data_);
    pinned_ = false;
    data_ = nullptr;
    size_ = 0;
    fallback_.clear();
    fallback_.shrink_to_fit();
  }
  float* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
  std::vector<float> fallback_;
};

struct DevSeq : TokenStream {
  uint64_t id = 0;
  int32_t pool_seq = -1;  // the device pool's sequence (-1: not opened)
  int64_t compress_at = 0;
  int window = 0;          // rows the chunk ending at compress_at must hold
  int64_t reserved_blocks = 0;
  bool compressed = false;
  bool layerwise = false, layerwise_auto = false;  // the whole prompt layer by layer, in one step
};

class DeviceEngine final : public Engine {
 public:
  DeviceEngine(const DeviceSpec& spec, const EngineConfig& cfg, ServerMetrics* metrics)
      : spec_(spec), cfg_(cfg), metrics_(metrics) {}
  ~DeviceEngine() override { shutdown(0); }

  Status init() {
    if (cfg_.kv_block_size != 16) return invalid_argument("the device KV pool has 16-token blocks");
    if (grouped(cfg_) && cfg_.comm->group_rank() != 0)
      return internal_error("the device engine runs on tp rank 0; the others run run_device_engine_follower");
    SNAP_RETURN_IF_ERROR(shard_.open_agreed(spec_, cfg_));
    if (grouped(cfg_)) {
      // Every operation is armed with a deadline (--step-timeout plus its tokens' worth) and the
      // ranks on this host are watched: a hung or dead rank fails the group instead of hanging
      // it, whatever the communicator (MPI has no collective timeout).
      watchdog_ = std::make_unique<GroupWatchdog>(cfg_.step_timeout_seconds,
                                                  [this](const std::string& why) { group_failure(unavailable(why)); });
      DeviceOp op;
      op.kind = DeviceOpKind::report;
      std::vector<RankDeviceReport> all;
      Status st = tell(op);
      if (st.ok()) st = gather_reports(shard_, *cfg_.comm, 0, &reports_, &all);
      if (watchdog_) watchdog_->disarm();
      if (!st.ok()) return st;
      std::vector<GroupPeer> peers;
      std::string who;
      for (size_t r = 1; r < all.size(); ++r) {
        const bool here = all[r].host_id == all[0].host_id;
        peers.push_back({static_cast<int>(r), all[r].pid, here});
        who += ", rank " + std::to_string(r) + " pid " + std::to_string(all[r].pid) + (here ? " (this host)" : "");
      }
      watchdog_->set_peers(std::move(peers));
      std::fprintf(stderr, "snapserve: tensor-parallel group of %zu: rank 0 pid %lld%s; step timeout %.1f s\n",
                   all.size(), static_cast<long long>(current_pid()), who.c_str(), cfg_.step_timeout_seconds);
    }
    model_ = shard_.model.get();
    weights_ = shard_.weights.get();
    pool_ = shard_.pool.get();
    fwd_ = shard_.fwd.get();
    kvh_ = weights_->shard.num_kv_heads;
    SNAP_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load_for_model(cfg_.model_path));
    tokenizer_ = std::make_unique<Tokenizer>(std::move(tok));
    const ModelConfig& c = model_->config;
    context_ = c.max_position > 0 ? c.max_position : (int64_t{1} << 30);
    max_prompt_ = cfg_.max_prompt_tokens > 0 ? std::min(cfg_.max_prompt_tokens, context_) : context_;
    max_tokens_limit_ = cfg_.max_tokens_limit > 0 ? cfg_.max_tokens_limit : context_;
    name_ = cfg_.served_model_name;
    if (name_.empty()) {
      name_ = cfg_.model_path;
      while (!name_.empty() && name_.back() == '/') name_.pop_back();
      name_ = name_.substr(name_.find_last_of('/') + 1);
    }
    for (int32_t id : tokenizer_->eos_ids()) eos_.push_back(id);
    for (int32_t id : c.eos_token_ids) eos_.push_back(id);
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, spec_.ordinal) == cudaSuccess) device_name_ = prop.name;
    std::fprintf(stderr, "snapserve: --device %s (%s): weights %.1f MiB %s, KV pool %lld blocks of %lld bytes%s\n",
                 spec_.name().c_str(), device_name_.c_str(), weights_->bytes / 1048576.0,
                 weights_->storage().c_str(),
                 static_cast<long long>(pool_->num_blocks()), static_cast<long long>(pool_->block_bytes()),
                 grouped(cfg_) ? (", tensor parallel " + std::to_string(cfg_.comm->group_size()) + " ranks, exchange " +
                                  (shard_.exchange->staged() ? std::string("host-staged over ") + cfg_.comm->backend_name()
                                                             : std::string("nccl")) + "; rank 0 holds " +
                                  weights_->shard.describe()).c_str()
                                : "");
    alive_ = true;
    heartbeat_ = now_seconds();
    thread_ = std::thread([this] { loop(); });
    return {};
  }

  // --- Engine -------------------------------------------------------------------------

  Result<uint64_t> submit(EngineRequest req, EventSink sink) override {
    const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
    const int64_t vocab = model_->config.vocab_size;
    if (n == 0) return invalid_argument("prompt is empty");
    if (n > max_prompt_)
      return invalid_argument("prompt has " + std::to_string(n) + " tokens, more than the limit of " +
                              std::to_string(max_prompt_));
    for (int32_t id : req.prompt_ids)
      if (id < 0 || id >= vocab) return invalid_argument("prompt token id " + std::to_string(id) + " is outside the vocabulary");
    const int64_t min_tokens_allowed = req.prompt_logprobs >= 0 ? 0 : 1;  // echo may only score the prompt
    if (req.max_tokens < min_tokens_allowed || req.max_tokens > max_tokens_limit_)
      return invalid_argument("max_tokens must be in [" + std::to_string(min_tokens_allowed) + ", " +
                              std::to_string(max_tokens_limit_) + "], got " + std::to_string(req.max_tokens));
    if (req.prompt_logprobs > 20) return invalid_argument("prompt logprobs: at most 20 alternatives");
    if (req.prompt_logprobs >= 0 && req.kv_policy.layerwise)
      return invalid_argument("prompt logprobs (echo) need every position's logits; layer-wise prefill gives only the last");
    if (req.max_tokens == 0 && req.n > 1) return invalid_argument("n > 1 needs max_tokens >= 1");
    if (req.n < 1 || req.n > 64) return invalid_argument("n must be in [1, 64], got " + std::to_string(req.n));
    if (req.n > cfg_.max_num_seqs)
      return invalid_argument("n = " + std::to_string(req.n) + " choices exceed --max-num-seqs " +
                              std::to_string(cfg_.max_num_seqs));
    if (req.kv_policy.layerwise && req.kv_policy.context_tokens > 0)
      return invalid_argument("layer-wise prefill compresses the whole prompt; it cannot be combined with context-only compression");
    if (req.min_tokens < 0 || req.min_tokens > req.max_tokens)
      return invalid_argument("min_tokens must be in [0, max_tokens = " + std::to_string(req.max_tokens) + "], got " +
                              std::to_string(req.min_tokens));
    if (!(req.repetition_penalty > 0.0f)) return invalid_argument("repetition_penalty must be greater than 0");
    if (req.logprobs > 20) return invalid_argument("logprobs: at most 20 alternatives, got " + std::to_string(req.logprobs));
    for (int32_t id : req.stop_token_ids)
      if (id < 0 || id >= vocab) return invalid_argument("stop_token_ids: " + std::to_string(id) + " is outside the vocabulary");
    for (const auto& [id, bias] : req.logit_bias)
      if (id < 0 || id >= vocab) return invalid_argument("logit_bias: token " + std::to_string(id) + " is outside the vocabulary");
    SNAP_RETURN_IF_ERROR(req.kv_policy.validate());
    if (req.kv_policy.context_tokens > n) return invalid_argument("kv context_tokens is longer than the prompt");
    const bool layerwise_auto = choose_layerwise(req);
    if (layerwise_auto) req.kv_policy.layerwise = true;
    const int64_t need = peak_blocks(req);
    if (need > pool_->num_blocks())
      return invalid_argument("request needs " + std::to_string(need) + " device KV blocks at its peak but the pool has " +
                              std::to_string(pool_->num_blocks()) + " (shorten it, raise --kv-cache-mib, or use a compressing kv policy)");
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.load()) return unavailable("the tensor-parallel group failed: " + why());
    if (stopping_) {
      if (metrics_) metrics_->add_request_rejected("shutting_down");
      return unavailable("server is shutting down");
    }
    const int64_t queued = static_cast<int64_t>(incoming_.size()) + waiting_count_;
    const int64_t free_slots = std::max<int64_t>(0, cfg_.max_num_seqs - static_cast<int64_t>(running_.size()));
    if (queued + 1 > free_slots + cfg_.max_waiting) {
      if (metrics_) metrics_->add_request_rejected("queue_full");
      return resource_exhausted("too many requests waiting (" + std::to_string(cfg_.max_waiting) + "); retry later");
    }
    auto s = std::make_unique<DevSeq>();
    s->id = next_id_++;
    s->group = s->id;
    s->req = std::move(req);
    auto gate = std::make_shared<SinkGate>(std::move(sink), s->req.n);
    {
      std::lock_guard<std::mutex> gates_lock(gates_mu_);
      if (gates_failed_) return unavailable("the tensor-parallel group failed: " + why());
      gates_[s->id] = gate;
    }
    const uint64_t group = s->id;  // the gate goes once every choice has its finished event
    s->sink = [this, gate, group](const EngineEvent& ev) {
      if (!gate->deliver(ev)) return;
      std::lock_guard<std::mutex> gates_lock(gates_mu_);
      gates_.erase(group);
    };
    s->arrival = now_seconds();
    s->layerwise = s->req.kv_policy.layerwise && s->req.kv_policy.kind != KvPolicyKind::full;
    s->layerwise_auto = layerwise_auto;
    const uint64_t id = s->id;
    incoming_.push_back(std::move(s));
    cv_.notify_one();
    return id;
  }

  void cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
    cv_.notify_one();
  }

  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const ModelConfig& model_config() const override { return model_->config; }
  const std::string& model_name() const override { return name_; }
  bool healthy() const override {
    return alive_.load() && !broken_.load() && now_seconds() - heartbeat_.load() < 30.0;
  }
  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void shutdown(double deadline_seconds) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!thread_.joinable()) return;
      stopping_ = true;
      stop_deadline_ = now_seconds() + std::max(0.0, deadline_seconds);
      cv_.notify_one();
    }
    thread_.join();
  }

 private:
  // --- reservations (in device blocks) ----------------------------------------------------

  // Blocks layer l of a request holds after compression (+ max_tokens).
  int64_t layer_blocks_after_compression(const EngineRequest& req, int l) const {
    const ModelConfig& c = model_->config;
    const int64_t bs = cfg_.kv_block_size, kvh = c.num_kv_heads, n = static_cast<int64_t>(req.prompt_ids.size());
    const int64_t compress_at = req.kv_policy.context_tokens > 0 ? req.kv_policy.context_tokens : n;
    // pyramidkv layer budgets reach ~2x the average; adakv moves a layer's slots between heads
    // (one head may hold them all) and each head may use one partly filled block more. A gemma3
    // local layer keeps its window instead (DeviceForward::compress, as on the CPU).
    const bool windowed = c.sliding_window_pattern > 0 && c.layer_window(l) > 0;
    const int64_t budget = windowed                                           ? c.layer_window(l)
                           : req.kv_policy.kind == KvPolicyKind::pyramidkv ? 2 * req.kv_policy.budget
                                                                            : req.kv_policy.budget;
    const int64_t kept = std::min(compress_at, budget) + (n - compress_at) + req.max_tokens;
    if (req.kv_policy.kind == KvPolicyKind::adakv && !windowed) return ceil_div(kvh * kept, bs) + kvh;
    return kvh * ceil_div(kept, bs);
  }

  int64_t after_compression_blocks(const EngineRequest& req) const {
    int64_t blocks = 0;
    for (int l = 0; l < model_->config.num_layers; ++l) blocks += layer_blocks_after_compression(req, l);
    return blocks;
  }

  // The most blocks a request holds: the prompt uncompressed (one layer of it with layer-wise
  // prefill), plus one layer's fresh blocks during its compaction; or, after compression, its
  // compressed size + max_tokens, once per choice (n > 1).
  int64_t peak_blocks(const EngineRequest& req) const {
    const ModelConfig& c = model_->config;
    const int64_t bs = cfg_.kv_block_size, kvh = c.num_kv_heads, n = static_cast<int64_t>(req.prompt_ids.size());
    const int64_t heads = int64_t{c.num_layers} * kvh;
    // n choices: one prefill, then n copies of the (compressed) cache, each growing alone.
    if (req.kv_policy.kind == KvPolicyKind::full) return req.n * heads * ceil_div(n + req.max_tokens, bs);
    const int64_t after = after_compression_blocks(req);
    int64_t copy = 0;  // the largest layer's kept blocks (fresh ones during its compaction)
    for (int l = 0; l < c.num_layers; ++l) copy = std::max(copy, layer_blocks_after_compression(req, l));
    const int64_t prompt = req.kv_policy.layerwise ? kvh * ceil_div(n, bs) + after : heads * ceil_div(n, bs);
    return std::max(prompt + copy, req.n * after);
  }

  // The CPU engine's automatic choice (EngineConfig::auto_layerwise, prefill_choice.h) with the
  // device pool's block bytes: a compressing policy over the whole prompt, when it peaks lower.
  bool choose_layerwise(const EngineRequest& req) const {
    if (!cfg_.auto_layerwise || req.kv_policy.layerwise || req.kv_policy.kind == KvPolicyKind::full ||
        req.kv_policy.context_tokens > 0 || req.prompt_logprobs >= 0)
      return false;
    PrefillPeakInputs in;
    in.prompt_tokens = static_cast<int64_t>(req.prompt_ids.size());
    in.num_layers = model_->config.num_layers;
    in.kv_heads = model_->config.num_kv_heads;
    in.block_size = cfg_.kv_block_size;
    in.block_bytes = pool_->block_bytes();
    in.max_layer_budget = req.kv_policy.kind == KvPolicyKind::pyramidkv ? 2 * req.kv_policy.budget : req.kv_policy.budget;
    if (model_->config.sliding_window_pattern > 0)  // gemma3's local layers keep their window
      in.max_layer_budget = std::max<int64_t>(in.max_layer_budget, model_->config.sliding_window);
    in.prefill_chunk = cfg_.prefill_chunk;
    in.hidden_size = model_->config.hidden_size;
    return layerwise_prefill_is_cheaper(in);
  }

  // --- the scheduler loop -----------------------------------------------------------------

  void loop() {
    cudaSetDevice(spec_.ordinal);  // this thread drives the device
    while (true) {
      bool exit_loop = false;
      if (watchdog_) watchdog_->disarm();  // the last operation returned; idle waits have no deadline
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, idle_wait(cfg_.comm), [&] {
          return stopping_ || !incoming_.empty() || !cancels_.empty() || !running_.empty() || !waiting_.empty();
        });
        for (auto& s : incoming_) waiting_.push_back(std::move(s));
        incoming_.clear();
        for (uint64_t id : cancels_) cancel_now(id);
        cancels_.clear();
        if (stopping_) {  // nothing new starts; running ones may finish until the deadline
          while (!waiting_.empty()) {
            finish(*waiting_.front(), "abort");
            waiting_.pop_front();
          }
          if (running_.empty() || now_seconds() >= stop_deadline_) {
            for (auto& s : running_) finish(*s, "abort");
            running_.clear();
            exit_loop = true;
          }
        }
        waiting_count_ = static_cast<int64_t>(waiting_.size());
      }
      if (exit_loop) break;
      heartbeat_ = now_seconds();
      try {
        expire_timeouts();
        admit();
        if (!running_.empty()) step();
      } catch (const std::bad_alloc&) {
        out_of_memory();
      }
      if (broken_.load()) break;
      reap();
      publish_stats();
      if (broken_.load()) break;
    }
    if (broken_.load()) {
      fail_everything();
    } else {
      publish_stats();
      watchdog_.reset();  // the followers are about to exit on purpose
      DeviceOp bye;  // kind shutdown: the followers return
      const Status st = tell(bye);
      if (!st.ok()) std::fprintf(stderr, "snapserve: error: telling the tensor-parallel ranks to stop: %s\n", st.message().c_str());
    }
    alive_ = false;
  }

  // --- tensor parallelism: the lockstep and the group's failure ----------------------------

  // Sends `op` to the other ranks before rank 0 runs it (nothing alone).
  Status tell(const DeviceOp& op) {
    if (!grouped(cfg_)) return Status::ok_status();
    if (broken_.load()) return unavailable("the tensor-parallel group failed");
    if (watchdog_) {  // the previous operation has returned (one scheduler thread)
      watchdog_->disarm();
      const bool rows = op.kind == DeviceOpKind::decode;
      watchdog_->arm(rows ? static_cast<int64_t>(op.seqs.size()) : static_cast<int64_t>(op.tokens.size()));
    }
    std::vector<uint8_t> bytes = encode_device_op(op);
    return cfg_.comm->broadcast_message(bytes, 0, "device op");
  }

  // A device operation failed: alone, only its sequence fails; in a group the ranks may no
  // longer agree on their pools, so the group fails (the loop ends at the next check).
  void op_failed(DevSeq& s, const Status& st) {
    if (grouped(cfg_)) return group_failure(st);
    fail(s, st);
  }

  // From the scheduler thread or the watchdog's: never takes mu_ (the scheduler may be inside
  // an operation, holding it). Every open request ends at once with an unavailable error
  // through its gate (streams get an error event, the others a 503); the scheduler cleans its
  // lists up if it gets back, and the serving process exits (on_group_failure) either way.
  void group_failure(const Status& st) {
    {
      std::lock_guard<std::mutex> lock(why_mu_);
      if (broken_.load()) return;
      broken_why_ = st.message();
      broken_ = true;
    }
    std::fprintf(stderr, "snapserve: error: the tensor-parallel group failed: %s\n", st.message().c_str());
    if (cfg_.on_group_failure) cfg_.on_group_failure(st.message());
    std::map<uint64_t, std::shared_ptr<SinkGate>> gates;
    {
      std::lock_guard<std::mutex> lock(gates_mu_);
      gates_failed_ = true;
      gates.swap(gates_);
    }
    const Status failed = unavailable("the tensor-parallel group failed: " + st.message());
    for (auto& [id, gate] : gates) gate->fail(failed);
  }

  // After a group failure: every open request ends with an unavailable error; nothing is sent
  // to the other ranks (they may be gone) and the device pool is left as it is.
  std::string why() const {
    std::lock_guard<std::mutex> lock(why_mu_);
    return broken_why_;
  }

  void fail_everything() {
    std::lock_guard<std::mutex> lock(mu_);
    const Status failed = unavailable("the tensor-parallel group failed: " + why());
    for (auto* list : {&incoming_, &waiting_, &running_}) {
      for (auto& s : *list) {
        s->error = failed;
        s->pool_seq = -1;  // not released: the followers cannot repeat it
        finish(*s, "error");
      }
      list->clear();
    }
  }

  // Every choice of request `id`. Caller holds mu_.
  void cancel_now(uint64_t id) {
    for (auto* list : {&waiting_, &running_}) {
      for (auto it = list->begin(); it != list->end();) {
        if ((*it)->group == id) {
          finish(**it, "abort");
          it = list->erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  void expire_timeouts() {
    const double now = now_seconds();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* list : {&waiting_, &running_}) {
      for (auto it = list->begin(); it != list->end();) {
        if ((*it)->req.timeout_seconds > 0 && now - (*it)->arrival > (*it)->req.timeout_seconds) {
          finish(**it, "timeout");
          it = list->erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  void admit() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs) {
      DevSeq& s = *waiting_.front();
      if (static_cast<int64_t>(running_.size()) + s.req.n > cfg_.max_num_seqs) break;  // room for every choice
      const int64_t need = peak_blocks(s.req);
      if (reserved_blocks_ + need > pool_->num_blocks()) break;  // FIFO: wait for room
      s.reserved_blocks = need;
      reserved_blocks_ += need;
      s.admitted = now_seconds();
      s.compress_at = s.req.kv_policy.context_tokens > 0 ? s.req.kv_policy.context_tokens : s.prompt_len();
      s.decoder = std::make_unique<StreamDecoder>(*tokenizer_, true);
      s.rng = kernels::Rng(s.req.sampling.seed);
      s.logits.resize(static_cast<size_t>(model_->config.vocab_size));
      if (s.req.repetition_penalty != 1.0f) {
        s.history.prompt_unique = s.req.prompt_ids;
        std::sort(s.history.prompt_unique.begin(), s.history.prompt_unique.end());
        s.history.prompt_unique.erase(std::unique(s.history.prompt_unique.begin(), s.history.prompt_unique.end()),
                                      s.history.prompt_unique.end());
      }
      if (metrics_) metrics_->observe_request_queue_time(s.admitted - s.arrival);
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
    waiting_count_ = static_cast<int64_t>(waiting_.size());
  }

  // One step: a prompt chunk of the oldest prefilling sequence, then one decode row of
  // every decoding sequence (those that were decoding before this step's chunk).
  void step() {
    const double t0 = now_seconds();
    std::vector<DevSeq*> decoding;
    DevSeq* prefill = nullptr;
    for (auto& s : running_) {
      if (!s->done_reason.empty()) continue;
      if (!s->prefilling()) {
        decoding.push_back(s.get());
      } else if (prefill == nullptr) {
        prefill = s.get();
      }
    }
    if (prefill) run_prefill_chunk(*prefill, t0);
    if (!decoding.empty()) run_decode(decoding);
    // Fault injection for tests, as the CPU engine's: $SNAP_FAULT_BAD_ALLOC_STEP=N makes the N-th
    // step's allocation after its device operations fail.
    if (fault_bad_alloc_step_ > 0 && ++steps_run_ == fault_bad_alloc_step_) throw std::bad_alloc();
    peak_step_sequences_ = std::max<int64_t>(peak_step_sequences_, static_cast<int64_t>(decoding.size()) + (prefill ? 1 : 0));
    if (metrics_) metrics_->observe_step_latency(prefill ? "prefill" : "decode", 0, now_seconds() - t0);
  }

  void run_prefill_chunk(DevSeq& s, double t0) {
    const KvPolicy& policy = s.req.kv_policy;
    if (s.layerwise) return run_layerwise_prefill(s);
    if (s.pool_seq < 0) {
      s.pool_seq = pool_->add_sequence();
      DeviceOp op;
      op.kind = DeviceOpKind::open;
      op.seq = s.pool_seq;
      op.policy = policy;
      op.compress_at = s.compress_at;
      if (Status st = tell(op); !st.ok()) return group_failure(st);
      s.window = fwd_->prepare_compression(policy, s.compress_at);
    }
    // A chunk never crosses the compression point, and the one ending there holds >= window rows.
    const int64_t end = s.prefilled < s.compress_at ? s.compress_at : s.prompt_len();
    const int64_t rem = end - s.prefilled;
    const int64_t tail = end == s.compress_at ? s.window : 0;
    int64_t len = std::min(cfg_.prefill_chunk, rem);
    if (rem > std::max<int64_t>(cfg_.prefill_chunk, tail) && rem - len < tail) len = rem - tail;
    if (rem <= std::max<int64_t>(cfg_.prefill_chunk, tail)) len = rem;
    // Echo's prompt logprobs: every row of the chunk through the LM head, scored on the host as
    // the CPU engine scores them; the prompt's last row is the next-token distribution.
    const bool scored = s.req.prompt_logprobs >= 0;
    const int64_t vocab = model_->config.vocab_size;
    DeviceOp op;
    op.kind = DeviceOpKind::forward;
    op.seq = s.pool_seq;
    op.all_logits = scored;
    op.tokens.assign(s.req.prompt_ids.begin() + s.prefilled, s.req.prompt_ids.begin() + s.prefilled + len);
    Status st = tell(op);
    if (!st.ok()) return group_failure(st);
    if (scored) s.chunk_logits.resize(static_cast<size_t>(len * vocab));
    st = fwd_->forward(s.pool_seq, op.tokens.data(), len, scored ? s.chunk_logits.data() : s.logits.data(), scored,
                       nullptr);
    if (!st.ok()) return op_failed(s, st);
    if (scored) score_prompt_chunk(s, s.chunk_logits.data(), s.prefilled, len, vocab);
    s.prefilled += len;
    if (policy.kind != KvPolicyKind::full && !s.compressed && s.prefilled == s.compress_at) {
      const double ts = now_seconds();
      std::vector<std::vector<std::vector<int32_t>>> kept;
      DeviceOp cop;
      cop.kind = DeviceOpKind::compress;
      cop.seq = s.pool_seq;
      cop.policy = policy;
      cop.compress_at = s.compress_at;
      st = tell(cop);
      if (!st.ok()) return group_failure(st);
      st = fwd_->compress(s.pool_seq, policy, s.compress_at, &kept);
      if (!st.ok()) return op_failed(s, st);
      s.compressed = true;
      if (metrics_) metrics_->observe_snapkv_selection(now_seconds() - ts);
      const int64_t after = s.req.n * after_compression_blocks(s.req);  // every choice's copy
      std::lock_guard<std::mutex> lock(mu_);
      if (after < s.reserved_blocks) {
        reserved_blocks_ -= s.reserved_blocks - after;
        s.reserved_blocks = after;
      }
    }
    if (!s.prefilling()) prefill_done(s);
    (void)t0;
  }

  // s's whole prompt is in its cache (compressed when its policy compresses): echo's scoring
  // alone ends here; n > 1 forks the other choices; every choice samples its first token.
  void prefill_done(DevSeq& s) {
    s.chunk_logits = {};
    s.prefill_seconds = now_seconds() - s.admitted;
    if (metrics_) metrics_->observe_request_prefill_time(s.prefill_seconds);
    if (s.req.max_tokens == 0) {  // scoring only (echo): nothing to generate
      s.done_reason = "length";
      return;
    }
    std::vector<std::unique_ptr<DevSeq>> choices;
    if (s.req.n > 1) {
      if (Status st = fork_choices(s, &choices); !st.ok()) return op_failed(s, st);
    }
    sample_and_emit(s);
    for (auto& c : choices) sample_and_emit(*c);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : choices) running_.push_back(std::move(c));
  }

  // Choices 1..n-1 of s's request: each a copy of s's KV cache in the device pool (every rank's,
  // one fork op), 1/n of s's reservation, and its own stream (start_choice: seed + choice).
  Status fork_choices(DevSeq& s, std::vector<std::unique_ptr<DevSeq>>* out) {
    DeviceOp op;
    op.kind = DeviceOpKind::fork;
    op.seq = s.pool_seq;
    for (int c = 1; c < s.req.n; ++c) {
      Result<int32_t> copy = pool_->fork(s.pool_seq);
      if (!copy.ok()) {
        for (int32_t id : op.seqs) (void)pool_->release(id);  // none reached the other ranks
        return copy.status();
      }
      op.seqs.push_back(*copy);
    }
    if (Status st = tell(op); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t share = s.reserved_blocks / s.req.n;
    for (int c = 1; c < s.req.n; ++c) {
      auto k = std::make_unique<DevSeq>();
      k->id = next_id_++;
      start_choice(s, c, *tokenizer_, k.get());
      k->pool_seq = op.seqs[static_cast<size_t>(c - 1)];
      k->compress_at = s.compress_at;
      k->window = s.window;
      k->compressed = s.compressed;
      k->layerwise = s.layerwise;
      k->layerwise_auto = s.layerwise_auto;
      k->reserved_blocks = share;
      s.reserved_blocks -= share;
      out->push_back(std::move(k));
    }
    s.forked = true;
    return Status::ok_status();
  }

  // The whole prompt, one layer at a time, alone in its step (as on the CPU); the decode rows
  // of the other sequences run after it in the same step.
  void run_layerwise_prefill(DevSeq& s) {
    s.pool_seq = pool_->add_sequence();
    std::vector<std::vector<std::vector<int32_t>>> kept;
    const double ts = now_seconds();
    DeviceOp op;  // opens the sequence on the others too
    op.kind = DeviceOpKind::layerwise;
    op.seq = s.pool_seq;
    op.tokens = s.req.prompt_ids;
    op.chunk = cfg_.prefill_chunk;
    op.policy = s.req.kv_policy;
    if (Status st = tell(op); !st.ok()) return group_failure(st);
    const Status st = fwd_->prefill_layerwise(s.pool_seq, s.req.prompt_ids.data(), s.prompt_len(), cfg_.prefill_chunk,
                                              s.req.kv_policy, s.logits.data(), &kept);
    if (!st.ok()) return op_failed(s, st);
    s.prefilled = s.prompt_len();
    s.compressed = true;
    if (metrics_) metrics_->observe_snapkv_selection(now_seconds() - ts);
    {
      const int64_t after = s.req.n * after_compression_blocks(s.req);  // every choice's copy
      std::lock_guard<std::mutex> lock(mu_);
      if (after < s.reserved_blocks) {
        reserved_blocks_ -= s.reserved_blocks - after;
        s.reserved_blocks = after;
      }
    }
    prefill_done(s);
  }

  void run_decode(const std::vector<DevSeq*>& rows) {
    const int64_t vocab = model_->config.vocab_size, n = static_cast<int64_t>(rows.size());
    std::vector<int32_t> seqs(static_cast<size_t>(n)), tokens(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; ++b) {
      seqs[b] = rows[b]->pool_seq;
      tokens[b] = rows[b]->next_token;
    }
    // Greedy rows that need nothing else of their logits take their ids from the device's argmax
    // (the host's tie rule), and only the other rows' logits cross to the host: none when every
    // row of the step is such.
    std::vector<uint8_t> wants(static_cast<size_t>(n));
    int64_t host_n = 0;
    for (int64_t b = 0; b < n; ++b) {
      wants[b] = greedy_without_logits(*rows[b]) ? 0 : 1;
      host_n += wants[b];
    }
    float* logits = host_n == 0 ? nullptr : batch_logits_.reserve(static_cast<size_t>(n * vocab));
    std::vector<int32_t> ids(static_cast<size_t>(host_n < n ? n : 0));
    DeviceOp op;
    op.kind = DeviceOpKind::decode;
    op.seqs = seqs;
    op.tokens = tokens;
    Status st = tell(op);
    if (!st.ok()) return group_failure(st);
    st = fwd_->decode_batch(seqs.data(), tokens.data(), n, logits, ids.empty() ? nullptr : ids.data(),
                            host_n < n ? wants.data() : nullptr);
    if (!st.ok() && grouped(cfg_)) return group_failure(st);
    if (st.ok() && metrics_) {
      if (host_n < n) metrics_->add_decode_rows("device", n - host_n);
      if (host_n > 0) metrics_->add_decode_rows("host", host_n);
    }
    const EmitContext context = emit_context();
    std::vector<TokenStream*> host_rows;
    std::vector<const float*> row_logits;
    for (int64_t b = 0; b < n; ++b) {
      if (!st.ok()) {
        fail(*rows[b], st);
        continue;
      }
      if (!wants[b]) {
        emit_token(*rows[b], context, ids[b]);
        continue;
      }
      host_rows.push_back(rows[b]);
      row_logits.push_back(logits + b * vocab);
    }
    // The rows' draws straight from the page-locked logits, on OpenMP threads (each row its own
    // generator), then their events in row order.
    sample_and_emit_rows(host_rows, context, row_logits.data());
  }

  void fail(DevSeq& s, const Status& st) {
    s.done_reason = "error";
    s.error = st;
  }

  // A host allocation failed inside a step (std::bad_alloc; the device's own runs out as CUDA
  // errors, a Status): as the CPU engine does, every running request ends with an error naming
  // it (reap releases their device blocks) and the loop goes on; a tensor-parallel group fails,
  // the followers having perhaps run an operation this rank did not finish.
  void out_of_memory() {
    const std::string why =
        "out of memory: a host allocation failed during a step" + memory_left_phrase() + "; the running requests were ended";
    std::fprintf(stderr, "snapserve: error: %s\n", why.c_str());
    if (grouped(cfg_)) return group_failure(internal_error(why));
    for (auto& s : running_)
      if (s->done_reason.empty()) fail(*s, internal_error(why));
  }

  EmitContext emit_context() const {
    EmitContext c;
    c.vocab = model_->config.vocab_size;
    c.context = context_;
    c.eos = &eos_;
    c.metrics = metrics_;
    return c;
  }
  // Samples the next token from s.logits and streams it, as the CPU engine does.
  void sample_and_emit(DevSeq& s) { snap::sample_and_emit(s, emit_context()); }

  void reap() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = running_.begin(); it != running_.end();) {
      if (!(*it)->done_reason.empty()) {
        finish(**it, (*it)->done_reason);
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The final event; the sequence's device blocks and reservation go back first. Caller holds mu_.
  void finish(DevSeq& s, const std::string& reason) {
    EngineEvent ev;
    ev.index = s.choice;
    finish_stream(s, reason, &ev);
    if (!s.child()) ev.prompt_logprobs = std::move(s.prompt_logprobs);
    ev.prefill_kind = prefill_kind_name(s.layerwise, s.layerwise_auto);
    if (s.pool_seq >= 0) {
      ev.kv_resident_bytes = pool_->resident_bytes(s.pool_seq);
      ev.kv_full_equivalent_bytes = pool_->full_equivalent_bytes(s.pool_seq);
      DeviceOp op;
      op.kind = DeviceOpKind::release;
      op.seq = s.pool_seq;
      op.disarm = s.prefilling();
      if (Status told = tell(op); !told.ok()) group_failure(told);
      const Status st = pool_->release(s.pool_seq);
      if (!st.ok()) std::fprintf(stderr, "snapserve: error: releasing device sequence: %s\n", st.message().c_str());
      s.pool_seq = -1;
      // A sequence cancelled during its prefill leaves the forward's capture armed: disarm it.
      if (op.disarm) fwd_->prepare_compression(KvPolicy{}, 0);
    }
    reserved_blocks_ -= s.reserved_blocks;
    s.reserved_blocks = 0;
    if (metrics_) {
      const double now = now_seconds();
      metrics_->add_generation_tokens(s.generated);
      if (!s.child()) {  // per request, not per choice
        metrics_->add_prompt_tokens(s.prefilled);
        metrics_->add_request_success(ev.finish_reason);
        metrics_->observe_e2e_request_latency(now - s.arrival);
      }
      if (s.generated > 1) metrics_->observe_time_per_output_token((s.last_token - s.first_token) / (s.generated - 1));
      if (ev.kv_resident_bytes > 0 && s.compressed)
        metrics_->observe_kv_compression_ratio(kv_policy_name(s.req.kv_policy.kind),
                                               static_cast<double>(ev.kv_full_equivalent_bytes) / ev.kv_resident_bytes);
    }
    s.sink(ev);
    // Choice 0 ending before its prompt forked (cancelled, timed out or failed during its
    // prefill): the other choices never started, and end with it.
    end_unforked_choices(s, ev);
  }

  void publish_stats() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t used = pool_->used_blocks();
    peak_blocks_ = std::max(peak_blocks_, used);
    stats_.running = static_cast<int64_t>(running_.size());
    stats_.waiting = static_cast<int64_t>(waiting_.size() + incoming_.size());
    stats_.kv_blocks_used = used;
    stats_.kv_blocks_total = pool_->num_blocks();
    stats_.peak_step_sequences = peak_step_sequences_;
    stats_.peak_kv_blocks_used = peak_blocks_;
    if (metrics_) publish_metrics(lock);
    if (!grouped(cfg_)) return;
    // The group's, about once a second: one `report` op (an all_gather over the launcher's
    // communicator, outside mu_: submit() must not wait for the other ranks). Without metrics
    // (batch) too: it is the idle leader's heartbeat, since the followers give up on a rank 0
    // silent for --collective-timeout (run_device_engine_follower); so it comes at least every
    // quarter of that (report_interval_seconds).
    const double now = now_seconds();
    if (now - last_report_ < report_interval_seconds(cfg_.comm)) return;
    last_report_ = now;
    lock.unlock();
    DeviceOp op;
    op.kind = DeviceOpKind::report;
    std::vector<RankDeviceReport> all;
    Status st = tell(op);
    if (st.ok()) st = gather_reports(shard_, *cfg_.comm, peak_blocks_, &reports_, &all);
    if (!st.ok()) return group_failure(st);
    if (metrics_)
      for (size_t r = 0; r < all.size(); ++r) set_rank_metrics(static_cast<int>(r), all[r], true);
  }

  // This rank's gauges on /metrics (mu_ held); alone, also its memory and counters.
  void publish_metrics(const std::unique_lock<std::mutex>&) {
    const int64_t used = stats_.kv_blocks_used;
    int64_t full = 0;
    for (auto& s : running_)
      if (s->pool_seq >= 0) full += pool_->full_equivalent_bytes(s->pool_seq);
    const int64_t bb = pool_->block_bytes();
    metrics_->set_num_requests_running(stats_.running);
    metrics_->set_num_requests_waiting(stats_.waiting);
    metrics_->set_kv_cache_usage_ratio(static_cast<double>(used) / std::max<int64_t>(1, pool_->num_blocks()));
    metrics_->set_kv_cache_resident_bytes(0, used * bb);
    metrics_->set_kv_cache_full_equivalent_bytes(0, full);
    metrics_->set_process_resident_memory_bytes(0, current_rss_bytes());
    if (!grouped(cfg_)) set_rank_metrics(0, local_report(shard_, nullptr, peak_blocks_, 0), false);
  }

  // Rank r's gauges and counters on /metrics (counters: what is new since its last report).
  void set_rank_metrics(int r, const RankDeviceReport& rep, bool with_comm) {
    metrics_->set_device_memory_bytes(r, "kv_pool_used", rep.pool_used);
    metrics_->set_device_memory_bytes(r, "kv_pool_free", rep.pool_free);
    metrics_->set_device_memory_bytes(r, "kv_pool_peak", rep.pool_peak);
    metrics_->set_device_memory_bytes(r, "weights", rep.weights);
    metrics_->set_device_memory_bytes(r, "scratch", rep.scratch);
    if (rep.total > 0) {
      metrics_->set_device_memory_bytes(r, "in_use", rep.in_use);
      metrics_->set_device_memory_bytes(r, "total", rep.total);
    }
    if (!with_comm) return;
    metrics_->set_kv_cache_resident_bytes(r, rep.pool_used);
    metrics_->set_process_resident_memory_bytes(r, rep.rss);
    metrics_->set_rank_last_report_time(r, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    if (reported_.size() <= static_cast<size_t>(r)) reported_.resize(static_cast<size_t>(r) + 1);
    RankDeviceReport& last = reported_[static_cast<size_t>(r)];
    metrics_->add_comm_bytes(r, "all_reduce", rep.all_reduce_bytes - last.all_reduce_bytes);
    metrics_->add_comm_bytes(r, "all_gather", rep.all_gather_bytes - last.all_gather_bytes);
    metrics_->add_comm_bytes(r, "broadcast", rep.broadcast_bytes - last.broadcast_bytes);
    metrics_->add_comm_seconds(r, "all_reduce", (rep.all_reduce_us - last.all_reduce_us) * 1e-6);
    metrics_->add_comm_seconds(r, "all_gather", (rep.all_gather_us - last.all_gather_us) * 1e-6);
    metrics_->add_comm_seconds(r, "broadcast", (rep.broadcast_us - last.broadcast_us) * 1e-6);
    last = rep;
  }

  DeviceSpec spec_;
  EngineConfig cfg_;
  ServerMetrics* metrics_;
  DeviceShard shard_;  // this rank's model, weights, pool, exchange and forward; the four below
  const LoadedModel* model_ = nullptr;
  const DeviceWeights* weights_ = nullptr;
  DeviceKvPool* pool_ = nullptr;
  DeviceForward* fwd_ = nullptr;
  int64_t kvh_ = 0;  // this rank's KV heads (the model's alone)
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string name_, device_name_ = "?";
  std::vector<int32_t> eos_;
  HostLogits batch_logits_;  // [decode rows, vocab], page-locked
  int64_t context_ = 0, max_prompt_ = 0, max_tokens_limit_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<DevSeq>> incoming_, waiting_, running_;
  std::vector<uint64_t> cancels_;
  int64_t waiting_count_ = 0, reserved_blocks_ = 0, peak_step_sequences_ = 0, peak_blocks_ = 0;
  uint64_t next_id_ = 1;
  bool stopping_ = false;
  double stop_deadline_ = 0;
  EngineStats stats_;
  std::atomic<bool> alive_{false};
  std::atomic<bool> broken_{false};  // the tensor-parallel group failed
  int64_t steps_run_ = 0;             // scheduler thread only (for the fault above)
  const int64_t fault_bad_alloc_step_ = fault_bad_alloc_step();
  mutable std::mutex why_mu_;        // guards broken_why_ (never held with mu_ wanted after it)
  std::string broken_why_;
  std::unique_ptr<GroupWatchdog> watchdog_;  // with a group only
  // Every request not yet finished, by id (taken after mu_ where both are held).
  std::mutex gates_mu_;
  std::map<uint64_t, std::shared_ptr<SinkGate>> gates_;
  bool gates_failed_ = false;  // group_failure has ended them: refuse new ones
  double last_report_ = -1e9;        // the last `report` op (engine thread)
  int64_t reports_ = 0;              // reports gathered
  std::vector<RankDeviceReport> reported_;  // last report per rank (counter deltas)
  std::atomic<double> heartbeat_{0};
  std::thread thread_;
};

}  // namespace

// A tensor-parallel rank other than 0: its shard, then rank 0's DeviceOps in order until the
// shutdown op. Any failure ends it (rank 0 then fails the group at its next exchange).
Status run_device_engine_follower(const DeviceSpec& spec, const EngineConfig& cfg) {
  if (!grouped(cfg) || cfg.comm->group_rank() == 0)
    return internal_error("run_device_engine_follower: only tp ranks other than 0 follow");
  if (cfg.kv_block_size != 16) return invalid_argument("the device KV pool has 16-token blocks");
  DeviceShard d;
  SNAP_RETURN_IF_ERROR(d.open_agreed(spec, cfg));
  int64_t reports = 0;
  std::vector<RankDeviceReport> all;
  // Rank 0 sends an op every step and a report at least once a second when idle: bounded
  // waits, --load-timeout for the first op, then --collective-timeout (a stopped or hung rank
  // 0 ends the group instead of leaving this rank waiting for ever).
  cfg.comm->bound_broadcasts();
  const auto check_opened = [](int32_t got, int32_t want) {
    return got == want ? Status::ok_status()
                       : internal_error("device op: this rank's pool opened sequence " + std::to_string(got) +
                                        " where rank 0's opened " + std::to_string(want) + ": the ranks' pools disagree");
  };
  for (;;) {
    std::vector<uint8_t> bytes;
    SNAP_RETURN_IF_ERROR(cfg.comm->broadcast_message(bytes, 0, "device op"));
    SNAP_ASSIGN_OR_RETURN(DeviceOp op, decode_device_op(bytes));
    const int64_t n = static_cast<int64_t>(op.tokens.size());
    switch (op.kind) {
      case DeviceOpKind::shutdown:
        return Status::ok_status();
      case DeviceOpKind::open:
        SNAP_RETURN_IF_ERROR(check_opened(d.pool->add_sequence(), op.seq));
        d.fwd->prepare_compression(op.policy, op.compress_at);
        break;
      case DeviceOpKind::forward:
        SNAP_RETURN_IF_ERROR(d.fwd->forward(op.seq, op.tokens.data(), n, nullptr, op.all_logits, nullptr));
        break;
      case DeviceOpKind::compress:
        SNAP_RETURN_IF_ERROR(d.fwd->compress(op.seq, op.policy, op.compress_at, nullptr));
        break;
      case DeviceOpKind::layerwise:
        SNAP_RETURN_IF_ERROR(check_opened(d.pool->add_sequence(), op.seq));
        SNAP_RETURN_IF_ERROR(d.fwd->prefill_layerwise(op.seq, op.tokens.data(), n, op.chunk, op.policy, nullptr, nullptr));
        break;
      case DeviceOpKind::decode:
        if (op.seqs.size() != op.tokens.size()) return data_loss("device op: a decode with unequal sequences and tokens");
        SNAP_RETURN_IF_ERROR(d.fwd->decode_batch(op.seqs.data(), op.tokens.data(), n, nullptr, nullptr));
        break;
      case DeviceOpKind::release:
        SNAP_RETURN_IF_ERROR(d.pool->release(op.seq));
        if (op.disarm) d.fwd->prepare_compression(KvPolicy{}, 0);
        break;
      case DeviceOpKind::report:
        SNAP_RETURN_IF_ERROR(gather_reports(d, *cfg.comm, 0, &reports, &all));
        break;
      case DeviceOpKind::fork:
        for (int32_t want : op.seqs) {
          SNAP_ASSIGN_OR_RETURN(int32_t got, d.pool->fork(op.seq));
          SNAP_RETURN_IF_ERROR(check_opened(got, want));
        }
        break;
    }
  }
}

Result<std::unique_ptr<Engine>> open_device_engine(const DeviceSpec& spec, const EngineConfig& cfg, ServerMetrics* metrics) {
  if (spec.kind != DeviceKind::cuda) return invalid_argument("open_device_engine: " + spec.name() + " is not a device");
  auto engine = std::make_unique<DeviceEngine>(spec, cfg, metrics);
  SNAP_RETURN_IF_ERROR(engine->init());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace snap
