// KV-cache selection algorithms as pure functions over one layer's post-RoPE Q/K (f32):
// SnapKV, AdaKV (head-adaptive budgets), H2O (accumulated attention), StreamingLLM
// (sinks + recent) and the PyramidKV per-layer budgets. They return, per KV head, the
// sorted prompt positions to keep; the paged cache and the forward pass apply them.
// Ties: equal scores → the LOWER position wins (AdaKV's global stage: lower KV head first).
// Non-finite scores (NaN from broken inputs) rank below every finite score.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace snap {

enum class KvPooling : uint8_t { max, avg };
enum class GqaAggregation : uint8_t { mean, max };  // over the query heads of a KV head

// One layer's queries and keys.
//   q: [num_queries, num_heads, head_dim], the queries of prompt positions
//      num_tokens-num_queries .. num_tokens-1 (SnapKV/AdaKV use the last `window` rows)
//   k: KV head g, position j at k + g*kv_head_stride + j*head_dim, j < num_tokens
// Query head h reads KV head h / (num_heads / num_kv_heads).
struct LayerQk {
  const float* q = nullptr;
  int64_t num_queries = 0;
  const float* k = nullptr;
  int64_t kv_head_stride = 0;
  int64_t num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

struct LayerSelection {
  std::vector<std::vector<int32_t>> kept;  // [num_kv_heads] sorted ascending positions
  // With keep_scores: [num_kv_heads] the scores the choice was made on, one per candidate
  // position (SnapKV/AdaKV: pooled prefix scores, positions 0..N-W-1; H2O: accumulated
  // attention, positions 0..N-1). Empty when no compression happened (N <= budget).
  std::vector<std::vector<float>> scores;

  int64_t total_kept() const;
};

// --- SnapKV -------------------------------------------------------------------
// Per query head: softmax over ALL N keys of (window queries · K)/√head_dim (f32; causal
// only inside the window), summed over the W window queries → a score per prefix position
// j < N-W; aggregated over the group's query heads; 1-D pooled (kernel k, stride 1, padding
// k/2); top (B−W) prefix positions plus the W window positions, exactly B per KV head.
// N <= B: nothing is dropped (all positions 0..N-1).
struct SnapKvParams {
  int64_t budget = 1024;  // B: positions kept per KV head, window included
  int window = 32;        // W
  int kernel = 31;        // k, odd (default: docs/eval.md, second sweep)
  KvPooling pooling = KvPooling::avg;  // (default: docs/eval.md, seventh sweep)
  GqaAggregation aggregation = GqaAggregation::mean;
  bool keep_scores = false;
};

// Checks B > W >= 1, k odd >= 1 (one-line message, e.g. "budget 16 must be larger than window 32").
Status snapkv_validate(const SnapKvParams& p);

// The pooled prefix scores, [num_kv_heads][num_tokens - window]. Needs num_queries >= window
// and num_tokens > window.
Result<std::vector<std::vector<float>>> snapkv_scores(const LayerQk& qk, const SnapKvParams& p);

Result<LayerSelection> snapkv_select(const LayerQk& qk, const SnapKvParams& p);

// --- AdaKV --------------------------------------------------------------------
// Same scores as SnapKV; the layer's num_kv_heads·(B−W) prefix slots are shared between
// its KV heads: each head first gets its own top floor(alpha·(B−W)) positions (the
// safeguard), the rest go to the globally highest remaining scores (ties: lower KV head,
// then lower position). Every head also keeps the window. Heads differ in size; the total
// is num_kv_heads·B.
struct AdaKvParams {
  SnapKvParams snap;
  double alpha = 0.2;  // safeguard share of the uniform budget, in [0, 1]
};

Result<LayerSelection> adakv_select(const LayerQk& qk, const AdaKvParams& p);

// --- StreamingLLM -------------------------------------------------------------
// The first num_sink positions (attention sinks) + the most recent budget − num_sink.
struct StreamingParams {
  int64_t budget = 1024;
  int num_sink = 4;
};

Result<LayerSelection> streaming_select(int64_t num_tokens, int num_kv_heads, const StreamingParams& p);

// --- H2O ----------------------------------------------------------------------
// Score of position j = Σ over every prompt query i >= j of softmax_i(j) (causal), per
// query head, aggregated over the group like SnapKV. Keeps the `recent` most recent
// positions plus the top (budget − recent) older ones by score. H2O's convention: half
// heavy hitters, half recent (recent = budget/2, rounded down). Never forms the N×N
// matrix: queries are processed in tiles of 64 rows ([64, N] floats at a time).
struct H2oParams {
  int64_t budget = 1024;
  int64_t recent = -1;  // -1: budget / 2
  GqaAggregation aggregation = GqaAggregation::mean;
  bool keep_scores = false;
};

// Accumulates the per-query-head scores chunk by chunk (chunked prefill): add() takes the
// queries of positions first_position .. first_position + qk.num_queries − 1, which must
// continue the previous chunk, and the keys of at least positions 0 .. that last position.
class H2oAccumulator {
 public:
  H2oAccumulator(int num_heads, int num_kv_heads, int head_dim);

  Status add(const LayerQk& qk, int64_t first_position);
  int64_t num_tokens() const { return num_tokens_; }
  Result<LayerSelection> select(const H2oParams& p) const;

 private:
  int num_heads_, num_kv_heads_, head_dim_;
  int64_t num_tokens_ = 0;
  std::vector<std::vector<float>> scores_;  // [num_heads][num_tokens_]
};

// Whole prompt at once: qk.num_queries must equal qk.num_tokens.
Result<LayerSelection> h2o_select(const LayerQk& qk, const H2oParams& p);

// --- PyramidKV ----------------------------------------------------------------
// Per-layer budgets (window included), layer 0 largest. With P = avg_budget − window
// prefix slots on average: min = max(1, P / beta), max = 2P − min, and layer l's share the
// arithmetic sequence r_l = max − l·(max − min)/(L − 1). Integers: p_l = ⌊r_l⌋, plus 1 for
// the first R layers where R = L·P − Σ⌊r_l⌋ (< L), so the budgets never increase with depth,
// stay within 1 of r_l (≥ 1), and Σ p_l = L·P exactly (= the uniform total).
// Budget of layer l = window + p_l; selection inside the layer is SnapKV with it.
Result<std::vector<int64_t>> pyramid_budgets(int num_layers, int64_t avg_budget, int window, int beta = 20);

}  // namespace snap
