// Causal GQA attention over a contiguous KV cache (kernels.h has the layout).
// attention_ref: per (token, head), f64 two-pass softmax over the visible keys.
// attention_cpu: flash-attention style. A work item is (KV head, tile of ≤16 queries, KV
// split); its rows are the tile's queries × the group's query heads, so each K/V block
// (64 keys) is loaded once for the whole GQA group. Per row a running max m, sum l and
// f32 accumulator; no buffer grows with num_tokens × kv_len. Decode (few items) splits the
// KV range across threads and merges the partial (m, l, acc) triples afterwards.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/attention_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace snap::kernels {

namespace {

constexpr int64_t k_query_tile = k_attention_query_tile;
constexpr int64_t k_key_block = 64;      // 64 keys × 64 dims × 4 B = 16 KiB of K, same of V: L1-resident

// Visible keys of a query at position pos: [lo, hi).
struct KeyRange {
  int64_t lo = 0, hi = 0;
};
KeyRange visible(int32_t pos, int64_t kv_len, int window) {
  KeyRange r;
  r.hi = std::min<int64_t>(static_cast<int64_t>(pos) + 1, kv_len);
  r.lo = window > 0 ? std::max<int64_t>(0, static_cast<int64_t>(pos) - window + 1) : 0;
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}


// One work item: KV head g, queries [t0, t1), keys [kb, ke). Writes (m, l, acc) per row into
// the caller's arrays; rows ordered (token, head within group).
void run_item(const BlockOps& ops, const float* q, const int32_t* q_pos, int64_t t0, int64_t t1, const float* kg,
              const float* vg, int64_t kv_len, int64_t kb, int64_t ke, const AttentionParams& p, int g,
              RowState* state, float* acc, float* qs, float* s) {
  const int hd = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t num_rows = (t1 - t0) * group;
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t t = t0 + r / group;
    const int h = g * group + static_cast<int>(r % group);
    const float* qr = q + (t * p.num_heads + h) * hd;
    for (int i = 0; i < hd; ++i) qs[r * hd + i] = qr[i] * p.scale;
    std::fill(acc + r * hd, acc + (r + 1) * hd, 0.0f);
    state[r] = RowState{};
  }
  for (int64_t j0 = kb; j0 < ke; j0 += k_key_block) {
    const int64_t j1 = std::min(ke, j0 + k_key_block);
    for (int64_t r = 0; r < num_rows; ++r) {
      const KeyRange vis = visible(q_pos[t0 + r / group], kv_len, p.sliding_window);
      const int64_t a = std::max(j0, vis.lo), b = std::min(j1, vis.hi);
      if (a >= b) continue;
      const int64_t n = b - a;
      ops.scores(qs + r * hd, kg + a * hd, n, hd, s);
      float m = state[r].m;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
      if (m > state[r].m) {
        const float f = std::exp(state[r].m - m);  // 0 on the first block (m was −inf)
        state[r].l *= f;
        ops.scale(acc + r * hd, hd, f);
        state[r].m = m;
      }
      state[r].l += ops.exp_sum(s, n, state[r].m);
      ops.accumulate(acc + r * hd, s, vg + a * hd, n, hd);
    }
  }
}

}  // namespace

void attention_ref(const float* q, const int32_t* q_positions, int64_t num_tokens, const float* k, const float* v,
                   int64_t kv_head_stride, int64_t kv_len, const AttentionParams& p, float* out) {
  const int hd = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  std::vector<double> w;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const KeyRange vis = visible(q_positions[t], kv_len, p.sliding_window);
    for (int h = 0; h < p.num_heads; ++h) {
      const float* qh = q + (t * p.num_heads + h) * hd;
      const float* kg = k + (h / group) * kv_head_stride;
      const float* vg = v + (h / group) * kv_head_stride;
      float* o = out + (t * p.num_heads + h) * hd;
      w.assign(static_cast<size_t>(vis.hi - vis.lo), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = vis.lo; j < vis.hi; ++j) {
        double d = 0.0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(qh[i]) * kg[j * hd + i];
        w[j - vis.lo] = d * p.scale;
        m = std::max(m, w[j - vis.lo]);
      }
      double sum = 0.0;
      for (double& x : w) sum += (x = std::exp(x - m));
      for (int i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (int64_t j = vis.lo; j < vis.hi; ++j) acc += w[j - vis.lo] * vg[j * hd + i];
        o[i] = w.empty() ? 0.0f : static_cast<float>(acc / sum);
      }
    }
  }
}

void attention_cpu(const float* q, const int32_t* q_positions, int64_t num_tokens, const float* k, const float* v,
                   int64_t kv_head_stride, int64_t kv_len, const AttentionParams& p, float* out) {
  CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0) << "attention: heads " << p.num_heads << "/"
                                                                  << p.num_kv_heads;
  const int hd = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const BlockOps ops = attention_block_ops(hd);
  const int64_t num_tiles = (num_tokens + k_query_tile - 1) / k_query_tile;
  const int64_t base_items = num_tiles * p.num_kv_heads;
  const int64_t splits = attention_kv_splits(num_tokens, p.num_kv_heads, kv_len);
  const int64_t split_len = (kv_len + splits - 1) / splits;
  const int64_t rows_per_tile = k_query_tile * group;
  SplitRows rows(splits, num_tokens, p.num_heads, hd);

#pragma omp parallel if (base_items * splits > 1 && num_tokens * kv_len * p.num_heads >= 4096)
  {
    std::vector<RowState> state(static_cast<size_t>(rows_per_tile));
    std::vector<float> acc(static_cast<size_t>(rows_per_tile * hd));
    std::vector<float> qs(static_cast<size_t>(rows_per_tile * hd));
    std::vector<float> s(static_cast<size_t>(k_key_block));
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < base_items * splits; ++item) {
      // Longest first: later query tiles see more keys under the causal mask.
      const int64_t tile = num_tiles - 1 - item / (p.num_kv_heads * splits);
      const int g = static_cast<int>((item / splits) % p.num_kv_heads);
      const int64_t split = item % splits;
      const int64_t t0 = tile * k_query_tile, t1 = std::min(num_tokens, t0 + k_query_tile);
      const int64_t kb = split * split_len, ke = std::min(kv_len, kb + split_len);
      run_item(ops, q, q_positions, t0, t1, k + g * kv_head_stride, v + g * kv_head_stride, kv_len, kb, ke, p, g,
               state.data(), acc.data(), qs.data(), s.data());
      for (int64_t r = 0; r < (t1 - t0) * group; ++r) {
        const int64_t t = t0 + r / group;
        const int h = g * group + static_cast<int>(r % group);
        rows.store(split, t, h, state[r], acc.data() + r * hd, out);
      }
    }
  }
  rows.merge(out);
}

}  // namespace snap::kernels
