// KvCompressor: applies one sequence's KvPolicy to its paged KV cache. The forward pass
// shows it every layer's post-RoPE queries during prefill (observe); it keeps what the
// policy needs — the observation window's queries (SnapKV family) or the running H2O
// scores — and, once the first `compress_at` tokens of a layer are in the cache,
// compress_layer() selects per KV head and compacts the cache, freeing blocks. Selection is
// local to the heads this cache holds (a tensor-parallel rank runs it on its own heads).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/kv/policy.h"
#include "worker/kv/selection.h"

namespace snap {

struct CompressorShape {
  int num_layers = 0;
  int num_heads = 0;     // query heads held by this cache's owner
  int num_kv_heads = 0;  // KV heads held
  int head_dim = 0;
  // [num_layers] or empty: a layer with a window w > 0 (gemma3's local layers) is not
  // compressed by the policy but keeps the last w positions, all that later tokens can see
  // (exact); the policy's budget applies to the other layers.
  std::vector<int> layer_windows;
};

class KvCompressor {
 public:
  // compress_at: prompt tokens after which the cache is compressed (the whole prompt, or
  // the context part in context-only mode). policy must be valid.
  KvCompressor(const KvPolicy& policy, CompressorShape shape, int64_t compress_at);

  const KvPolicy& policy() const { return policy_; }
  int64_t compress_at() const { return compress_at_; }
  bool active() const { return policy_.kind != KvPolicyKind::full && compress_at_ > 0; }
  // Budget (tokens per KV head, window included) of a layer: pyramidkv varies by layer.
  // A windowed layer (CompressorShape::layer_windows) keeps min(window, prompt) instead.
  int64_t layer_budget(int layer) const;

  // Called for each layer of each prefill chunk after its K/V were appended to the cache:
  // q [num_tokens, num_heads, head_dim] post-RoPE at positions[num_tokens].
  Status observe(int layer, const float* q, const int32_t* positions, int64_t num_tokens, const PagedKvCache& cache);
  // Selects and compacts one layer; the cache must hold exactly positions 0..compress_at-1
  // of it. Does nothing when the prompt fits the budget.
  Status compress_layer(int layer, PagedKvCache& cache);
  bool layer_done(int layer) const { return done_[layer]; }
  // Whether observe() keeps anything for this layer: not for full or streaming, nor where the
  // selection reads no query (a windowed layer, or a prompt within the layer's budget).
  bool observes(int layer) const;

  // Kept positions per layer and KV head after compression (empty until then).
  const std::vector<std::vector<int32_t>>& kept(int layer) const { return kept_[layer]; }
  double selection_seconds() const { return selection_seconds_; }

 private:
  bool windowed(int layer) const;  // keeps its window instead of the policy's selection
  // Keys of positions [0, n) of one layer, [num_kv_heads, n, head_dim] contiguous.
  void gather_keys(const PagedKvCache& cache, int layer, int64_t n);
  // gather_keys, then the scoring view of queries q [num_queries, num_heads, head_dim]
  // against those keys (valid until the next gather).
  LayerQk gather_qk(const PagedKvCache& cache, int layer, const float* q, int64_t num_queries, int64_t n);

  KvPolicy policy_;
  CompressorShape shape_;
  int64_t compress_at_;
  std::vector<int64_t> layer_budgets_;             // [num_layers]
  std::vector<std::vector<float>> window_q_;        // [layer][W, num_heads, head_dim]
  std::vector<std::unique_ptr<H2oAccumulator>> h2o_;  // [layer], h2o only
  std::vector<std::vector<std::vector<int32_t>>> kept_;  // [layer][kv_head]
  std::vector<bool> done_;
  std::vector<float> keys_;  // gather buffer
  double selection_seconds_ = 0;
};

}  // namespace snap
