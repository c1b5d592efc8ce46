// Causal GQA attention over a paged per-KV-head cache (kernels/attention_paged.h).
// Prefill rows go 4 at a time through the AVX2 tile ops where they share keys (bit-equal to
// the row path: see attention_ops.h), the rest row by row.
// attention_paged_ref: per (token, head), f64 two-pass softmax over every key, masked by
// position; relies on nothing but the view. attention_paged_cpu: the flash-attention scheme
// of attention.cpp — work item (KV head, tile of ≤16 queries, KV split), online softmax per
// row, partial (m, l, acc) merged across splits — with the key loop walking the block table.
// Keys are processed in logical chunks of 64 spanning several 16-token blocks, so the
// softmax rescale runs as often as in the contiguous kernel; the dot/axpy loops restart only
// where the next block is not physically adjacent, and the next chunk's blocks are prefetched.
// K/V elements may be f32, bf16, f16 or q8_0: the block ops convert them in registers.
#include "kernels/attention_paged.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/attention_ops.h"
#include "kernels/cpu/kv_q8.h"
#include "kernels/cpu/simd.h"
#include "kernels/kv_convert.h"

namespace snap::kernels {

namespace {

constexpr int64_t k_query_tile = k_attention_query_tile;
constexpr int64_t k_key_chunk = 64;        // 64 keys × 64 dims × 4 B = 16 KiB of K, same of V: L1-resident

// Byte layout of a K or V region: block b's row `slot` starts at
// b * block_stride * unit + slot * row bytes (unit: the stride's element size, 1 for q8_0).
struct RowLayout {
  int64_t unit = 4, row = 0;
  RowLayout(DType dtype, int hd)
      : unit(dtype == DType::q8_0 ? 1 : dtype_size(dtype)), row(kv_row_bytes(dtype, hd)) {}
};

// Address of row `slot` of block `blk` of a K or V region.
const void* kv_row(const void* base, const RowLayout& l, int64_t block_stride, int64_t blk, int64_t slot) {
  return static_cast<const char*>(base) + blk * block_stride * l.unit + slot * l.row;
}

// Value i of a row of kv.dtype, as f32 (the reference's loads).
float kv_element(const void* row, DType dtype, int hd, int i) {
  switch (dtype) {
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(row)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(row)[i]);
    case DType::q8_0: return kv_q8_value(row, hd, i);
    default: return static_cast<const float*>(row)[i];
  }
}

void check_kv_dtype(DType dtype) {
  CHECK(kv_dtype_supported(dtype)) << "attention_paged: KV element type " << dtype_name(dtype)
                                   << " (f32, bf16, f16 or q8_0)";
}

int32_t key_position(const PagedKv& kv, const PagedKvHead& h, int64_t j) {
  return kv.pos_base[h.block_table[j / kv.block_size] * kv.pos_block_stride + j % kv.block_size];
}

bool key_visible(int32_t key_pos, int32_t q_pos, int window) {
  return key_pos <= q_pos && (window <= 0 || static_cast<int64_t>(q_pos) - key_pos < window);
}

// Visible keys [lo, hi) of a query at q_pos, by binary search over the ascending positions.
struct KeyRange {
  int64_t lo = 0, hi = 0;
};
KeyRange visible_range(const PagedKv& kv, const PagedKvHead& h, int32_t q_pos, int window) {
  auto first_above = [&](int64_t bound) {  // first j with pos_j > bound
    int64_t lo = 0, hi = h.length;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (key_position(kv, h, mid) <= bound)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  };
  KeyRange r;
  r.hi = first_above(q_pos);
  r.lo = window > 0 ? first_above(static_cast<int64_t>(q_pos) - window) : 0;
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// Calls f(block, slot, count, offset) for each run of keys [a, b) that is contiguous in
// memory; offset = first key of the run − a. When K and V blocks are packed back to back
// (stride = block_size rows), physically adjacent blocks — the common case after a
// sequential prefill — merge into one run, so the dot/axpy loops do not restart every 16 keys.
template <typename F>
void for_each_run(const PagedKv& kv, const PagedKvHead& h, const RowLayout& l, int64_t a, int64_t b, F&& f) {
  const int64_t bs = kv.block_size;
  const bool packed = kv.k_block_stride * l.unit == bs * l.row && kv.v_block_stride * l.unit == bs * l.row;
  for (int64_t j = a; j < b;) {
    const int64_t base = j - j % bs;  // first key of j's block
    const int64_t blk = h.block_table[j / bs];
    int64_t end = std::min(base + bs, b);
    while (packed && end < b && h.block_table[end / bs] == blk + (end - base) / bs) end = std::min(end + bs, b);
    f(blk, j - base, end - j, j - a);
    j = end;
  }
}


// Software prefetch of the K and V blocks holding keys [a, b), one 64-key chunk ahead: with
// blocks scattered by compression and reuse, each 4 KiB block is a new page where the
// hardware prefetcher restarts cold (SmolLM2 decode at 8K keys over a shuffled free list,
// 1 thread: 827 µs without, ~590 µs with; contiguous 470 µs).
void prefetch_keys(const PagedKv& kv, const PagedKvHead& h, int64_t a, int64_t b, const RowLayout& l) {
  for_each_run(kv, h, l, a, b, [&](int64_t blk, int64_t slot, int64_t count, int64_t) {
    const char* k = static_cast<const char*>(kv_row(kv.k_base, l, kv.k_block_stride, blk, slot));
    const char* v = static_cast<const char*>(kv_row(kv.v_base, l, kv.v_block_stride, blk, slot));
    const int64_t bytes = count * l.row;
    for (int64_t off = 0; off < bytes; off += 64) {
      _mm_prefetch(k + off, _MM_HINT_T0);
      _mm_prefetch(v + off, _MM_HINT_T0);
    }
  });
}

// Per-thread buffers of run_item, sized for one query tile.
struct Scratch {
  std::vector<RowState> state;  // [rows]
  std::vector<float> acc, qs;   // [rows, head_dim]
  std::vector<float> s;         // [4, k_key_chunk]: the scores of up to 4 rows (a tile)
  std::vector<KeyRange> vis;    // [k_query_tile]
};

// One work item: KV head g, queries [t0, t1), logical keys [kb, ke). Leaves (m, l, acc) per
// row in the scratch; rows ordered (token, head within group).
void run_item(const BlockOps& ops, const float* q, const int32_t* q_pos, int64_t t0, int64_t t1, const PagedKv& kv,
              int64_t kb, int64_t ke, const AttentionParams& p, int g, Scratch& sc) {
  const int hd = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t num_rows = (t1 - t0) * group;
  const PagedKvHead& head = kv.heads[g];
  const RowLayout layout(kv.dtype, hd);
  int64_t lo_all = ke, hi_all = kb;  // union of the tile's visible ranges within [kb, ke)
  for (int64_t t = t0; t < t1; ++t) {
    KeyRange r = visible_range(kv, head, q_pos[t], p.sliding_window);
    r.lo = std::max(r.lo, kb);
    r.hi = std::min(r.hi, ke);
    sc.vis[t - t0] = r;
    if (r.lo < r.hi) {
      lo_all = std::min(lo_all, r.lo);
      hi_all = std::max(hi_all, r.hi);
    }
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t t = t0 + r / group;
    const int h = g * group + static_cast<int>(r % group);
    const float* qr = q + (t * p.num_heads + h) * hd;
    for (int i = 0; i < hd; ++i) sc.qs[r * hd + i] = qr[i] * p.scale;
    std::fill(sc.acc.begin() + r * hd, sc.acc.begin() + (r + 1) * hd, 0.0f);
    sc.state[r] = RowState{};
  }
  // The row-at-a-time steps over keys [a, b) of one chunk, s_r holding key a's score first.
  auto scores = [&](int64_t r, int64_t a, int64_t b, float* s_r) {
    const float* qr = sc.qs.data() + r * hd;
    for_each_run(kv, head, layout, a, b, [&](int64_t blk, int64_t slot, int64_t count, int64_t off) {
      ops.scores(qr, kv_row(kv.k_base, layout, kv.k_block_stride, blk, slot), count, hd, s_r + off);
    });
  };
  auto softmax = [&](int64_t r, float* s_r, int64_t n) {  // s_r[0, n) → e^(s − m), running (m, l)
    RowState& st = sc.state[r];
    float m = st.m;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, s_r[j]);
    if (m > st.m) {
      const float f = std::exp(st.m - m);  // 0 on the first chunk (m was −inf)
      st.l *= f;
      ops.scale(sc.acc.data() + r * hd, hd, f);
      st.m = m;
    }
    st.l += ops.exp_sum(s_r, n, st.m);
  };
  auto accumulate = [&](int64_t r, int64_t a, int64_t b, const float* p_r) {
    float* acc = sc.acc.data() + r * hd;
    for_each_run(kv, head, layout, a, b, [&](int64_t blk, int64_t slot, int64_t count, int64_t off) {
      ops.accumulate(acc, p_r + off, kv_row(kv.v_base, layout, kv.v_block_stride, blk, slot), count, hd);
    });
  };
  const bool tiles = ops.scores_tile != nullptr && attention_tiles_enabled();
  for (int64_t j0 = lo_all; j0 < hi_all; j0 += k_key_chunk) {
    const int64_t j1 = std::min(hi_all, j0 + k_key_chunk);
    prefetch_keys(kv, head, j1, std::min(hi_all, j1 + k_key_chunk), layout);
    for (int64_t r0 = 0; r0 < num_rows;) {
      // Up to four rows (a decode token's GQA group, or prefill rows) share the keys [A, B)
      // every one of them sees in this chunk: those run as a tile (each K/V row loaded once for
      // all of them); what only some see runs per row, in key order around the tile so every
      // acc element is summed in the order of the row path.
      int64_t a[4], b[4], A = j0, B = j1;
      const int64_t rows = tiles ? std::min<int64_t>(4, num_rows - r0) : 1;
      for (int64_t i = 0; i < rows; ++i) {
        const KeyRange& vis = sc.vis[(r0 + i) / group];
        a[i] = std::max(j0, vis.lo);
        b[i] = std::min(j1, vis.hi);
        A = std::max(A, a[i]);
        B = std::min(B, b[i]);
      }
      if (rows == 1 || A >= B) {  // one row, or rows without a common key: row by row
        for (int64_t r = r0; r < r0 + rows; ++r) {
          const KeyRange& vis = sc.vis[r / group];
          const int64_t ar = std::max(j0, vis.lo), br = std::min(j1, vis.hi);
          if (ar >= br) continue;
          float* s_r = sc.s.data() + (r - r0) * k_key_chunk;
          scores(r, ar, br, s_r);
          softmax(r, s_r, br - ar);
          accumulate(r, ar, br, s_r);
        }
        r0 += rows;
        continue;
      }
      const int nt = static_cast<int>(rows);
      float* s_r[4];
      const float* q_r[4];
      float* acc_r[4];
      for (int64_t i = 0; i < rows; ++i) {
        s_r[i] = sc.s.data() + i * k_key_chunk;
        q_r[i] = sc.qs.data() + (r0 + i) * hd;
        acc_r[i] = sc.acc.data() + (r0 + i) * hd;
        scores(r0 + i, a[i], A, s_r[i]);
        scores(r0 + i, B, b[i], s_r[i] + (B - a[i]));
      }
      for_each_run(kv, head, layout, A, B, [&](int64_t blk, int64_t slot, int64_t count, int64_t off) {
        float* s_at[4];
        for (int64_t i = 0; i < rows; ++i) s_at[i] = s_r[i] + (A - a[i]) + off;
        ops.scores_tile(q_r, kv_row(kv.k_base, layout, kv.k_block_stride, blk, slot), count, hd, s_at, nt);
      });
      for (int64_t i = 0; i < rows; ++i) {
        softmax(r0 + i, s_r[i], b[i] - a[i]);
        accumulate(r0 + i, a[i], A, s_r[i]);
      }
      for_each_run(kv, head, layout, A, B, [&](int64_t blk, int64_t slot, int64_t count, int64_t off) {
        const float* p_at[4];
        for (int64_t i = 0; i < rows; ++i) p_at[i] = s_r[i] + (A - a[i]) + off;
        ops.accumulate_tile(acc_r, p_at, kv_row(kv.v_base, layout, kv.v_block_stride, blk, slot), count, hd, nt);
      });
      for (int64_t i = 0; i < rows; ++i) accumulate(r0 + i, B, b[i], s_r[i] + (B - a[i]));
      r0 += rows;
    }
  }
}

}  // namespace

void attention_paged_ref(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKv& kv,
                         const AttentionParams& p, float* out) {
  check_kv_dtype(kv.dtype);
  const int hd = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const RowLayout layout(kv.dtype, hd);
  std::vector<double> w;
  std::vector<int64_t> keys;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < p.num_heads; ++h) {
      const PagedKvHead& head = kv.heads[h / group];
      const float* qh = q + (t * p.num_heads + h) * hd;
      float* o = out + (t * p.num_heads + h) * hd;
      keys.clear();
      w.clear();
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < head.length; ++j) {
        if (!key_visible(key_position(kv, head, j), q_positions[t], p.sliding_window)) continue;
        const int64_t blk = head.block_table[j / kv.block_size], slot = j % kv.block_size;
        const void* kr = kv_row(kv.k_base, layout, kv.k_block_stride, blk, slot);
        double d = 0.0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(qh[i]) * kv_element(kr, kv.dtype, hd, i);
        keys.push_back(j);
        w.push_back(d * p.scale);
        m = std::max(m, w.back());
      }
      double sum = 0.0;
      for (double& x : w) sum += (x = std::exp(x - m));
      for (int i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (size_t n = 0; n < keys.size(); ++n) {
          const int64_t j = keys[n];
          const int64_t blk = head.block_table[j / kv.block_size], slot = j % kv.block_size;
          acc += w[n] * kv_element(kv_row(kv.v_base, layout, kv.v_block_stride, blk, slot), kv.dtype, hd, i);
        }
        o[i] = keys.empty() ? 0.0f : static_cast<float>(acc / sum);
      }
    }
  }
}

void attention_paged_cpu(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKv& kv,
                         const AttentionParams& p, float* out) {
  CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0)
      << "attention_paged: heads " << p.num_heads << "/" << p.num_kv_heads;
  CHECK_GT(kv.block_size, 0);
  check_kv_dtype(kv.dtype);
  const int hd = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const BlockOps ops = attention_block_ops(hd, kv.dtype);
  int64_t max_len = 0;
  for (int g = 0; g < p.num_kv_heads; ++g) max_len = std::max(max_len, kv.heads[g].length);
  const int64_t num_tiles = (num_tokens + k_query_tile - 1) / k_query_tile;
  const int64_t base_items = num_tiles * p.num_kv_heads;
  const int64_t splits = attention_kv_splits(num_tokens, p.num_kv_heads, max_len);
  const int64_t rows_per_tile = k_query_tile * group;
  SplitRows rows(splits, num_tokens, p.num_heads, hd);

#pragma omp parallel if (base_items * splits > 1 && num_tokens * max_len * p.num_heads >= 4096)
  {
    Scratch sc;
    sc.state.resize(static_cast<size_t>(rows_per_tile));
    sc.acc.resize(static_cast<size_t>(rows_per_tile * hd));
    sc.qs.resize(static_cast<size_t>(rows_per_tile * hd));
    sc.s.resize(static_cast<size_t>(4 * k_key_chunk));
    sc.vis.resize(static_cast<size_t>(k_query_tile));
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < base_items * splits; ++item) {
      // Longest first: later query tiles see more keys under the causal mask.
      const int64_t tile = num_tiles - 1 - item / (p.num_kv_heads * splits);
      const int g = static_cast<int>((item / splits) % p.num_kv_heads);
      const int64_t split = item % splits;
      const int64_t t0 = tile * k_query_tile, t1 = std::min(num_tokens, t0 + k_query_tile);
      const int64_t len = kv.heads[g].length;
      const int64_t split_len = (len + splits - 1) / splits;  // heads differ in length after compression
      const int64_t kb = std::min(len, split * split_len), ke = std::min(len, kb + split_len);
      run_item(ops, q, q_positions, t0, t1, kv, kb, ke, p, g, sc);
      for (int64_t r = 0; r < (t1 - t0) * group; ++r) {
        const int64_t t = t0 + r / group;
        const int h = g * group + static_cast<int>(r % group);
        rows.store(split, t, h, sc.state[r], sc.acc.data() + r * hd, out);
      }
    }
  }
  rows.merge(out);
}

}  // namespace snap::kernels
