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
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/sys.h"
#include "coordinator/engine/device_spec.h"
#include "coordinator/engine/prefill_choice.h"
#include "kernels/kernels.h"
#include "worker/device/device_forward.h"
#include "worker/device/device_kv_pool.h"
#include "worker/device/device_weights.h"
#include "worker/kv/selection.h"

namespace snap {

bool build_has_cuda() { return true; }

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

namespace {

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// The kept positions per layer and KV head, in the CPU's dump format (Worker::write_selection).
Status write_selection(const std::string& path, const KvPolicy& p, int64_t prompt_tokens, int64_t compress_at,
                       const std::vector<std::vector<std::vector<int32_t>>>& kept) {
  nlohmann::json doc;
  doc["policy"] = kv_policy_name(p.kind);
  doc["prompt_tokens"] = prompt_tokens;
  doc["compressed_tokens"] = compress_at;
  doc["budget"] = p.budget;
  doc["window"] = p.window;
  doc["kernel"] = p.kernel;
  doc["pooling"] = p.pooling == KvPooling::max ? "max" : "avg";
  doc["gqa"] = p.aggregation == GqaAggregation::mean ? "mean" : "max";
  doc["tp_rank"] = 0;
  doc["tp_size"] = 1;
  doc["kv_head_begin"] = 0;
  doc["kv_replicas"] = 1;
  doc["device"] = "cuda";
  doc["layers"] = nlohmann::json::array();
  for (size_t l = 0; l < kept.size(); ++l) doc["layers"].push_back({{"layer", l}, {"heads", kept[l]}});
  std::ofstream f(path);
  f << doc.dump() << "\n";
  if (!f) return invalid_argument(path + ": cannot write the KV selection dump");
  return {};
}

class CudaGenerator final : public DeviceGenerator {
 public:
  CudaGenerator(const DeviceSpec& spec, const LoadedModel& model, std::unique_ptr<DeviceWeights> weights,
                cudaStream_t stream)
      : spec_(spec), config_(model.config), weights_(std::move(weights)), stream_(stream) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, spec.ordinal) == cudaSuccess) device_name_ = prop.name;
  }
  ~CudaGenerator() override {
    weights_.reset();
    cudaStreamDestroy(stream_);
  }

  Result<GenerateResult> generate(const GenerateRequest& req, const GenerateHooks& hooks) override;
  std::string describe_memory() const override {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return "device " + spec_.name() + " (" + device_name_ + "): weights " + mib(weights_->bytes) + " bf16, KV pool " +
           mib(pool_bytes_) + " (peak in use " + mib(pool_peak_bytes_) + "), scratch " + mib(scratch_bytes_) +
           ", device memory in use " + mib(static_cast<int64_t>(total_b - free_b)) + " of " +
           mib(static_cast<int64_t>(total_b));
  }

 private:
  Status validate(const GenerateRequest& req) const;
  Status run(DeviceForward& fwd, DeviceKvPool& pool, int32_t seq, const GenerateRequest& req,
             const GenerateHooks& hooks, int64_t limit, GenerateResult& result);

  DeviceSpec spec_;
  const ModelConfig& config_;
  std::unique_ptr<DeviceWeights> weights_;
  cudaStream_t stream_;
  std::string device_name_ = "?";
  int64_t pool_bytes_ = 0, pool_peak_bytes_ = 0, scratch_bytes_ = 0;  // of the last request
};

Status CudaGenerator::validate(const GenerateRequest& req) const {
  SNAP_RETURN_IF_ERROR(validate_generate_request(config_, req));  // policies and layer-wise included
  if (req.kv_block_size != 16) return invalid_argument("the device KV pool has 16-token blocks");
  return {};
}

Result<GenerateResult> CudaGenerator::generate(const GenerateRequest& req, const GenerateHooks& hooks) {
  SNAP_RETURN_IF_ERROR(validate(req));
  const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
  const int64_t context = req.context_limit > 0 ? req.context_limit : config_.max_position;
  int64_t limit = n + req.max_tokens;
  if (context > 0) limit = std::min(limit, context);
  limit = std::max(limit, n);
  // Sized as generate.cpp sizes the CPU pool: the uncompressed sequence, unless asked.
  const DeviceKvShape shape{config_.num_layers, config_.num_kv_heads, config_.head_dim, req.kv_block_size};
  const int64_t block_bytes = int64_t{req.kv_block_size} * (4LL * config_.head_dim + 4);
  const int64_t blocks_per_head = (limit + req.kv_block_size - 1) / req.kv_block_size;
  const int64_t bytes = req.kv_pool_bytes > 0 ? req.kv_pool_bytes
                                              : int64_t{config_.num_layers} * config_.num_kv_heads * blocks_per_head * block_bytes;
  SNAP_ASSIGN_OR_RETURN(std::unique_ptr<DeviceKvPool> pool, DeviceKvPool::create(shape, bytes, stream_));
  pool_bytes_ = pool->num_blocks() * pool->block_bytes();
  GenerateResult result;
  result.finish_reason = "length";
  Status st;
  {
    DeviceForward fwd(config_, *weights_, *pool);
    const int32_t seq = pool->add_sequence();
    st = run(fwd, *pool, seq, req, hooks, limit, result);
    scratch_bytes_ = fwd.scratch_bytes();
    const Status released = pool->release(seq);
    if (st.ok()) st = released;
  }
  SNAP_RETURN_IF_ERROR(st);
  return result;
}

Status CudaGenerator::run(DeviceForward& fwd, DeviceKvPool& pool, int32_t seq, const GenerateRequest& req,
                          const GenerateHooks& hooks, int64_t limit, GenerateResult& result) {
  const KvPolicy& policy = req.kv_policy;
  const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
  const int64_t vocab = config_.vocab_size;
  const int64_t compress_at = policy.context_tokens > 0 ? policy.context_tokens : n;
  // Layer-wise prefill when asked, or (auto_layerwise) when it peaks lower, by the CPU's rule
  // (prefill_choice.h) with the device pool's block bytes: a compressing policy over the whole prompt.
  bool layerwise = policy.layerwise && policy.kind != KvPolicyKind::full && compress_at == n;
  if (!layerwise && req.auto_layerwise && policy.kind != KvPolicyKind::full && compress_at == n &&
      !hooks.on_prompt_logits) {
    PrefillPeakInputs in;
    in.prompt_tokens = n;
    in.num_layers = config_.num_layers;
    in.kv_heads = config_.num_kv_heads;
    in.block_size = pool.shape().block_size;
    in.block_bytes = pool.block_bytes();
    in.max_layer_budget = policy.budget;
    if (policy.kind == KvPolicyKind::pyramidkv) {
      SNAP_ASSIGN_OR_RETURN(auto budgets, pyramid_budgets(config_.num_layers, policy.budget, policy.window, policy.pyramid_beta));
      in.max_layer_budget = *std::max_element(budgets.begin(), budgets.end());
    }
    in.prefill_chunk = req.prefill_chunk;
    in.hidden_size = config_.hidden_size;
    layerwise = layerwise_prefill_is_cheaper(in);
  }
  if (layerwise && hooks.on_prompt_logits)
    return invalid_argument("layer-wise prefill does not produce per-position logits");
  result.stats.layerwise = layerwise;
  const int window = layerwise ? 0 : fwd.prepare_compression(policy, compress_at);
  std::vector<float> logits(static_cast<size_t>(vocab)), rows;
  int64_t peak_blocks = 0;
  auto forward = [&](int64_t start, int64_t len) -> Status {
    const bool all = static_cast<bool>(hooks.on_prompt_logits);
    if (all) rows.resize(static_cast<size_t>(len * vocab));
    SNAP_RETURN_IF_ERROR(fwd.forward(seq, req.prompt_ids.data() + start, len, all ? rows.data() : logits.data(), all, nullptr));
    peak_blocks = std::max(peak_blocks, pool.used_blocks());
    if (all) {
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

  if (!req.kv_selection_dump.empty()) {
    // What each head holds now: the kept prefix positions (all of them if nothing was
    // compressed), then every position after the compression point.
    std::vector<std::vector<std::vector<int32_t>>> held(static_cast<size_t>(config_.num_layers));
    for (int l = 0; l < config_.num_layers; ++l) {
      held[l].resize(static_cast<size_t>(config_.num_kv_heads));
      for (int g = 0; g < config_.num_kv_heads; ++g) {
        std::vector<int32_t>& h = held[l][g];
        if (compressed && !kept[l].empty()) {
          h = kept[l][g];
        } else {
          for (int64_t j = 0; j < compress_at; ++j) h.push_back(static_cast<int32_t>(j));
        }
        for (int64_t j = compress_at; j < n; ++j) h.push_back(static_cast<int32_t>(j));
      }
    }
    SNAP_RETURN_IF_ERROR(write_selection(req.kv_selection_dump, policy, n, compress_at, held));
  }

  t0 = now_seconds();
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
    SNAP_RETURN_IF_ERROR(fwd.forward(seq, &id, 1, device_greedy ? nullptr : logits.data(), false,
                                     device_greedy ? &next : nullptr));
    peak_blocks = std::max(peak_blocks, pool.used_blocks());
  }
  result.stats.decode_seconds = now_seconds() - t0;
  result.stats.prompt_tokens = n;
  result.stats.generated_tokens = static_cast<int64_t>(result.tokens.size());
  result.stats.kv_resident_bytes = pool.resident_bytes(seq);
  int64_t stored = 0;
  for (int l = 0; l < config_.num_layers; ++l)
    for (int g = 0; g < config_.num_kv_heads; ++g) stored += pool.length(seq, l, g);
  result.stats.kv_stored_bytes = stored * 4LL * config_.head_dim;  // bf16 K + V per entry
  result.stats.kv_full_equivalent_bytes = pool.full_equivalent_bytes(seq);
  result.stats.kv_pool_peak_bytes = std::max(peak_blocks, pool.peak_used_blocks()) * pool.block_bytes();
  result.stats.kv_dtype = DType::bf16;
  result.stats.scratch_peak_bytes = fwd.scratch_bytes() + (layerwise ? fwd.layerwise_state_bytes() : 0);
  pool_peak_bytes_ = result.stats.kv_pool_peak_bytes;
  return {};
}

}  // namespace

Result<std::unique_ptr<DeviceGenerator>> open_device_generator(const DeviceSpec& spec, const LoadedModel& model) {
  if (spec.kind != DeviceKind::cuda) return invalid_argument("open_device_generator: " + spec.name() + " is not a device");
  // DeviceForward is the Llama-family forward (one window for every layer, no QK-norm, post-norms
  // or GeGLU): a gemma3 model would run wrong, so it is refused.
  if (model.config.arch == Arch::gemma3) {
    return unimplemented("--device " + spec.name() + ": the gemma3 architecture is not on the device yet (use --device cpu)");
  }
  SNAP_RETURN_IF_ERROR(check_device(spec));
  SNAP_ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> weights, DeviceWeights::upload(model));
  cudaStream_t stream = nullptr;
  const cudaError_t e = cudaStreamCreate(&stream);
  if (e != cudaSuccess) return unavailable("--device " + spec.name() + ": cudaStreamCreate: " + cudaGetErrorString(e));
  return std::unique_ptr<DeviceGenerator>(new CudaGenerator(spec, model, std::move(weights), stream));
}

}  // namespace snap
