// generate() on one GPU (coordinator/engine/device_spec.h): check_device, and the
// DeviceGenerator over DeviceForward. The loop is generate.cpp's — prefill in chunks that never
// cross the compression point, compress, then sample and decode one token per forward — with
// the KV pool, weights and activations on the device and sampling on the host from the logits
// (greedy: the device's argmax, same tie rule as sample_cpu, so only 4 bytes cross per token).
// Layer-wise prefill (DeviceForward::prefill_layerwise) when asked or when it peaks lower, as on
// the CPU. Policies, every one the CPU has: full, snapkv, pyramidkv (snapkv_select_cuda per layer with
// the CPU's layer budgets), adakv (adakv_select_cuda), h2o (scores accumulated on the device
// during prefill, h2o_select_cuda) and streaming (positions only: the CPU's streaming_select,
// compaction on the device).
// Tensor parallelism: every rank runs this same loop on its shard in lockstep. Rank 0 sends a
// request's header (device_request.h) before it starts and each decoded token id (with "go on")
// before each decode forward, and one "no more tokens" message after every request whatever
// its outcome, over the control communicator; the forward's own collectives go through the
// DeviceExchange. Each rank compresses its own KV heads and writes its own selection dump
// (path + ".rank<r>"). An error that strikes every rank alike (the pool too small) ends the
// request everywhere and the group goes on; one rank's device failing inside a collective is
// bounded by the NCCL timeout (comm/nccl.cpp) or the host backend's closed connection.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <span>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "common/sys.h"
#include "coordinator/engine/device_request.h"
#include "coordinator/engine/device_spec.h"
#include "coordinator/engine/prefill_choice.h"
#include "kernels/kernels.h"
#include "worker/device/device_exchange.h"
#include "worker/device/device_forward.h"
#include "worker/device/device_kv_pool.h"
#include "worker/device/device_weights.h"
#include "worker/kv/selection.h"

namespace snap {

bool build_has_cuda() { return true; }

#if defined(SNAP_HOST_TWIN)  // kernels/cuda/host: "device" buffers are host memory NCCL cannot read
bool device_nccl_usable() { return false; }
#else
bool device_nccl_usable() { return comm::nccl_compiled(); }
#endif

Status check_device(const DeviceSpec& spec) {
  if (spec.kind == DeviceKind::cpu) return {};
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return unavailable("--device " + spec.name() + ": no CUDA device (cudaGetDeviceCount: error " +
                       std::to_string(static_cast<int>(e)) + " " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) +
                       ")");
  }
  if (count == 0) return unavailable("--device " + spec.name() + ": no CUDA device (cudaGetDeviceCount: 0 devices)");
  if (spec.ordinal >= count) {
    return invalid_argument("--device " + spec.name() + ": this machine has " + std::to_string(count) +
                            " CUDA device(s), cuda:0..cuda:" + std::to_string(count - 1));
  }
  const cudaError_t s = cudaSetDevice(spec.ordinal);
  if (s != cudaSuccess) {
    return unavailable("--device " + spec.name() + ": cudaSetDevice: " + std::string(cudaGetErrorString(s)));
  }
  return {};
}

Result<DeviceSpec> device_for_local_rank(int local_rank) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) return DeviceSpec{DeviceKind::cuda, 0};  // check_device says why
  return DeviceSpec{DeviceKind::cuda, local_rank % count};
}

namespace {


// The kept positions per layer and KV head, in the CPU's dump format (Worker::write_selection).
Status write_selection(const std::string& dump_path, const TpShard& sh, const KvPolicy& p, int64_t prompt_tokens,
                       int64_t compress_at, const std::vector<std::vector<std::vector<int32_t>>>& kept) {
  nlohmann::json doc;
  doc["policy"] = kv_policy_name(p.kind);
  doc["prompt_tokens"] = prompt_tokens;
  doc["compressed_tokens"] = compress_at;
  doc["budget"] = p.budget;
  doc["window"] = p.window;
  doc["kernel"] = p.kernel;
  doc["pooling"] = p.pooling == KvPooling::max ? "max" : "avg";
  doc["gqa"] = p.aggregation == GqaAggregation::mean ? "mean" : "max";
  doc["tp_rank"] = sh.tp_rank;
  doc["tp_size"] = sh.tp_size;
  doc["kv_head_begin"] = sh.kv_head_begin;
  doc["kv_replicas"] = sh.kv_replicas;
  doc["device"] = "cuda";
  doc["layers"] = nlohmann::json::array();
  for (size_t l = 0; l < kept.size(); ++l) doc["layers"].push_back({{"layer", l}, {"heads", kept[l]}});
  const std::string path = sh.tp_size > 1 ? dump_path + ".rank" + std::to_string(sh.tp_rank) : dump_path;
  std::ofstream f(path);
  f << doc.dump() << "\n";
  if (!f) return invalid_argument(path + ": cannot write the KV selection dump");
  return {};
}

// --- the lockstep protocol (tp > 1): headers in coordinator/engine/device_request.h ------------
class CudaGenerator final : public DeviceGenerator {
 public:
  CudaGenerator(const DeviceSpec& spec, const LoadedModel& model, std::unique_ptr<DeviceWeights> weights,
                cudaStream_t stream, comm::Communicator* control, comm::Communicator* exchange, DType exchange_dtype)
      : spec_(spec), config_(model.config), weights_(std::move(weights)), stream_(stream), control_(control) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, spec.ordinal) == cudaSuccess) device_name_ = prop.name;
    if (exchange != nullptr && exchange->group_size() > 1)
      exchange_ = std::make_unique<DeviceExchange>(*exchange, stream_, exchange_dtype);
  }
  ~CudaGenerator() override {
    exchange_.reset();
    weights_.reset();
    cudaStreamDestroy(stream_);
  }

  Result<GenerateResult> generate(const GenerateRequest& req, const GenerateHooks& hooks) override;
  Status follow() override;
  Status shutdown() override {
    if (!grouped() || shut_down_) return {};
    shut_down_ = true;
    DeviceRequestHeader h;
    h.shutdown = true;
    std::vector<uint8_t> bytes = encode_device_request(h);
    return control_->broadcast_message(bytes, 0, "device request header");
  }
  const comm::Communicator* exchange_comm() const override { return exchange_ ? &exchange_->comm() : nullptr; }
  comm::CommStats exchange_after_prefill() const override { return after_prefill_; }
  comm::CommStats exchange_at_end() const override { return at_end_; }
  std::string describe_memory() const override {
    if (ranks_.empty()) return describe(memory_now(), "");
    // Every rank's figures from the end of the last request (gather_rank_memory), one line each.
    std::string out;
    for (size_t r = 0; r < ranks_.size(); ++r)
      out += (r == 0 ? "" : "\nsnapserve: ") + describe(ranks_[r], "rank " + std::to_string(r) + " ");
    return out;
  }

 private:
  bool grouped() const { return control_ != nullptr && control_->group_size() > 1; }
  bool leads() const { return !grouped() || control_->group_rank() == 0; }
  Status validate(const GenerateRequest& req) const;
  // The (validated) request on this rank; prompt_logits: every prompt row through the LM head (rank 0:
  // hooks.on_prompt_logits is set; it is told the others).
  Result<GenerateResult> run_request(const GenerateRequest& req, const GenerateHooks& hooks, bool prompt_logits);
  Status run(DeviceForward& fwd, DeviceKvPool& pool, int32_t seq, const GenerateRequest& req,
             const GenerateHooks& hooks, bool prompt_logits, int64_t limit, GenerateResult& result);
  // Rank 0 tells the others the next decode token (go) or the end of the request.
  Status tell_step(int32_t id, bool go);
  // One rank's memory and exchange figures (MiB and seconds as f32, what a report shows).
  struct RankMemory {
    float ordinal = 0, weights = 0, pool = 0, pool_peak = 0, scratch = 0, in_use = 0, total = 0, exchange_s = 0;
  };
  RankMemory memory_now() const;
  std::string describe(const RankMemory& m, const std::string& who) const;
  // After every request, on every rank: the group's RankMemory to rank 0 (one all_gather of
  // 32 bytes per rank on the control communicator, counted in its all_gather bytes).
  Status gather_rank_memory();

  DeviceSpec spec_;
  const ModelConfig& config_;
  std::unique_ptr<DeviceWeights> weights_;
  cudaStream_t stream_;
  std::string device_name_ = "?";
  int64_t pool_bytes_ = 0, pool_peak_bytes_ = 0, scratch_bytes_ = 0;  // of the last request
  comm::Communicator* control_ = nullptr;    // the group's host communicator (tp > 1)
  std::unique_ptr<DeviceExchange> exchange_;  // the forward's collectives (tp > 1)
  comm::CommStats after_prefill_, at_end_;
  bool shut_down_ = false;
  bool ended_ = false;  // a follower read rank 0's end of the current request
  std::vector<RankMemory> ranks_;  // rank 0, tp > 1: every rank's, after the last request
};

CudaGenerator::RankMemory CudaGenerator::memory_now() const {
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  const auto m = [](int64_t b) { return static_cast<float>(b / 1048576.0); };
  RankMemory r;
  r.ordinal = static_cast<float>(spec_.ordinal);
  r.weights = m(weights_->bytes);
  r.pool = m(pool_bytes_);
  r.pool_peak = m(pool_peak_bytes_);
  r.scratch = m(scratch_bytes_);
  r.in_use = m(static_cast<int64_t>(total_b - free_b));
  r.total = m(static_cast<int64_t>(total_b));
  if (exchange_) {
    const comm::CommStats st = exchange_->comm().stats();
    r.exchange_s = static_cast<float>(st[comm::CommOp::all_reduce_sum].seconds + st[comm::CommOp::all_gather].seconds);
  }
  return r;
}

std::string CudaGenerator::describe(const RankMemory& m, const std::string& who) const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%sdevice cuda:%d (%s): weights %.1f MiB %s, KV pool %.1f MiB (peak in use %.1f MiB), scratch %.1f MiB, "
                "device memory in use %.1f MiB of %.1f MiB",
                who.c_str(), static_cast<int>(m.ordinal), device_name_.c_str(), m.weights,
                weights_->storage().c_str(), m.pool, m.pool_peak, m.scratch, m.in_use, m.total);
  std::string out = buf;
  if (exchange_) {
    std::snprintf(buf, sizeof buf, ", %.3f s in the exchange (%s)", m.exchange_s, exchange_->staged() ? "host-staged" : "nccl");
    out += buf;
  }
  return out;
}

Status CudaGenerator::gather_rank_memory() {
  if (!grouped()) return {};
  RankMemory mine = memory_now();
  constexpr int k_floats = sizeof(RankMemory) / sizeof(float);
  std::vector<RankMemory> all(static_cast<size_t>(control_->group_size()));
  SNAP_RETURN_IF_ERROR(control_->all_gather(&mine, all.data(), k_floats, DType::f32));
  if (leads()) ranks_ = std::move(all);
  return {};
}

Status CudaGenerator::tell_step(int32_t id, bool go) {
  if (!grouped()) return {};
  int32_t msg[2] = {id, go ? 1 : 0};
  return control_->broadcast_bytes(msg, sizeof msg, 0);
}

// The other ranks: each request rank 0 starts, run on this shard, until the shutdown header.
Status CudaGenerator::follow() {
  if (!grouped() || leads()) return {};
  // Rank 0 sends every step (generate: one request): bounded waits, --load-timeout for the
  // first header (rank 0 loads its tokenizer and reads the prompt), then --collective-timeout.
  control_->bound_broadcasts();
  for (;;) {
    std::vector<uint8_t> bytes;
    SNAP_RETURN_IF_ERROR(control_->broadcast_message(bytes, 0, "device request header"));
    SNAP_ASSIGN_OR_RETURN(DeviceRequestHeader h, decode_device_request(bytes));
    if (h.shutdown) return {};
    // A request's own error (pool too small, bad policy) happens alike on rank 0, which
    // reports it; this rank waits for the next request.
    ended_ = false;
    Status valid = validate(h.req);
    auto result = valid.ok() ? run_request(h.req, {}, h.prompt_logits) : Result<GenerateResult>(valid);
    if (!result.ok())
      std::fprintf(stderr, "snapserve: rank %d: %s\n", control_->world().rank(), result.status().message().c_str());
    // Rank 0 ends every request with one "no more tokens" message, whatever happened to it
    // there or here (an error before the decode loop leaves it unread).
    while (!ended_) {
      int32_t msg[2] = {0, 0};
      SNAP_RETURN_IF_ERROR(control_->broadcast_bytes(msg, sizeof msg, 0));
      ended_ = msg[1] == 0;
    }
    SNAP_RETURN_IF_ERROR(gather_rank_memory());
  }
}

Status CudaGenerator::validate(const GenerateRequest& req) const {
  SNAP_RETURN_IF_ERROR(validate_generate_request(config_, req));  // policies and layer-wise included
  if (req.kv_block_size != 16) return invalid_argument("the device KV pool has 16-token blocks");
  return {};
}

Result<GenerateResult> CudaGenerator::generate(const GenerateRequest& req, const GenerateHooks& hooks) {
  if (!leads()) return internal_error("generate on tp rank " + std::to_string(control_->group_rank()) + ": only rank 0 leads");
  SNAP_RETURN_IF_ERROR(validate(req));
  const bool prompt_logits = static_cast<bool>(hooks.on_prompt_logits);
  if (grouped()) {
    DeviceRequestHeader h;
    h.req = req;
    h.prompt_logits = prompt_logits;
    std::vector<uint8_t> bytes = encode_device_request(h);
    SNAP_RETURN_IF_ERROR(control_->broadcast_message(bytes, 0, "device request header"));
  }
  auto result = run_request(req, hooks, prompt_logits);
  Status ended = tell_step(0, false);  // the request is over, for the others (follow())
  if (exchange_) at_end_ = exchange_->comm().stats();  // before the memory report's gather
  if (ended.ok()) ended = gather_rank_memory();
  if (result.ok() && !ended.ok()) return ended;
  return result;
}

Result<GenerateResult> CudaGenerator::run_request(const GenerateRequest& req, const GenerateHooks& hooks,
                                                  bool prompt_logits) {
  const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
  const int64_t context = req.context_limit > 0 ? req.context_limit : config_.max_position;
  int64_t limit = n + req.max_tokens;
  if (context > 0) limit = std::min(limit, context);
  limit = std::max(limit, n);
  // Sized as generate.cpp sizes the CPU pool (the uncompressed sequence, unless asked), plus
  // one layer's compaction copy: the CPU compacts in place, the device pool copies a layer's
  // kept entries into fresh blocks before it frees the old ones (DeviceKvPool::compact).
  const int nkv = weights_->shard.num_kv_heads;  // this rank's KV heads (the model's at tp 1)
  const DeviceKvShape shape{config_.num_layers, nkv, config_.head_dim, req.kv_block_size};
  const int64_t bs = req.kv_block_size;
  const int64_t block_bytes = bs * (4LL * config_.head_dim + 4);
  const auto blocks_for = [bs](int64_t entries) { return (entries + bs - 1) / bs; };
  int64_t blocks = int64_t{config_.num_layers} * nkv * blocks_for(limit);
  if (req.kv_policy.kind != KvPolicyKind::full) {
    // As the serving engine reserves it: pyramidkv's layer budgets reach ~2x the average;
    // adakv may put a layer's slots in one head, each head with one partly filled block.
    const KvPolicy& p = req.kv_policy;
    const int64_t compress_at = p.context_tokens > 0 ? std::min<int64_t>(p.context_tokens, n) : n;
    int64_t largest = p.kind == KvPolicyKind::pyramidkv ? 2 * p.budget : p.budget;
    if (config_.sliding_window_pattern > 0)  // gemma3's local layers keep their window
      largest = std::max<int64_t>(largest, config_.sliding_window);
    const int64_t kept = std::min(compress_at, largest);
    blocks += p.kind == KvPolicyKind::adakv ? blocks_for(nkv * kept) + nkv : nkv * blocks_for(kept);
  }
  const int64_t bytes = req.kv_pool_bytes > 0 ? req.kv_pool_bytes : blocks * block_bytes;
  SNAP_ASSIGN_OR_RETURN(std::unique_ptr<DeviceKvPool> pool, DeviceKvPool::create(shape, bytes, stream_));
  pool_bytes_ = pool->num_blocks() * pool->block_bytes();
  GenerateResult result;
  result.finish_reason = "length";
  Status st;
  {
    DeviceForward fwd(config_, *weights_, *pool, exchange_.get());
    const int32_t seq = pool->add_sequence();
    st = run(fwd, *pool, seq, req, hooks, prompt_logits, limit, result);
    scratch_bytes_ = fwd.scratch_bytes();
    const Status released = pool->release(seq);
    if (st.ok()) st = released;
  }
  SNAP_RETURN_IF_ERROR(st);
  return result;
}

Status CudaGenerator::run(DeviceForward& fwd, DeviceKvPool& pool, int32_t seq, const GenerateRequest& req,
                          const GenerateHooks& hooks, bool prompt_logits, int64_t limit, GenerateResult& result) {
  const KvPolicy& policy = req.kv_policy;
  const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
  const int64_t vocab = config_.vocab_size;
  const int64_t compress_at = policy.context_tokens > 0 ? policy.context_tokens : n;
  // Layer-wise prefill when asked, or (auto_layerwise) when it peaks lower, by the CPU's rule
  // (prefill_choice.h) with the device pool's block bytes: a compressing policy over the whole prompt.
  bool layerwise = policy.layerwise && policy.kind != KvPolicyKind::full && compress_at == n;
  if (!layerwise && req.auto_layerwise && policy.kind != KvPolicyKind::full && compress_at == n && !prompt_logits) {
    PrefillPeakInputs in;
    in.prompt_tokens = n;
    in.num_layers = config_.num_layers;
    in.kv_heads = config_.num_kv_heads;  // the whole model's, so that every rank chooses alike
    in.block_size = pool.shape().block_size;
    in.block_bytes = pool.block_bytes();
    in.max_layer_budget = policy.budget;
    if (policy.kind == KvPolicyKind::pyramidkv) {
      SNAP_ASSIGN_OR_RETURN(auto budgets, pyramid_budgets(config_.num_layers, policy.budget, policy.window, policy.pyramid_beta));
      in.max_layer_budget = *std::max_element(budgets.begin(), budgets.end());
    }
    if (config_.sliding_window_pattern > 0)  // gemma3's local layers keep their window
      in.max_layer_budget = std::max<int64_t>(in.max_layer_budget, config_.sliding_window);
    in.prefill_chunk = req.prefill_chunk;
    in.hidden_size = config_.hidden_size;
    layerwise = layerwise_prefill_is_cheaper(in);
  }
  if (layerwise && prompt_logits)
    return invalid_argument("layer-wise prefill does not produce per-position logits");
  result.stats.layerwise = layerwise;
  const int window = layerwise ? 0 : fwd.prepare_compression(policy, compress_at);
  std::vector<float> logits(static_cast<size_t>(vocab)), rows;
  int64_t peak_blocks = 0;
  auto forward = [&](int64_t start, int64_t len) -> Status {
    const bool all = prompt_logits;
    if (all) rows.resize(static_cast<size_t>(len * vocab));
    SNAP_RETURN_IF_ERROR(fwd.forward(seq, req.prompt_ids.data() + start, len, all ? rows.data() : logits.data(), all, nullptr));
    peak_blocks = std::max(peak_blocks, pool.used_blocks());
    if (all && hooks.on_prompt_logits) {
      for (int64_t t = 0; t < len; ++t) hooks.on_prompt_logits(start + t, rows.data() + t * vocab);
      std::copy_n(rows.data() + (len - 1) * vocab, vocab, logits.data());
    }
    return {};
  };
  // Chunks of [begin, end); the last holds at least `tail` tokens (the observed window).
  auto prefill = [&](int64_t begin, int64_t end, int64_t tail) -> Status {
    const int64_t last = std::min(end - begin, std::max<int64_t>(tail, std::min(req.prefill_chunk, end - begin)));
    for (int64_t s = begin; s < end - last;) {
      const int64_t len = std::min(req.prefill_chunk, end - last - s);
      SNAP_RETURN_IF_ERROR(forward(s, len));
      s += len;
    }
    return forward(end - last, last);
  };

  double t0 = now_seconds();
  std::vector<std::vector<std::vector<int32_t>>> kept;
  if (layerwise) {  // the whole prompt, one layer at a time, each compressed before the next fills
    SNAP_RETURN_IF_ERROR(fwd.prefill_layerwise(seq, req.prompt_ids.data(), n, req.prefill_chunk, policy, logits.data(), &kept));
  } else {
    SNAP_RETURN_IF_ERROR(prefill(0, compress_at, window));
  }
  if (!layerwise && policy.kind != KvPolicyKind::full) {
    const double ts = now_seconds();
    SNAP_RETURN_IF_ERROR(fwd.compress(seq, policy, compress_at, &kept));
    result.stats.selection_seconds = now_seconds() - ts;
  }
  const bool compressed = !kept.empty();
  if (compress_at < n) SNAP_RETURN_IF_ERROR(prefill(compress_at, n, 0));
  result.stats.prefill_seconds = now_seconds() - t0;
  if (exchange_) after_prefill_ = exchange_->comm().stats();

  if (!req.kv_selection_dump.empty()) {
    // What each head holds now: the kept prefix positions (all of them if nothing was
    // compressed), then every position after the compression point.
    std::vector<std::vector<std::vector<int32_t>>> held(static_cast<size_t>(config_.num_layers));
    for (int l = 0; l < config_.num_layers; ++l) {
      held[l].resize(static_cast<size_t>(pool.shape().num_kv_heads));
      for (int g = 0; g < pool.shape().num_kv_heads; ++g) {
        std::vector<int32_t>& h = held[l][g];
        if (compressed && !kept[l].empty()) {
          h = kept[l][g];
        } else {
          for (int64_t j = 0; j < compress_at; ++j) h.push_back(static_cast<int32_t>(j));
        }
        for (int64_t j = compress_at; j < n; ++j) h.push_back(static_cast<int32_t>(j));
      }
    }
    SNAP_RETURN_IF_ERROR(write_selection(req.kv_selection_dump, weights_->shard, policy, n, compress_at, held));
  }

  t0 = now_seconds();
  if (!leads()) {  // the token ids come from rank 0, until it says the request is over
    for (;;) {
      int32_t msg[2] = {0, 0};
      SNAP_RETURN_IF_ERROR(control_->broadcast_bytes(msg, sizeof msg, 0));
      ended_ = msg[1] == 0;
      if (ended_) break;
      SNAP_RETURN_IF_ERROR(fwd.forward(seq, &msg[0], 1, nullptr, false, nullptr));
      peak_blocks = std::max(peak_blocks, pool.used_blocks());
    }
  } else {
    kernels::Rng rng(req.sampling.seed);
    // Greedy without a logits hook: the device's argmax (sample_cpu's rule), 4 bytes per token.
    const bool device_greedy = req.sampling.temperature <= 0.0f && !hooks.on_step_logits;
    int32_t next = kernels::sample_cpu(logits.data(), vocab, req.sampling, rng);
    for (int64_t step = 0; step < req.max_tokens; ++step) {
      if (hooks.on_step_logits) hooks.on_step_logits(logits.data());
      const int32_t id = step == 0 || device_greedy ? next : kernels::sample_cpu(logits.data(), vocab, req.sampling, rng);
      result.tokens.push_back(id);
      const bool is_stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), id) != req.stop_ids.end();
      const bool keep_going = hooks.on_token ? hooks.on_token(id) : true;
      if (is_stop || !keep_going) {
        result.finish_reason = "stop";
        break;
      }
      if (step + 1 == req.max_tokens) break;
      const int64_t pos = pool.appended(seq, 0);
      if (pos >= limit) break;  // context full: finish with "length"
      SNAP_RETURN_IF_ERROR(tell_step(id, true));
      SNAP_RETURN_IF_ERROR(fwd.forward(seq, &id, 1, device_greedy ? nullptr : logits.data(), false,
                                       device_greedy ? &next : nullptr));
      peak_blocks = std::max(peak_blocks, pool.used_blocks());
    }
  }
  result.stats.decode_seconds = now_seconds() - t0;
  result.stats.prompt_tokens = n;
  result.stats.generated_tokens = static_cast<int64_t>(result.tokens.size());
  result.stats.kv_resident_bytes = pool.resident_bytes(seq);
  int64_t stored = 0;
  for (int l = 0; l < config_.num_layers; ++l)
    for (int g = 0; g < pool.shape().num_kv_heads; ++g) stored += pool.length(seq, l, g);
  result.stats.kv_stored_bytes = stored * 4LL * config_.head_dim;  // bf16 K + V per entry
  result.stats.kv_full_equivalent_bytes = pool.full_equivalent_bytes(seq);
  result.stats.kv_pool_peak_bytes = std::max(peak_blocks, pool.peak_used_blocks()) * pool.block_bytes();
  result.stats.kv_dtype = DType::bf16;
  result.stats.scratch_peak_bytes = fwd.scratch_bytes() + (layerwise ? fwd.layerwise_state_bytes() : 0);
  pool_peak_bytes_ = result.stats.kv_pool_peak_bytes;
  return {};
}

}  // namespace

Result<std::unique_ptr<DeviceGenerator>> open_device_generator(const DeviceSpec& spec, const LoadedModel& model,
                                                               comm::Communicator* control, comm::Communicator* exchange,
                                                               DType exchange_dtype) {
  if (spec.kind != DeviceKind::cuda) return invalid_argument("open_device_generator: " + spec.name() + " is not a device");
  if (exchange_dtype != DType::f32 && exchange_dtype != DType::bf16)
    return invalid_argument("--tp-exchange-dtype: f32 or bf16, not " + std::string(dtype_name(exchange_dtype)));
  SNAP_RETURN_IF_ERROR(device_supports(model.config, spec.name()));
  const int tp = model.shard.tp_size;
  const auto group_of = [](const comm::Communicator* c) { return c != nullptr ? c->group_size() : 1; };
  if (group_of(control) != tp || group_of(exchange) != tp) {
    return invalid_argument("--device " + spec.name() + ": a shard of tp " + std::to_string(tp) +
                            " needs control and exchange groups of that size");
  }
  SNAP_RETURN_IF_ERROR(check_device(spec));
  SNAP_ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> weights, DeviceWeights::upload(model));
  cudaStream_t stream = nullptr;
  const cudaError_t e = cudaStreamCreate(&stream);
  if (e != cudaSuccess) return unavailable("--device " + spec.name() + ": cudaStreamCreate: " + cudaGetErrorString(e));
  return std::unique_ptr<DeviceGenerator>(
      new CudaGenerator(spec, model, std::move(weights), stream, control, exchange, exchange_dtype));
}

}  // namespace snap
