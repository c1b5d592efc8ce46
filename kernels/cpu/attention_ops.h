// Internal to kernels/cpu: the block primitives both attention kernels (contiguous and
// paged) run their online softmax with, one set per SIMD level and KV element type, and the
// per-row state. K and V rows are f32, bf16, f16 or q8_0 (converted to f32 in registers;
// rows of a run are kv_row_bytes(kv_dtype, hd) apart); q, p, acc and every sum are f32.
//   scores: s[j] = dot(q, k_j), j < n; exp_sum: s[j] = e^(s[j]−m), returns Σ;
//   accumulate: acc += Σ_j p[j]·v_j; scale: acc *= f.
// scores_tile/accumulate_tile (the AVX2 and AVX-512 sets; null in the scalar one) do the same
// for 2-4 query rows against the same keys, bit-equal to that many calls of scores/accumulate:
// prefill tiles rows, and a decode token's GQA group shares its KV head's loads.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "common/dtype.h"

namespace snap::kernels {

struct BlockOps {
  void (*scores)(const float* q, const void* k, int64_t n, int hd, float* s);  // k: [n, hd] of kv_dtype
  float (*exp_sum)(float* s, int64_t n, float m);
  void (*accumulate)(float* acc, const float* p, const void* v, int64_t n, int hd);  // v: [n, hd] of kv_dtype
  void (*scale)(float* acc, int hd, float f);
  // s[r][j] = dot(q[r], k_j) and acc[r] += Σ_j p[r][j]·v_j for r < rows (2..4); may be null.
  void (*scores_tile)(const float* const* q, const void* k, int64_t n, int hd, float* const* s, int rows) = nullptr;
  void (*accumulate_tile)(float* const* acc, const float* const* p, const void* v, int64_t n, int hd,
                          int rows) = nullptr;
};

// Tests and benchmarks turn the 4-row tiles of attention_paged_cpu off (on by default;
// env SNAP_ATTENTION_TILES=0 starts with them off) to compare against the row-at-a-time
// path; not to be called while a kernel runs.
void attention_tiles_override(bool on);
bool attention_tiles_enabled();

// The fastest set for this CPU (kernels/cpu/simd.h) that supports head_dim: AVX2 needs
// head_dim % 8 == 0, AVX-512 head_dim % 16 == 0 (every Llama-family head_dim is 64 or 128).
// kv_dtype: f32, bf16, f16 or q8_0 (CHECK); q8_0 runs at most the AVX2 set.
BlockOps attention_block_ops(int head_dim, DType kv_dtype = DType::f32);

// Query rows per work item, shared by both kernels.
inline constexpr int64_t k_attention_query_tile = 16;

// Work split of one attention call: items are (query tile, KV head), and when that gives
// fewer than 4 items per thread (so causal imbalance cannot even out) the keys of each
// head are split too, into at most kv_len / 256 parts (below 256 keys a split's merge
// costs more than it saves). Returns the number of key splits (>= 1).
int64_t attention_kv_splits(int64_t num_tokens, int num_kv_heads, int64_t kv_len);

// Running softmax state of one (query, head) row: acc is unnormalized, output = acc / l.
struct RowState {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
};

// o[hd] = acc / l (zeros when no key was visible; NaN propagates).
void attention_write_row(const RowState& st, const float* acc, int hd, float* o);

// The rows of one attention call when its keys are split: each split's (state, acc) per
// (token, head), merged in split order at the end. With one split, rows go straight out.
class SplitRows {
 public:
  SplitRows(int64_t splits, int64_t num_tokens, int num_heads, int head_dim);
  // Row (token t, head h) of split `split`; `out` is the call's [num_tokens, num_heads, hd].
  void store(int64_t split, int64_t t, int h, const RowState& st, const float* acc, float* out);
  // out = Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s, M = max_s m_s (nothing when unsplit).
  void merge(float* out) const;

 private:
  int64_t splits_, num_tokens_;
  int num_heads_, hd_;
  std::vector<RowState> state_;  // [splits][num_tokens][num_heads]
  std::vector<float> acc_;       // [splits][num_tokens][num_heads][hd]
};

}  // namespace snap::kernels
