// DeviceForward's KV compression after the prompt (device_forward.h): the window capture and
// the SnapKV/PyramidKV selection, AdaKV, and H2O's accumulation during prefill and selection.
// Every policy selects on the device (kernels/cuda: snapkv.cu, adakv.cu, h2o.cu), copies the
// kept ids to the host and compacts the device pool, freeing the dropped blocks.
#include <algorithm>
#include <string>

#include "kernels/cuda/kernels_cuda.h"
#include "worker/device/device_forward.h"
#include "worker/kv/selection.h"

namespace snap {

namespace {
Status cuda_status(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return Status::ok_status();
  return internal_error(std::string("device forward: ") + what + ": " + cudaGetErrorString(e));
}

// Device buffers of one selection, freed (after the stream drains) on scope exit.
struct Scratch {
  cudaStream_t stream;
  std::vector<void*> ptrs;
  explicit Scratch(cudaStream_t s) : stream(s) {}
  ~Scratch() {
    cudaStreamSynchronize(stream);
    for (void* p : ptrs) cudaFree(p);
  }
  template <typename T>
  Status alloc(T** p, size_t bytes) {
    void* v = nullptr;
    const cudaError_t e = cudaMalloc(&v, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) return cuda_status("selection buffers", e);
    ptrs.push_back(v);
    *p = static_cast<T*>(v);
    return Status::ok_status();
  }
};

void keep_all(int num_kv_heads, int64_t n, std::vector<std::vector<int32_t>>& out) {
  out.assign(static_cast<size_t>(num_kv_heads), std::vector<int32_t>(static_cast<size_t>(n)));
  for (auto& h : out)
    for (int64_t j = 0; j < n; ++j) h[j] = static_cast<int32_t>(j);
}
}  // namespace

// --- SnapKV / PyramidKV -------------------------------------------------------------------------
void DeviceForward::observe_window(int window) {
  cudaStreamSynchronize(stream_);
  for (float* p : win_q_) cudaFree(p);
  win_q_.assign(static_cast<size_t>(config_.num_layers), nullptr);
  window_ = window > 0 ? window : 0;
  window_rows_ = 0;
  if (window_ == 0) return;
  const size_t bytes = sizeof(float) * window_ * score_attn_.num_heads * config_.head_dim;
  for (float*& p : win_q_)
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;  // compress_snapkv reports it
}

const float* DeviceForward::window_queries(int layer) const {
  return layer >= 0 && layer < static_cast<int>(win_q_.size()) ? win_q_[layer] : nullptr;
}

Status DeviceForward::compress_snapkv(int32_t seq, const kernels::SnapKvCudaParams& sp_all,
                                      std::vector<std::vector<std::vector<int32_t>>>* kept,
                                      const std::vector<int64_t>& layer_budgets, int layer) {
  const int nkv = config_.num_kv_heads;
  auto wanted = [&](int l) { return layer < 0 || l == layer; };
  if (kept) kept->assign(static_cast<size_t>(config_.num_layers), {});
  if (!layer_budgets.empty() && static_cast<int>(layer_budgets.size()) != config_.num_layers)
    return invalid_argument("device forward: " + std::to_string(layer_budgets.size()) + " layer budgets for " +
                            std::to_string(config_.num_layers) + " layers");
  const int64_t n = pool_.appended(seq, 0);
  auto budget_of = [&](int l) { return layer_budgets.empty() ? sp_all.budget : layer_budgets[l]; };
  int64_t max_budget = 0;
  bool drops = false;  // pyramidkv: layer 0 may keep everything while deeper layers drop
  for (int l = 0; l < config_.num_layers; ++l) {
    max_budget = std::max(max_budget, std::min(budget_of(l), n));
    drops = drops || (wanted(l) && budget_of(l) < n);
  }
  if (!drops) return Status::ok_status();  // nothing to drop in any (wanted) layer
  const kernels::SnapKvCudaParams& sp = sp_all;
  if (window_ != sp.window || window_rows_ < sp.window)
    return invalid_argument("device forward: snapkv window " + std::to_string(sp.window) + " was not observed (observe_window(" +
                            std::to_string(window_) + "), last chunk " + std::to_string(window_rows_) + " rows)");
  const int64_t prefix = n - sp.window;
  size_t ws_bytes = 0;
  for (int l = 0; l < config_.num_layers; ++l) {
    if (budget_of(l) >= n || !wanted(l)) continue;
    kernels::SnapKvCudaParams spl = sp;
    spl.budget = budget_of(l);
    const size_t b = kernels::snapkv_select_cuda_workspace_bytes(n, score_attn_, spl);
    if (b == 0)
      return invalid_argument("device forward: snapkv budget " + std::to_string(spl.budget) + ", window " +
                              std::to_string(sp.window) + ", kernel " + std::to_string(sp.kernel) + " refused");
    ws_bytes = std::max(ws_bytes, b);
  }
  void *ws = nullptr, *scores = nullptr, *kept_dev = nullptr;
  cudaError_t e = cudaMalloc(&ws, std::max<size_t>(ws_bytes, 1));
  if (e == cudaSuccess) e = cudaMalloc(&scores, sizeof(float) * prefix * nkv);
  if (e == cudaSuccess) e = cudaMalloc(&kept_dev, sizeof(int32_t) * max_budget * nkv);
  Status st = cuda_status("snapkv buffers", e);
  std::vector<int32_t> host(static_cast<size_t>(max_budget * nkv));
  for (int l = 0; st.ok() && l < config_.num_layers; ++l) {
    if (!wanted(l)) continue;
    if (budget_of(l) >= n) {  // this layer keeps everything
      if (kept) {
        (*kept)[l].assign(static_cast<size_t>(nkv), std::vector<int32_t>(static_cast<size_t>(n)));
        for (auto& h : (*kept)[l])
          for (int64_t j = 0; j < n; ++j) h[j] = static_cast<int32_t>(j);
      }
      continue;
    }
    kernels::SnapKvCudaParams spl = sp;
    spl.budget = budget_of(l);
    if (win_q_[l] == nullptr) {
      st = resource_exhausted("device forward: no window-query buffer for layer " + std::to_string(l));
      break;
    }
    auto view = pool_.view(seq, l);
    if (!view.ok()) {
      st = view.status();
      break;
    }
    st = cuda_status("snapkv_select_cuda",
                     kernels::snapkv_select_cuda(win_q_[l], *view, n, score_attn_, spl, static_cast<float*>(scores),
                                                 static_cast<int32_t*>(kept_dev), ws, ws_bytes, stream_));
    const int64_t b = spl.budget;
    if (st.ok())
      st = cuda_status("kept positions", cudaMemcpyAsync(host.data(), kept_dev, sizeof(int32_t) * b * nkv,
                                                         cudaMemcpyDeviceToHost, stream_));
    if (st.ok()) st = cuda_status("snapkv", cudaStreamSynchronize(stream_));
    if (!st.ok()) break;
    std::vector<std::vector<int32_t>> lists(static_cast<size_t>(nkv));
    for (int g = 0; g < nkv; ++g) lists[g].assign(host.begin() + g * b, host.begin() + (g + 1) * b);
    st = pool_.compact(seq, l, lists);  // a fresh prefill: position j is logical entry j
    if (kept && st.ok()) (*kept)[l] = std::move(lists);
  }
  cudaStreamSynchronize(stream_);
  cudaFree(ws);
  cudaFree(scores);
  cudaFree(kept_dev);
  return st;
}

Status DeviceForward::compact_ids(int32_t seq, int layer, const std::vector<int32_t>& ids, int64_t stride,
                                  int64_t tail, int64_t n, std::vector<std::vector<int32_t>>* kept) {
  const int nkv = config_.num_kv_heads;
  std::vector<std::vector<int32_t>> lists(static_cast<size_t>(nkv));
  for (int32_t id : ids) {  // ascending: head by head, positions ascending
    const int64_t g = id / stride, j = id % stride;
    if (id < 0 || g >= nkv || j >= tail)
      return internal_error("device forward: selection id " + std::to_string(id) + " out of range");
    lists[g].push_back(static_cast<int32_t>(j));
  }
  for (auto& h : lists)
    for (int64_t j = tail; j < n; ++j) h.push_back(static_cast<int32_t>(j));
  SNAP_RETURN_IF_ERROR(pool_.compact(seq, layer, lists));
  if (kept) *kept = std::move(lists);
  return Status::ok_status();
}

// --- AdaKV --------------------------------------------------------------------------------------
Status DeviceForward::compress_adakv(int32_t seq, const kernels::SnapKvCudaParams& sp, double alpha,
                                     std::vector<std::vector<std::vector<int32_t>>>* kept, int layer) {
  const int nkv = config_.num_kv_heads;
  if (kept) kept->assign(static_cast<size_t>(config_.num_layers), {});
  const int64_t n = pool_.appended(seq, 0);
  if (n <= sp.budget) {  // nothing to drop (the CPU keeps every position too)
    if (kept)
      for (auto& l : *kept) keep_all(nkv, n, l);
    return Status::ok_status();
  }
  if (window_ != sp.window || window_rows_ < sp.window)
    return invalid_argument("device forward: adakv window " + std::to_string(sp.window) + " was not observed");
  const size_t ws_bytes = kernels::adakv_select_cuda_workspace_bytes(n, score_attn_, sp);
  if (ws_bytes == 0 || !(alpha >= 0.0 && alpha <= 1.0))
    return invalid_argument("device forward: adakv budget " + std::to_string(sp.budget) + ", window " +
                            std::to_string(sp.window) + ", kernel " + std::to_string(sp.kernel) + ", alpha " +
                            std::to_string(alpha) + " refused");
  const int64_t prefix = n - sp.window, count = nkv * (sp.budget - sp.window);
  Scratch s(stream_);
  void* ws = nullptr;
  float* scores = nullptr;
  int32_t* ids_dev = nullptr;
  SNAP_RETURN_IF_ERROR(s.alloc(&ws, ws_bytes));
  SNAP_RETURN_IF_ERROR(s.alloc(&scores, sizeof(float) * prefix * nkv));
  SNAP_RETURN_IF_ERROR(s.alloc(&ids_dev, sizeof(int32_t) * count));
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int l = 0; l < config_.num_layers; ++l) {
    if (layer >= 0 && l != layer) continue;
    if (win_q_[l] == nullptr)
      return resource_exhausted("device forward: no window-query buffer for layer " + std::to_string(l));
    SNAP_ASSIGN_OR_RETURN(kernels::PagedKvCuda view, pool_.view(seq, l));
    SNAP_RETURN_IF_ERROR(cuda_status("adakv_select_cuda", kernels::adakv_select_cuda(win_q_[l], view, n, score_attn_, sp, alpha,
                                                                                     scores, ids_dev, ws, ws_bytes,
                                                                                     stream_)));
    SNAP_RETURN_IF_ERROR(cuda_status("kept ids", cudaMemcpyAsync(ids.data(), ids_dev, sizeof(int32_t) * count,
                                                                 cudaMemcpyDeviceToHost, stream_)));
    SNAP_RETURN_IF_ERROR(cuda_status("adakv", cudaStreamSynchronize(stream_)));
    SNAP_RETURN_IF_ERROR(compact_ids(seq, l, ids, prefix, prefix, n, kept ? &(*kept)[l] : nullptr));
  }
  return Status::ok_status();
}

// --- H2O ----------------------------------------------------------------------------------------
void DeviceForward::observe_h2o(int64_t num_tokens) {
  cudaStreamSynchronize(stream_);
  for (float* p : h2o_acc_) cudaFree(p);
  h2o_acc_.clear();
  h2o_seen_.clear();
  cudaFree(h2o_ws_);
  h2o_ws_ = nullptr;
  h2o_ws_bytes_ = 0;
  h2o_tokens_ = num_tokens > 0 ? num_tokens : 0;
  if (h2o_tokens_ == 0) return;
  h2o_acc_.assign(static_cast<size_t>(config_.num_layers), nullptr);  // allocated by each layer's first chunk
  h2o_seen_.assign(static_cast<size_t>(config_.num_layers), 0);
}

Status DeviceForward::accumulate_h2o(int32_t seq, int layer, int64_t start, int64_t m) {
  if (h2o_acc_[layer] == nullptr && start == 0) {  // [score heads, h2o_tokens_], zeroed
    const size_t bytes = sizeof(float) * score_attn_.num_heads * h2o_tokens_;
    SNAP_RETURN_IF_ERROR(cuda_status("H2O score buffer", cudaMalloc(&h2o_acc_[layer], bytes)));
    SNAP_RETURN_IF_ERROR(cuda_status("H2O score buffer", cudaMemsetAsync(h2o_acc_[layer], 0, bytes, stream_)));
  }
  if (h2o_acc_[layer] == nullptr || start != h2o_seen_[layer])
    return invalid_argument("device forward: h2o chunk starts at position " + std::to_string(start) + ", expected " +
                            std::to_string(h2o_seen_[layer]));
  const size_t ws = kernels::h2o_accumulate_cuda_workspace_bytes(m, score_attn_);
  if (ws > h2o_ws_bytes_) {
    cudaStreamSynchronize(stream_);
    cudaFree(h2o_ws_);
    h2o_ws_ = nullptr;
    h2o_ws_bytes_ = 0;
    SNAP_RETURN_IF_ERROR(cuda_status("h2o workspace", cudaMalloc(&h2o_ws_, ws)));
    h2o_ws_bytes_ = ws;
  }
  SNAP_ASSIGN_OR_RETURN(kernels::PagedKvCuda view, pool_.view(seq, layer));
  SNAP_RETURN_IF_ERROR(cuda_status("h2o_accumulate_cuda",
                                   kernels::h2o_accumulate_cuda(score_queries(), m, start, view, score_attn_, h2o_acc_[layer], h2o_tokens_,
                                                                h2o_ws_, h2o_ws_bytes_, stream_)));
  h2o_seen_[layer] = start + m;
  return Status::ok_status();
}

Status DeviceForward::compress_h2o(int32_t seq, int64_t budget, int64_t recent, bool max_aggregation,
                                   std::vector<std::vector<std::vector<int32_t>>>* kept, int layer) {
  const int nkv = config_.num_kv_heads;
  if (kept) kept->assign(static_cast<size_t>(config_.num_layers), {});
  const int64_t n = pool_.appended(seq, 0);
  if (budget < 1 || recent < 0 || recent > budget)
    return invalid_argument("device forward: h2o budget " + std::to_string(budget) + ", recent " + std::to_string(recent) +
                            " refused");
  Status st;
  if (n <= budget) {
    if (kept)
      for (auto& l : *kept) keep_all(nkv, n, l);
  } else if (h2o_tokens_ != n) {
    st = invalid_argument("device forward: h2o scores cover " + std::to_string(h2o_tokens_) + " positions, the sequence holds " +
                          std::to_string(n));
  } else {
    const size_t ws_bytes = kernels::h2o_select_cuda_workspace_bytes(n, score_attn_, budget, recent);
    const int64_t count = nkv * (budget - recent);
    Scratch s(stream_);
    void* ws = nullptr;
    float* scores = nullptr;
    int32_t* ids_dev = nullptr;
    st = ws_bytes == 0 ? invalid_argument("device forward: h2o selection refused") : Status::ok_status();
    if (st.ok()) st = s.alloc(&ws, ws_bytes);
    if (st.ok()) st = s.alloc(&scores, sizeof(float) * n * nkv);
    if (st.ok()) st = s.alloc(&ids_dev, sizeof(int32_t) * std::max<int64_t>(count, 1));
    std::vector<int32_t> ids(static_cast<size_t>(count));
    for (int l = 0; st.ok() && l < config_.num_layers; ++l) {
      if (layer >= 0 && l != layer) continue;
      if (h2o_seen_[l] != n) {
        st = internal_error("device forward: layer " + std::to_string(l) + " accumulated " +
                            std::to_string(h2o_seen_[l]) + " of " + std::to_string(n) + " positions");
        break;
      }
      st = cuda_status("h2o_select_cuda", kernels::h2o_select_cuda(h2o_acc_[l], h2o_tokens_, n, score_attn_, budget, recent,
                                                                   max_aggregation, scores, ids_dev, ws, ws_bytes,
                                                                   stream_));
      if (st.ok() && count > 0)
        st = cuda_status("kept ids", cudaMemcpyAsync(ids.data(), ids_dev, sizeof(int32_t) * count,
                                                     cudaMemcpyDeviceToHost, stream_));
      if (st.ok()) st = cuda_status("h2o", cudaStreamSynchronize(stream_));
      if (st.ok()) st = compact_ids(seq, l, ids, n, n - recent, n, kept ? &(*kept)[l] : nullptr);
    }
  }
  if (layer < 0 || layer == config_.num_layers - 1 || !st.ok()) {
    observe_h2o(0);  // the scores are spent: free them, and later chunks do not accumulate
  } else {           // layer-wise: this layer's scores are spent
    cudaStreamSynchronize(stream_);
    cudaFree(h2o_acc_[layer]);
    h2o_acc_[layer] = nullptr;
  }
  return st;
}

// --- one request's policy -----------------------------------------------------------------------
int DeviceForward::prepare_compression(const KvPolicy& policy, int64_t compress_at) {
  const bool by_window = policy.kind == KvPolicyKind::snapkv || policy.kind == KvPolicyKind::pyramidkv ||
                         policy.kind == KvPolicyKind::adakv;
  const int window = by_window ? policy.window : 0;
  observe_window(window);
  observe_h2o(policy.kind == KvPolicyKind::h2o ? compress_at : 0);
  return window;
}

Status DeviceForward::compress(int32_t seq, const KvPolicy& policy, int64_t compress_at,
                               std::vector<std::vector<std::vector<int32_t>>>* kept, int layer) {
  std::vector<std::vector<std::vector<int32_t>>> unused;  // kept may be null (a follower rank)
  if (kept == nullptr) kept = &unused;
  kept->clear();
  if (policy.kind == KvPolicyKind::full) return Status::ok_status();
  bool any_windowed = false;
  for (int l = 0; l < config_.num_layers; ++l) any_windowed = any_windowed || windowed(l);
  if (!any_windowed) return compress_policy(seq, policy, compress_at, kept, layer);
  // gemma3: a local layer keeps its last `window` positions, all that a later query sees there
  // (exact, whatever the policy); the policy selects on the global layers, one at a time.
  const int nkv = config_.num_kv_heads;
  const int64_t n = pool_.appended(seq, 0);
  kept->assign(static_cast<size_t>(config_.num_layers), {});
  Status st;
  for (int l = 0; st.ok() && l < config_.num_layers; ++l) {
    if (layer >= 0 && l != layer) continue;
    if (!windowed(l)) {
      std::vector<std::vector<std::vector<int32_t>>> one;
      st = compress_policy(seq, policy, compress_at, &one, l);
      if (st.ok() && l < static_cast<int>(one.size())) (*kept)[l] = std::move(one[l]);
      continue;
    }
    const int64_t first = std::max<int64_t>(0, n - config_.layer_window(l));
    std::vector<std::vector<int32_t>> lists(static_cast<size_t>(nkv));
    for (auto& h : lists)
      for (int64_t j = first; j < n; ++j) h.push_back(static_cast<int32_t>(j));
    if (first > 0) st = pool_.compact(seq, l, lists);
    if (st.ok()) (*kept)[l] = std::move(lists);
  }
  if (policy.kind == KvPolicyKind::h2o && (layer < 0 || layer == config_.num_layers - 1 || !st.ok()))
    observe_h2o(0);  // the scores are spent (a windowed last layer never frees them itself)
  return st;
}

Status DeviceForward::compress_policy(int32_t seq, const KvPolicy& policy, int64_t compress_at,
                                      std::vector<std::vector<std::vector<int32_t>>>* kept, int layer) {
  switch (policy.kind) {
    case KvPolicyKind::full:
      return Status::ok_status();
    case KvPolicyKind::snapkv:
    case KvPolicyKind::pyramidkv:
    case KvPolicyKind::adakv: {
      kernels::SnapKvCudaParams sp;
      sp.budget = policy.budget;
      sp.window = policy.window;
      sp.kernel = policy.kernel;
      sp.max_pooling = policy.pooling == KvPooling::max;
      sp.max_aggregation = policy.aggregation == GqaAggregation::max;
      if (policy.kind == KvPolicyKind::adakv) return compress_adakv(seq, sp, policy.adakv_alpha, kept, layer);
      std::vector<int64_t> budgets;
      if (policy.kind == KvPolicyKind::pyramidkv) {
        SNAP_ASSIGN_OR_RETURN(budgets,
                              pyramid_budgets(config_.num_layers, policy.budget, policy.window, policy.pyramid_beta));
      }
      return compress_snapkv(seq, sp, kept, budgets, layer);
    }
    case KvPolicyKind::h2o:  // H2oParams' default: half heavy hitters, half recent
      return compress_h2o(seq, policy.budget, policy.budget / 2, policy.aggregation == GqaAggregation::max, kept,
                          layer);
    case KvPolicyKind::streaming: {  // sinks + recent, the same for every head
      if (compress_at <= policy.budget) return Status::ok_status();
      StreamingParams sp;
      sp.budget = policy.budget;
      sp.num_sink = policy.num_sink;
      SNAP_ASSIGN_OR_RETURN(LayerSelection sel, streaming_select(compress_at, config_.num_kv_heads, sp));
      for (int l = 0; l < config_.num_layers; ++l)
        if (layer < 0 || l == layer) SNAP_RETURN_IF_ERROR(pool_.compact(seq, l, sel.kept));
      kept->assign(static_cast<size_t>(config_.num_layers), sel.kept);
      return Status::ok_status();
    }
  }
  return invalid_argument("device forward: unknown kv policy");
}

}  // namespace snap
