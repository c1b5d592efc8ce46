// KvCompressor: window capture, H2O accumulation and per-layer selection + compaction.
#include "worker/kv/compressor.h"

#include <algorithm>
#include <cstring>

#include "common/sys.h"

namespace snap {

KvCompressor::KvCompressor(const KvPolicy& policy, CompressorShape shape, int64_t compress_at)
    : policy_(policy),
      shape_(shape),
      compress_at_(compress_at),
      layer_budgets_(shape.num_layers, policy.budget),
      window_q_(shape.num_layers),
      h2o_(shape.num_layers),
      kept_(shape.num_layers),
      done_(shape.num_layers, false) {
  CHECK(policy.validate().ok()) << policy.validate().to_string();
  if (policy.kind == KvPolicyKind::pyramidkv) {
    auto b = pyramid_budgets(shape.num_layers, policy.budget, policy.window, policy.pyramid_beta);
    CHECK(b.ok()) << b.status().to_string();
    layer_budgets_ = b.value();
  }
  CHECK(shape.layer_windows.empty() || static_cast<int>(shape.layer_windows.size()) == shape.num_layers);
  for (size_t l = 0; l < shape.layer_windows.size(); ++l) {
    if (shape.layer_windows[l] > 0) layer_budgets_[l] = shape.layer_windows[l];
  }
  if (policy.kind == KvPolicyKind::h2o) {
    for (int l = 0; l < shape.num_layers; ++l) {
      if (observes(l)) h2o_[l] = std::make_unique<H2oAccumulator>(shape.num_heads, shape.num_kv_heads, shape.head_dim);
    }
  }
}

bool KvCompressor::windowed(int layer) const {
  return !shape_.layer_windows.empty() && shape_.layer_windows[layer] > 0;
}

// compress_layer keeps everything when the prompt fits the budget and the last `window`
// positions on a windowed layer: neither reads a query. (Scoring a gemma3 local layer for H2O
// cost O(prompt²) per layer, 15 of its 18 layers, and was thrown away.)
bool KvCompressor::observes(int layer) const {
  return active() && policy_.kind != KvPolicyKind::streaming && !windowed(layer) && compress_at_ > layer_budgets_[layer];
}

int64_t KvCompressor::layer_budget(int layer) const { return layer_budgets_[layer]; }

void KvCompressor::gather_keys(const PagedKvCache& cache, int layer, int64_t n) {
  const int64_t hd = shape_.head_dim;
  keys_.resize(static_cast<size_t>(shape_.num_kv_heads * n * hd));
  for (int g = 0; g < shape_.num_kv_heads; ++g) {
    CHECK_GE(cache.length(layer, g), n);
    for (int64_t j = 0; j < n; ++j) {
      cache.read_k_row(layer, g, j, &keys_[(g * n + j) * hd]);  // f32, as attention reads it
    }
  }
}

LayerQk KvCompressor::gather_qk(const PagedKvCache& cache, int layer, const float* q, int64_t num_queries,
                                int64_t n) {
  gather_keys(cache, layer, n);
  LayerQk qk;
  qk.q = q;
  qk.num_queries = num_queries;
  qk.k = keys_.data();
  qk.kv_head_stride = n * shape_.head_dim;
  qk.num_tokens = n;
  qk.num_heads = shape_.num_heads;
  qk.num_kv_heads = shape_.num_kv_heads;
  qk.head_dim = shape_.head_dim;
  return qk;
}

Status KvCompressor::observe(int layer, const float* q, const int32_t* positions, int64_t n,
                             const PagedKvCache& cache) {
  if (!observes(layer) || done_[layer]) return {};
  const int64_t row = int64_t{shape_.num_heads} * shape_.head_dim;
  switch (policy_.kind) {
    case KvPolicyKind::snapkv:
    case KvPolicyKind::pyramidkv:
    case KvPolicyKind::adakv: {
      // Keep the queries of positions [compress_at - W, compress_at), in order.
      const int64_t w = std::min<int64_t>(policy_.window, compress_at_);
      auto& buf = window_q_[layer];
      buf.resize(static_cast<size_t>(w * row));
      for (int64_t t = 0; t < n; ++t) {
        const int64_t slot = positions[t] - (compress_at_ - w);
        if (slot >= 0 && slot < w) std::memcpy(&buf[slot * row], q + t * row, row * sizeof(float));
      }
      return {};
    }
    case KvPolicyKind::h2o: {
      // Only the prompt part that will be compressed contributes.
      int64_t m = 0;
      while (m < n && positions[m] < compress_at_) ++m;
      if (m == 0) return {};
      const int64_t end = positions[m - 1] + 1;
      const double t0 = now_seconds();
      Status s = h2o_[layer]->add(gather_qk(cache, layer, q, m, end), positions[0]);
      selection_seconds_ += now_seconds() - t0;
      return s;
    }
    case KvPolicyKind::full:
    case KvPolicyKind::streaming:
      return {};
  }
  return {};
}

Status KvCompressor::compress_layer(int layer, PagedKvCache& cache) {
  if (!active() || done_[layer]) return {};
  done_[layer] = true;
  const int64_t n = compress_at_;
  for (int g = 0; g < shape_.num_kv_heads; ++g) {
    if (cache.length(layer, g) != n) {
      return internal_error("layer " + std::to_string(layer) + " head " + std::to_string(g) + " holds " +
                            std::to_string(cache.length(layer, g)) + " tokens at compression, expected " +
                            std::to_string(n));
    }
  }
  const double t0 = now_seconds();
  const int64_t budget = layer_budgets_[layer];
  Result<LayerSelection> sel = invalid_argument("no selection");
  if (n <= budget) {
    LayerSelection all;
    all.kept.assign(shape_.num_kv_heads, {});
    for (auto& h : all.kept) {
      h.resize(n);
      for (int64_t j = 0; j < n; ++j) h[j] = static_cast<int32_t>(j);
    }
    sel = std::move(all);
  } else if (windowed(layer)) {
    // A local layer: positions before n - budget (budget = its window) are never visible
    // to a later query, so keeping the last `budget` is exact, whatever the policy.
    LayerSelection last;
    last.kept.assign(shape_.num_kv_heads, {});
    for (auto& h : last.kept) {
      h.resize(budget);
      for (int64_t j = 0; j < budget; ++j) h[j] = static_cast<int32_t>(n - budget + j);
    }
    sel = std::move(last);
  } else if (policy_.kind == KvPolicyKind::streaming) {
    StreamingParams p;
    p.budget = budget;
    p.num_sink = policy_.num_sink;
    sel = streaming_select(n, shape_.num_kv_heads, p);
  } else if (policy_.kind == KvPolicyKind::h2o) {
    H2oParams p;
    p.budget = budget;
    p.aggregation = policy_.aggregation;
    sel = h2o_[layer]->select(p);
    h2o_[layer].reset();  // scores no longer needed
  } else {
    const LayerQk qk = gather_qk(cache, layer, window_q_[layer].data(), policy_.window, n);
    SnapKvParams p;
    p.budget = budget;
    p.window = policy_.window;
    p.kernel = policy_.kernel;
    p.pooling = policy_.pooling;
    p.aggregation = policy_.aggregation;
    if (policy_.kind == KvPolicyKind::adakv) {
      AdaKvParams ap;
      ap.snap = p;
      ap.alpha = policy_.adakv_alpha;
      sel = adakv_select(qk, ap);
    } else {
      sel = snapkv_select(qk, p);
    }
  }
  if (!sel.ok()) return sel.status();
  window_q_[layer].clear();
  window_q_[layer].shrink_to_fit();
  // Before the first compression a head holds positions 0..n-1 in order: index == position.
  for (int g = 0; g < shape_.num_kv_heads; ++g) {
    SNAP_RETURN_IF_ERROR(cache.compact(layer, g, sel->kept[g]));
  }
  kept_[layer] = std::move(sel->kept);
  selection_seconds_ += now_seconds() - t0;
  return {};
}

}  // namespace snap
