// CUDA twin of attention_paged_cpu: causal GQA attention over the paged per-KV-head cache
// (bf16 K/V, f32 q/out, f32 accumulation), FlashAttention-style: tiled online softmax, no
// N×N matrix anywhere.
//   Block = 16 query rows (t, h) of one KV head g (the rows of a GQA group share every K/V
//   load) × one key split; 4 warps, each owning 4 rows. Keys stream through shared memory in
//   chunks of 32 (K padded to head_dim + 1 floats so lane j reading key j is conflict-free);
//   lane j scores key j, the warp's max/sum give the online-softmax update, and each lane
//   accumulates head_dim / 32 output dims (V reads are consecutive across lanes).
//   Prefill: many rows, one split (prompt chunks normally take attention_prefill_tc.cu).
//   Decode (≤ 64 rows per KV head) runs on attention_decode_kernel (DecodeAttention::key_threads,
//   below: raw bf16 K/V in shared memory, each K element read once per chunk for all the rows of
//   the block) unless row_warps is asked for, which runs the kernel above on decode rows. Either
//   way each head's keys are cut into splits of attention_split's
//   size ("flash-decoding": 512 keys, smaller for short heads so that there are ≥ 256 blocks),
//   so a 128K-key head runs as 256 blocks on all SMs, a compressed head runs only the splits
//   it holds, and the partials (m, l, acc) are merged in split order by a second kernel. Split
//   boundaries depend only on the split size, the same for every row of the call, so a row's
//   bits never depend on the other rows or heads of the call.
//   Visibility per row is a key range found by binary search over the head's ascending
//   positions (causal by position + sliding window), as on the CPU.
#include <cmath>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/ptx.cuh"

namespace snap::kernels {

namespace {
constexpr int k_rows = 16;  // query rows per block
constexpr int k_warps = 4;  // warp w owns rows w, w + 4, w + 8, w + 12
constexpr int k_rows_per_warp = k_rows / k_warps;
constexpr int k_chunk = 32;  // keys per shared-memory chunk (one per lane)

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

size_t smem_bytes(int head_dim) {
  return sizeof(float) * (static_cast<size_t>(k_rows) * head_dim + static_cast<size_t>(k_chunk) * (head_dim + 1) +
                          static_cast<size_t>(k_chunk) * head_dim);
}

}  // namespace

// kDims = head_dim / 32: output dims per lane. Grid: x row chunks, y KV heads, z splits.
template <int kDims>
__global__ void __launch_bounds__(k_warps * 32)
    attention_paged_kernel(const float* q, const int32_t* q_positions, int64_t num_tokens, PagedKvCuda kv,
                           AttentionParams p, int64_t splits, int64_t split_keys, bool vec, float* out,
                           float* ws_state, float* ws_acc) {
  constexpr int hd = kDims * 32;
  extern __shared__ float smem[];
  float* q_s = smem;                      // [k_rows][hd], pre-scaled
  float* k_s = q_s + k_rows * hd;         // [k_chunk][hd + 1]
  float* v_s = k_s + k_chunk * (hd + 1);  // [k_chunk][hd]
  __shared__ int64_t lo_s[k_rows], hi_s[k_rows];
  __shared__ int64_t range_s[2];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const paged::BlockSpan span = paged::block_span(kv, p, num_tokens, k_rows, splits, split_keys);
  const auto [group, g, nrows, split, r0, kb, ke, head] = span;

  paged::span_visible(kv, span, q_positions, p.sliding_window, tid, nrows, lo_s, hi_s);  // within [kb, ke)
  for (int idx = tid; idx < nrows * hd; idx += blockDim.x) {
    const int rr = idx / hd, i = idx % hd;
    q_s[idx] = q[paged::span_row(span, p.num_heads, rr) * hd + i] * p.scale;
  }
  __syncthreads();
  if (tid == 0) paged::range_union(lo_s, hi_s, 0, nrows, &range_s[0], &range_s[1]);  // [0, 0): no key here
  __syncthreads();
  const int64_t lo_all = range_s[0], hi_all = range_s[1];

  float m[k_rows_per_warp], l[k_rows_per_warp], acc[k_rows_per_warp][kDims];
#pragma unroll
  for (int k = 0; k < k_rows_per_warp; ++k) {
    m[k] = -INFINITY;
    l[k] = 0.0f;
#pragma unroll
    for (int e = 0; e < kDims; ++e) acc[k][e] = 0.0f;
  }

  // Chunks start at multiples of k_chunk (not at lo_all), so each row's chunking, hence its
  // rescale sequence and bits, does not depend on the other rows sharing the block.
  for (int64_t j0 = lo_all - lo_all % k_chunk; j0 < hi_all; j0 += k_chunk) {
    const int n = static_cast<int>(hi_all - j0 < k_chunk ? hi_all - j0 : k_chunk);
    if (vec) {  // 8 bf16 (16 B) per load: decode is bound by these reads
      // A chunk is at most k_chunk * hd / 8 = 128 * kDims loads of K (and of V): kDims per
      // thread. All of them are issued before the first is stored, so a thread keeps 2 * kDims
      // 16-byte loads in flight, not 2 (the stores to shared memory would otherwise order each
      // pair behind the last). The values stored are the same, so are the bits.
      uint4 kr[kDims], vr[kDims];
#pragma unroll
      for (int u = 0; u < kDims; ++u) {
        const int idx = tid + u * k_warps * 32;
        if (idx < n * (hd / 8)) paged::kv_piece(kv, head, j0 + idx / (hd / 8), hd, (idx % (hd / 8)) * 8, &kr[u], &vr[u]);
      }
#pragma unroll
      for (int u = 0; u < kDims; ++u) {
        const int idx = tid + u * k_warps * 32;
        if (idx < n * (hd / 8)) {
          const int jj = idx / (hd / 8), i = (idx % (hd / 8)) * 8;
          const unsigned kw[4] = {kr[u].x, kr[u].y, kr[u].z, kr[u].w}, vw[4] = {vr[u].x, vr[u].y, vr[u].z, vr[u].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {  // word e holds elements 2e (low half) and 2e + 1; bf16 → f32 is << 16
            k_s[jj * (hd + 1) + i + 2 * e] = __uint_as_float(kw[e] << 16);
            k_s[jj * (hd + 1) + i + 2 * e + 1] = __uint_as_float(kw[e] & 0xffff0000u);
            v_s[jj * hd + i + 2 * e] = __uint_as_float(vw[e] << 16);
            v_s[jj * hd + i + 2 * e + 1] = __uint_as_float(vw[e] & 0xffff0000u);
          }
        }
      }
    } else {
      for (int idx = tid; idx < n * hd; idx += blockDim.x) {
        const int jj = idx / hd, i = idx % hd;
        const int64_t j = j0 + jj;
        const paged::KvRows rows = paged::kv_rows(kv, head, j, hd);
        k_s[jj * (hd + 1) + i] = __bfloat162float(rows.k[i]);
        v_s[jj * hd + i] = __bfloat162float(rows.v[i]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < k_rows_per_warp; ++k) {
      const int rr = warp + k * k_warps;
      if (rr >= nrows) continue;  // uniform across the warp
      const int64_t a = lo_s[rr] > j0 ? lo_s[rr] : j0;
      const int64_t b = hi_s[rr] < j0 + n ? hi_s[rr] : j0 + n;
      if (a >= b) continue;
      const bool visible = j0 + lane >= a && j0 + lane < b;
      float s = -INFINITY;
      if (visible) {
        const float* qr = q_s + rr * hd;
        const float* kr = k_s + lane * (hd + 1);
        float d = 0.0f;
#pragma unroll 8
        for (int i = 0; i < hd; ++i) d = fmaf(qr[i], kr[i], d);
        s = d;
      }
      const float m_new = fmaxf(m[k], warp_max(s));  // finite: at least one lane is visible
      const float f = expf(m[k] - m_new);            // 0 on the first chunk (m was -inf)
      const float pj = visible ? expf(s - m_new) : 0.0f;
      l[k] = l[k] * f + warp_sum(pj);
#pragma unroll
      for (int e = 0; e < kDims; ++e) acc[k][e] *= f;
      for (int jj = static_cast<int>(a - j0); jj < static_cast<int>(b - j0); ++jj) {
        const float w = __shfl_sync(0xffffffffu, pj, jj);
#pragma unroll
        for (int e = 0; e < kDims; ++e) acc[k][e] = fmaf(w, v_s[jj * hd + lane + 32 * e], acc[k][e]);
      }
      m[k] = m_new;
    }
    __syncthreads();
  }

#pragma unroll
  for (int k = 0; k < k_rows_per_warp; ++k) {
    const int rr = warp + k * k_warps;
    if (rr >= nrows) continue;
    const int64_t row = paged::span_row(span, p.num_heads, rr);
    if (splits == 1) {
      const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;  // no visible key: zeros
#pragma unroll
      for (int e = 0; e < kDims; ++e) out[row * hd + lane + 32 * e] = acc[k][e] * inv;
    } else {
      const int64_t srow = split * num_tokens * p.num_heads + row;
      if (lane == 0) {
        ws_state[2 * srow] = m[k];
        ws_state[2 * srow + 1] = l[k];
      }
#pragma unroll
      for (int e = 0; e < kDims; ++e) ws_acc[srow * hd + lane + 32 * e] = acc[k][e];
    }
  }
}

// --- the decode form's key_threads kernel ----------------------------------------------------
// Block = up to kd_rows query rows of one KV head × one key split, kd_threads threads. Per
// aligned chunk of kd_keys keys: K and V go to shared memory as raw bf16 (16-byte copies, no
// conversion); thread (key kj = tid / 2, half hf = tid % 2) scores its half of key kj's dims
// against every row and the pair adds the halves (lo + hi on both lanes: the same bits); the
// rows' chunk maxima and weight sums go through fixed-order warp trees and a fixed-order sum
// over the 4 warps; then thread (dim pair, key class cls) accumulates p·V over the keys
// cls, cls + classes, ... of the chunk for every row. The classes' partial sums are added in
// class order at the end. Every order here is fixed by the chunk grid (multiples of kd_keys)
// and the thread mapping, and a row that sees no key of a chunk keeps its state exactly, so a
// row's bits depend only on its own query and keys.
namespace {
constexpr int kd_rows = 8;        // query rows per block (p·V reads a key's weights as two float4)
constexpr int kd_keys = 64;       // keys per chunk: two threads per key
constexpr int kd_threads = 128;   // 4 warps
constexpr int kd_warps = kd_threads / 32;
constexpr int kd_batch = 4;       // 16-byte pieces of K (and of V) a thread loads before storing them

// Shared memory (bytes): q_s [kd_rows][hd + 4] f32 (the upper half of each row 4 floats on, so
// the two halves of a key read different banks), k_s [kd_keys][hd + 16] bf16 (the upper half 8
// on), v_s [kd_keys][hd] bf16, p_s [kd_keys][kd_rows] f32, red_s [2][kd_warps][kd_rows] f32. At
// the end the classes' partial sums, [classes][kd_rows][hd] f32 = 8 KB, reuse k_s + v_s.
// stages: 1 (key_threads), or 2 (pipelined: k_s and v_s twice, chunk c + 1 in flight while c is
// computed).
size_t decode_smem_bytes(int hd, int stages) {
  return sizeof(float) * kd_rows * (hd + 4) +
         stages * (2 * static_cast<size_t>(kd_keys) * (hd + 16) + 2 * static_cast<size_t>(kd_keys) * hd) +
         sizeof(float) * kd_keys * kd_rows + sizeof(float) * 2 * kd_warps * kd_rows;
}

// Which sequence and which of its key splits a decode block (or a merge block) works on.
struct SeqSplit {
  int b;                     // the sequence: its q/out rows from b · num_tokens · num_heads, its positions from b · num_tokens
  const PagedKvHead* heads;  // its view's heads
  int64_t splits, keys, split;
  int64_t ws_row0;  // its partials' first row in the workspace (state and acc)
};
// attention_paged_cuda: one view; blockIdx.z is the split (the merge: one sequence).
struct OneSeq {
  int64_t splits, keys;
  __device__ SeqSplit at(const PagedKvCuda& kv) const { return {0, kv.heads, splits, keys, blockIdx.z, 0}; }
  __device__ SeqSplit merge_at() const { return {0, nullptr, splits, keys, 0, 0}; }
};
// attention_decode_rows_cuda: sequence b's splits are blocks split_begin[b] .. split_begin[b + 1]
// − 1 along z (the merge: sequence blockIdx.y).
constexpr int k_seqs = 64;
struct RowSeqs {
  int32_t count;
  int32_t split_begin[k_seqs + 1];
  int32_t keys[k_seqs];
  int64_t ws_row0[k_seqs];
  const PagedKvHead* heads[k_seqs];
  __device__ SeqSplit at(const PagedKvCuda&) const {
    const int z = static_cast<int>(blockIdx.z);
    int lo = 0, hi = count - 1;  // the last b with split_begin[b] <= z
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (split_begin[mid] <= z)
        lo = mid;
      else
        hi = mid - 1;
    }
    return {lo, heads[lo], split_begin[lo + 1] - split_begin[lo], keys[lo], z - split_begin[lo], ws_row0[lo]};
  }
  __device__ SeqSplit merge_at() const {
    const int b = static_cast<int>(blockIdx.y);
    return {b, heads[b], split_begin[b + 1] - split_begin[b], keys[b], 0, ws_row0[b]};
  }
};
}  // namespace

// kPipelined (DecodeAttention::pipelined; needs vec): K and V come by cp.async into two stages,
// chunk c + 1's copies in flight while chunk c is scored, so the loads no longer wait behind the
// arithmetic; the same operations in the same order on the same values: the same bits.
// Seqs: OneSeq (one view, kv_in's heads) or RowSeqs (a batch of sequences, one decode row each:
// the block finds its sequence, and from there runs exactly what that sequence's own launch runs).
template <int kDims, bool kPipelined, class Seqs>
__global__ void __launch_bounds__(kd_threads, 4)
    attention_decode_kernel(const float* q, const int32_t* q_positions, int64_t num_tokens, PagedKvCuda kv_in,
                            AttentionParams p, Seqs seqs, bool vec, float* out, float* ws_state, float* ws_acc) {
  constexpr int hd = kDims * 32, half = hd / 2;
  constexpr int qs = hd + 4;                           // q_s row stride, floats
  constexpr int ks = hd + 16;                          // k_s row stride, bf16
  constexpr int pairs = hd / 2;                        // p·V: one bf16 pair of dims per thread ...
  constexpr int classes = kd_threads / pairs;          // ... and one class of keys (≥ 1: hd ≤ 256)
  constexpr int pieces = kd_keys * hd / 8 / kd_threads;  // 16-byte pieces of K (and of V) per thread
  extern __shared__ float dsmem[];
  float* q_s = dsmem;
  constexpr int stages = kPipelined ? 2 : 1;
  constexpr int stage = kd_keys * ks + kd_keys * hd;  // one stage's K then V, in bf16 elements
  unsigned short* const kv_s = reinterpret_cast<unsigned short*>(q_s + kd_rows * qs);
  float* p_s = reinterpret_cast<float*>(kv_s + stages * stage);
  float* red_s = p_s + kd_keys * kd_rows;
  float* acc_s = reinterpret_cast<float*>(kv_s);
  __shared__ int64_t lo_s[kd_rows], hi_s[kd_rows];
  __shared__ int64_t range_s[2];
  __shared__ float ml_s[2 * kd_rows];

  const SeqSplit at = seqs.at(kv_in);
  PagedKvCuda kv = kv_in;
  kv.heads = at.heads;
  const int64_t splits = at.splits, split_keys = at.keys;
  q += at.b * num_tokens * p.num_heads * hd;
  q_positions += at.b * num_tokens;
  out += at.b * num_tokens * p.num_heads * hd;
  if (splits > 1) {
    ws_state += 2 * at.ws_row0;
    ws_acc += at.ws_row0 * hd;
  }

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const paged::BlockSpan span = paged::block_span(kv, p, num_tokens, kd_rows, splits, split_keys, at.split);
  const auto [group, g, nrows, split, r0, kb, ke, head] = span;

  paged::span_visible(kv, span, q_positions, p.sliding_window, tid, nrows, lo_s, hi_s);  // within [kb, ke)
  for (int idx = tid; idx < nrows * hd; idx += kd_threads) {
    const int rr = idx / hd, i = idx % hd;
    q_s[rr * qs + i + (i < half ? 0 : 4)] = q[paged::span_row(span, p.num_heads, rr) * hd + i] * p.scale;
  }
  __syncthreads();
  if (tid == 0) paged::range_union(lo_s, hi_s, 0, nrows, &range_s[0], &range_s[1]);
  __syncthreads();
  const int64_t lo_all = range_s[0], hi_all = range_s[1];

  float m[kd_rows], l[kd_rows], acc[kd_rows][2];
#pragma unroll
  for (int r = 0; r < kd_rows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    acc[r][0] = acc[r][1] = 0.0f;
  }
  const int kj = tid >> 1, hf = tid & 1;              // scoring: key kj of the chunk, half hf
  const int cls = tid / pairs, d0 = (tid % pairs) * 2;  // p·V: dims d0, d0 + 1, keys of class cls
  const bool pv_thread = cls < classes;

  // Pipelined: chunk j0's K and V pieces by cp.async into stage `st` (one commit group).
  const PagedKvHead& fetch_head = span.head;  // (a lambda may not capture a structured binding before C++20)
  const auto fetch = [&](int64_t j0, int st) {
    const int n = static_cast<int>(hi_all - j0 < kd_keys ? hi_all - j0 : kd_keys);
    unsigned short* k_dst = kv_s + st * stage;
    unsigned short* v_dst = k_dst + kd_keys * ks;
#pragma unroll
    for (int u = 0; u < pieces; ++u) {
      const int idx = tid + u * kd_threads, jj = idx / (hd / 8), c = (idx % (hd / 8)) * 8;
      if (jj < n) {
        const paged::KvRows rows = paged::kv_rows(kv, fetch_head, j0 + jj, hd);
        ptx::cp_async_16(k_dst + jj * ks + c + (c < half ? 0 : 8), rows.k + c, true);
        ptx::cp_async_16(v_dst + jj * hd + c, rows.v + c, true);
      }
    }
    ptx::cp_async_commit();
  };
  const int64_t j_first = lo_all - lo_all % kd_keys;
  if (kPipelined && j_first < hi_all) fetch(j_first, 0);

  for (int64_t j0 = j_first, chunk = 0; j0 < hi_all; j0 += kd_keys, ++chunk) {
    const int n = static_cast<int>(hi_all - j0 < kd_keys ? hi_all - j0 : kd_keys);
    unsigned short* const k_s = kv_s + (kPipelined ? (chunk & 1) * stage : 0);
    unsigned short* const v_s = k_s + kd_keys * ks;
    // 1. K and V of keys j0 .. j0 + n - 1 into shared memory. Pipelined: the next chunk's
    //    copies go out into the other stage (free: every thread passed the previous chunk's
    //    last barrier), then this thread waits for its own part of this chunk; the barrier
    //    below makes every part visible. Else in rounds of kd_batch 16-byte pieces of each: a
    //    round's loads are all issued before its first store.
    if constexpr (kPipelined) {
      if (j0 + kd_keys < hi_all) {
        fetch(j0 + kd_keys, static_cast<int>((chunk + 1) & 1));
        ptx::cp_async_wait<1>();
      } else {
        ptx::cp_async_wait<0>();
      }
    } else if (vec) {
      constexpr int batch = pieces < kd_batch ? pieces : kd_batch;
#pragma unroll 1
      for (int u0 = 0; u0 < pieces; u0 += batch) {
        uint4 kr[batch], vr[batch];
#pragma unroll
        for (int u = 0; u < batch; ++u) {
          const int idx = tid + (u0 + u) * kd_threads, jj = idx / (hd / 8);
          if (jj < n) paged::kv_piece(kv, head, j0 + jj, hd, (idx % (hd / 8)) * 8, &kr[u], &vr[u]);
        }
#pragma unroll
        for (int u = 0; u < batch; ++u) {
          const int idx = tid + (u0 + u) * kd_threads, jj = idx / (hd / 8), c = (idx % (hd / 8)) * 8;
          if (jj < n) {
            *reinterpret_cast<uint4*>(k_s + jj * ks + c + (c < half ? 0 : 8)) = kr[u];
            *reinterpret_cast<uint4*>(v_s + jj * hd + c) = vr[u];
          }
        }
      }
    } else {  // K/V rows not 16-byte aligned: the same bf16 values, two bytes at a time
      for (int idx = tid; idx < n * hd; idx += kd_threads) {
        const int jj = idx / hd, i = idx % hd;
        const paged::KvRows rows = paged::kv_rows(kv, head, j0 + jj, hd);
        k_s[jj * ks + i + (i < half ? 0 : 8)] = reinterpret_cast<const unsigned short*>(rows.k)[i];
        v_s[jj * hd + i] = reinterpret_cast<const unsigned short*>(rows.v)[i];
      }
    }
    // Each row's visible part of this chunk, [ra, rb) in chunk offsets (empty: ra == rb).
    int ra[kd_rows], rb[kd_rows];
#pragma unroll
    for (int r = 0; r < kd_rows; ++r) {
      ra[r] = rb[r] = 0;
      if (r < nrows) {
        const int64_t a = lo_s[r] > j0 ? lo_s[r] : j0;
        const int64_t b = hi_s[r] < j0 + n ? hi_s[r] : j0 + n;
        if (a < b) {
          ra[r] = static_cast<int>(a - j0);
          rb[r] = static_cast<int>(b - j0);
        }
      }
    }
    __syncthreads();

    // 2. Scores: this thread's half of key kj against every row; the pair adds the halves.
    float sc[kd_rows];
    {
      float part[kd_rows];
#pragma unroll
      for (int r = 0; r < kd_rows; ++r) part[r] = 0.0f;
      if (kj < n) {
        const unsigned short* kr = k_s + kj * ks + hf * (half + 8);
        const float* qh = q_s + hf * (half + 4);
#pragma unroll 1
        for (int i = 0; i < half; i += 8) {
          const uint4 raw = *reinterpret_cast<const uint4*>(kr + i);
          const unsigned kw[4] = {raw.x, raw.y, raw.z, raw.w};
          float kf[8];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            kf[2 * e] = __uint_as_float(kw[e] << 16);
            kf[2 * e + 1] = __uint_as_float(kw[e] & 0xffff0000u);
          }
#pragma unroll
          for (int r = 0; r < kd_rows; ++r) {
            if (r < nrows) {
              const float4 a = *reinterpret_cast<const float4*>(qh + r * qs + i);
              const float4 b = *reinterpret_cast<const float4*>(qh + r * qs + i + 4);
              float d = part[r];
              d = fmaf(a.x, kf[0], d);
              d = fmaf(a.y, kf[1], d);
              d = fmaf(a.z, kf[2], d);
              d = fmaf(a.w, kf[3], d);
              d = fmaf(b.x, kf[4], d);
              d = fmaf(b.y, kf[5], d);
              d = fmaf(b.z, kf[6], d);
              d = fmaf(b.w, kf[7], d);
              part[r] = d;
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kd_rows; ++r) {
        const float whole = part[r] + __shfl_xor_sync(0xffffffffu, part[r], 1);  // lo + hi == hi + lo
        sc[r] = kj >= ra[r] && kj < rb[r] ? whole : -INFINITY;
      }
    }
#pragma unroll
    for (int r = 0; r < kd_rows; ++r) {
      if (r < nrows) {  // uniform: every warp reaches these shuffles
        const float wm = warp_max(sc[r]);
        if (lane == 0) red_s[warp * kd_rows + r] = wm;
      }
    }
    __syncthreads();

    // 3. Per row: the chunk's max (warps in order), the new running max, the weights and their sum.
    float f[kd_rows];
#pragma unroll
    for (int r = 0; r < kd_rows; ++r) {
      f[r] = 1.0f;
      if (r < nrows) {
        float cm = red_s[r];
#pragma unroll
        for (int w = 1; w < kd_warps; ++w) cm = fmaxf(cm, red_s[w * kd_rows + r]);
        const bool seen = ra[r] < rb[r];  // no key of this chunk: the row's state stays exactly as it was
        const float m_new = seen ? fmaxf(m[r], cm) : m[r];
        if (seen) f[r] = expf(m[r] - m_new);  // 0 on the row's first keys (m was -inf)
        const float pj = sc[r] > -INFINITY ? expf(sc[r] - m_new) : 0.0f;
        m[r] = m_new;
        if (hf == 0 && kj < n) p_s[kj * kd_rows + r] = pj;
        const float ws = warp_sum(hf == 0 ? pj : 0.0f);  // each key once
        if (lane == 0) red_s[(kd_warps + warp) * kd_rows + r] = ws;
      }
    }
    __syncthreads();

    // 4. l, and acc += p·V over this thread's keys of the chunk (ascending), per row.
#pragma unroll
    for (int r = 0; r < kd_rows; ++r) {
      if (r < nrows && ra[r] < rb[r]) {
        float sum = red_s[kd_warps * kd_rows + r];
#pragma unroll
        for (int w = 1; w < kd_warps; ++w) sum += red_s[(kd_warps + w) * kd_rows + r];
        l[r] = l[r] * f[r] + sum;
        acc[r][0] *= f[r];
        acc[r][1] *= f[r];
      }
    }
    if (pv_thread) {
      for (int jj = cls; jj < n; jj += classes) {
        const unsigned vw = *reinterpret_cast<const unsigned*>(v_s + jj * hd + d0);
        const float v0 = __uint_as_float(vw << 16), v1 = __uint_as_float(vw & 0xffff0000u);
        // The key's weights for rows 0-3 (and 4-7) in one broadcast 16-byte read each.
        const float4 pa = *reinterpret_cast<const float4*>(p_s + jj * kd_rows);
        const float4 pb = nrows > 4 ? *reinterpret_cast<const float4*>(p_s + jj * kd_rows + 4) : make_float4(0, 0, 0, 0);
        const float pw[kd_rows] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
        for (int r = 0; r < kd_rows; ++r) {
          if (r < nrows && jj >= ra[r] && jj < rb[r]) {
            acc[r][0] = fmaf(pw[r], v0, acc[r][0]);
            acc[r][1] = fmaf(pw[r], v1, acc[r][1]);
          }
        }
      }
    }
    __syncthreads();
  }

  // 5. The classes' partial sums, added in class order; out (one split) or the split's partials.
  if (pv_thread) {
#pragma unroll
    for (int r = 0; r < kd_rows; ++r)
      if (r < nrows) {
        acc_s[(cls * kd_rows + r) * hd + d0] = acc[r][0];
        acc_s[(cls * kd_rows + r) * hd + d0 + 1] = acc[r][1];
      }
  }
  if (tid == 0) {
#pragma unroll
    for (int r = 0; r < kd_rows; ++r) {
      ml_s[2 * r] = m[r];
      ml_s[2 * r + 1] = l[r];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < nrows * hd; idx += kd_threads) {
    const int rr = idx / hd, d = idx % hd;
    float a = acc_s[rr * hd + d];
#pragma unroll
    for (int c = 1; c < classes; ++c) a += acc_s[(c * kd_rows + rr) * hd + d];
    const int64_t row = paged::span_row(span, p.num_heads, rr);
    const float lr = ml_s[2 * rr + 1];
    if (splits == 1) {
      out[row * hd + d] = a * (lr > 0.0f ? 1.0f / lr : 0.0f);  // no visible key: zeros
    } else {
      const int64_t srow = split * num_tokens * p.num_heads + row;
      ws_acc[srow * hd + d] = a;
      if (d == 0) {
        ws_state[2 * srow] = ml_s[2 * rr];
        ws_state[2 * srow + 1] = lr;
      }
    }
  }
}

// out = Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s, M = max_s m_s, in split order; zeros
// when no split saw a key. One block per (token, head), one thread per dim (head_dim ≤ 256).
// Latency, not bandwidth, is its cost (a few MB at 128K keys), so nothing waits on one load at
// a time: the threads find M over the splits together (a block max), each tile of blockDim
// splits has its weights e^(m_s − M) computed once into shared memory, and each thread reads
// its acc_s eight at a time before adding them in split order — the same operations in the
// same order as a one-split-at-a-time loop, so the same bits.
// Seqs as the decode kernel's: the block merges row blockIdx.x of its sequence (RowSeqs: of
// sequence blockIdx.y, whose partials start at its ws_row0; nothing to do where it has one split).
template <class Seqs>
__global__ void attention_merge_kernel(const float* ws_state, const float* ws_acc, Seqs seqs, int64_t rows,
                                       int head_dim, float* out) {
  __shared__ float warp_mx[8];
  __shared__ float w_s[256], l_s[256];
  const SeqSplit at = seqs.merge_at();
  const int64_t splits = at.splits;
  if (splits <= 1) return;  // the whole block: its row went straight to out
  ws_state += 2 * at.ws_row0;
  ws_acc += at.ws_row0 * head_dim;
  out += at.b * rows * head_dim;
  const int64_t row = blockIdx.x;
  const int d = threadIdx.x, nt = blockDim.x;
  float mx = -INFINITY;
  for (int64_t s = d; s < splits; s += nt) mx = fmaxf(mx, ws_state[2 * (s * rows + row)]);
  mx = warp_max(mx);
  if ((d & 31) == 0) warp_mx[d >> 5] = mx;
  __syncthreads();
  mx = warp_mx[0];
  for (int w = 1; w < nt / 32; ++w) mx = fmaxf(mx, warp_mx[w]);
  float num = 0.0f, den = 0.0f;
  if (mx > -INFINITY) {  // the same on every thread
    for (int64_t s0 = 0; s0 < splits; s0 += nt) {
      const int n = static_cast<int>(splits - s0 < nt ? splits - s0 : nt);
      __syncthreads();  // the previous tile's weights are used up
      if (d < n) {
        const float* st = ws_state + 2 * ((s0 + d) * rows + row);
        w_s[d] = expf(st[0] - mx);
        l_s[d] = st[1];
      }
      __syncthreads();
      const float* acc = ws_acc + (s0 * rows + row) * head_dim + d;  // split s0 + i at acc[i · rows · head_dim]
      const int64_t step = rows * head_dim;
      int i = 0;
      for (; i + 8 <= n; i += 8) {
        float a[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] = acc[(i + k) * step];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          num += w_s[i + k] * a[k];
          den += w_s[i + k] * l_s[i + k];
        }
      }
      for (; i < n; ++i) {
        num += w_s[i] * acc[i * step];
        den += w_s[i] * l_s[i];
      }
    }
  }
  out[row * head_dim + d] = den > 0.0f ? num / den : 0.0f;
}

namespace {
// 16-byte K/V loads where every row starts 16-byte aligned (the device pool's views do).
bool vec_rows(const PagedKvCuda& kv) {
  return kv.k_block_stride % 8 == 0 && kv.v_block_stride % 8 == 0 && reinterpret_cast<uintptr_t>(kv.k_base) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(kv.v_base) % 16 == 0;
}

// The decode form's attention_decode_kernel over `seqs` (pipelined: its cp.async form, where the
// K/V rows allow 16-byte copies), z_blocks split blocks along z.
template <int kDims, class Seqs>
void launch_decode(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKvCuda& kv,
                   const AttentionParams& p, const Seqs& seqs, int64_t z_blocks, bool pipelined, float* out,
                   float* ws_state, float* ws_acc, cudaStream_t stream) {
  const bool vec = vec_rows(kv);
  pipelined = pipelined && vec;
  const size_t smem = decode_smem_bytes(kDims * 32, pipelined ? 2 : 1);
  // Above the 48 KiB default (head_dim > 128, or pipelined) the kernel must opt in (sm_80: up to 163 KiB).
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(pipelined ? attention_decode_kernel<kDims, true, Seqs> : attention_decode_kernel<kDims, false, Seqs>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const int64_t rows_total = num_tokens * (p.num_heads / p.num_kv_heads);
  const dim3 grid(static_cast<unsigned>((rows_total + kd_rows - 1) / kd_rows), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(z_blocks));
  if (pipelined)
    attention_decode_kernel<kDims, true, Seqs><<<grid, kd_threads, smem, stream>>>(q, q_positions, num_tokens, kv, p, seqs,
                                                                                  vec, out, ws_state, ws_acc);
  else
    attention_decode_kernel<kDims, false, Seqs><<<grid, kd_threads, smem, stream>>>(q, q_positions, num_tokens, kv, p,
                                                                                   seqs, vec, out, ws_state, ws_acc);
}

// key_threads: the decode kernel; otherwise attention_paged_kernel.
template <int kDims>
void launch(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKvCuda& kv,
            const AttentionParams& p, const AttentionSplit& split, bool key_threads, bool pipelined, float* out,
            float* ws_state, float* ws_acc, cudaStream_t stream) {
  if (key_threads) {
    launch_decode<kDims>(q, q_positions, num_tokens, kv, p, OneSeq{split.splits, split.keys}, split.splits, pipelined,
                         out, ws_state, ws_acc, stream);
    return;
  }
  const size_t smem = smem_bytes(kDims * 32);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(attention_paged_kernel<kDims>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  const int64_t rows_total = num_tokens * (p.num_heads / p.num_kv_heads);
  const dim3 grid(static_cast<unsigned>((rows_total + k_rows - 1) / k_rows), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(split.splits));
  attention_paged_kernel<kDims><<<grid, k_warps * 32, smem, stream>>>(q, q_positions, num_tokens, kv, p, split.splits,
                                                                     split.keys, vec_rows(kv), out, ws_state, ws_acc);
}

bool shape_supported(const AttentionParams& p, int block_size) {
  return p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0 && p.head_dim % 32 == 0 && p.head_dim >= 32 &&
         p.head_dim <= 256 && block_size > 0;
}
}  // namespace

cudaError_t attention_paged_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                 const PagedKvCuda& kv, const AttentionParams& p, float* out, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream, DecodeAttention decode) {
  if (num_tokens <= 0) return cudaSuccess;
  if (!shape_supported(p, kv.block_size)) return cudaErrorInvalidValue;
  const AttentionSplit split = attention_split(num_tokens, p, kv.max_length);
  const int64_t splits = split.splits;
  if (workspace_bytes < attention_paged_cuda_workspace_bytes(num_tokens, p, kv.max_length) ||
      splits > 65535)  // grid z: 33.5M keys per head
    return cudaErrorInvalidValue;
  float* ws_state = splits > 1 ? static_cast<float*>(workspace) : nullptr;
  float* ws_acc = splits > 1 ? ws_state + 2 * splits * num_tokens * p.num_heads : nullptr;
  const bool key_threads = decode != DecodeAttention::row_warps && attention_decode_form(num_tokens, p);
  const bool pipelined = decode == DecodeAttention::pipelined;
  switch (p.head_dim / 32) {
    case 1: launch<1>(q, q_positions, num_tokens, kv, p, split, key_threads, pipelined, out, ws_state, ws_acc, stream); break;
    case 2: launch<2>(q, q_positions, num_tokens, kv, p, split, key_threads, pipelined, out, ws_state, ws_acc, stream); break;
    case 3: launch<3>(q, q_positions, num_tokens, kv, p, split, key_threads, pipelined, out, ws_state, ws_acc, stream); break;
    case 4: launch<4>(q, q_positions, num_tokens, kv, p, split, key_threads, pipelined, out, ws_state, ws_acc, stream); break;
    case 5: launch<5>(q, q_positions, num_tokens, kv, p, split, key_threads, pipelined, out, ws_state, ws_acc, stream); break;
    case 6: launch<6>(q, q_positions, num_tokens, kv, p, split, key_threads, pipelined, out, ws_state, ws_acc, stream); break;
    case 7: launch<7>(q, q_positions, num_tokens, kv, p, split, key_threads, pipelined, out, ws_state, ws_acc, stream); break;
    case 8: launch<8>(q, q_positions, num_tokens, kv, p, split, key_threads, pipelined, out, ws_state, ws_acc, stream); break;
  }
  if (splits > 1) {
    const int64_t rows = num_tokens * p.num_heads;
    attention_merge_kernel<OneSeq><<<static_cast<unsigned>(rows), p.head_dim, 0, stream>>>(
        ws_state, ws_acc, OneSeq{splits, split.keys}, rows, p.head_dim, out);
  }
  return cudaGetLastError();
}

cudaError_t attention_decode_rows_cuda(const float* q, const int32_t* q_positions, int64_t num_rows,
                                       const PagedKvCuda* views, const AttentionParams& p, float* out,
                                       void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                       DecodeAttention decode) {
  if (num_rows <= 0) return cudaSuccess;
  const PagedKvCuda& kv = views[0];  // the slabs every row's view shares
  if (!shape_supported(p, kv.block_size) || !attention_views_share_slabs(views, num_rows)) return cudaErrorInvalidValue;
  for (int64_t b = 0; b < num_rows; ++b)
    if (attention_split(1, p, views[b].max_length).splits > 65535) return cudaErrorInvalidValue;
  if (workspace_bytes < attention_decode_rows_workspace_bytes(num_rows, views, p)) return cudaErrorInvalidValue;
  const int64_t qd = int64_t{p.num_heads} * p.head_dim;
  // Every row's partials in row order: all the states [2 · rows], then all the accumulators.
  int64_t ws_rows = 0;
  for (int64_t b = 0; b < num_rows; ++b) {
    const int64_t splits = attention_split(1, p, views[b].max_length).splits;
    ws_rows += splits > 1 ? splits * p.num_heads : 0;
  }
  float* ws_state = ws_rows > 0 ? static_cast<float*>(workspace) : nullptr;
  float* ws_acc = ws_rows > 0 ? ws_state + 2 * ws_rows : nullptr;
  if (decode == DecodeAttention::row_warps || !attention_decode_form(1, p)) {  // row by row, as attention_paged_cuda
    int64_t row0 = 0;
    for (int64_t b = 0; b < num_rows; ++b) {
      const AttentionSplit split = attention_split(1, p, views[b].max_length);
      const int64_t splits = split.splits;
      float* st = splits > 1 ? ws_state + 2 * row0 : nullptr;
      float* acc = splits > 1 ? ws_acc + row0 * p.head_dim : nullptr;
      switch (p.head_dim / 32) {
#define SNAP_ROW(D) \
  case D: launch<D>(q + b * qd, q_positions + b, 1, views[b], p, split, false, false, out + b * qd, st, acc, stream); break;
        SNAP_ROW(1) SNAP_ROW(2) SNAP_ROW(3) SNAP_ROW(4) SNAP_ROW(5) SNAP_ROW(6) SNAP_ROW(7) SNAP_ROW(8)
#undef SNAP_ROW
      }
      if (splits > 1)
        attention_merge_kernel<OneSeq><<<static_cast<unsigned>(p.num_heads), p.head_dim, 0, stream>>>(
            st, acc, OneSeq{splits, split.keys}, p.num_heads, p.head_dim, out + b * qd);
      row0 += splits > 1 ? splits * p.num_heads : 0;
    }
    return cudaGetLastError();
  }
  const bool pipelined = decode == DecodeAttention::pipelined;
  int64_t row0 = 0;  // the next row's first partial row
  for (int64_t b0 = 0; b0 < num_rows;) {
    // Rows b0.. while there is room in the arguments and along z.
    RowSeqs seqs{};
    seqs.split_begin[0] = 0;
    int64_t b = b0;
    for (; b < num_rows && seqs.count < k_seqs; ++b) {
      const AttentionSplit split = attention_split(1, p, views[b].max_length);
      if (seqs.split_begin[seqs.count] + split.splits > 65535) break;
      seqs.heads[seqs.count] = views[b].heads;
      seqs.keys[seqs.count] = static_cast<int32_t>(split.keys);
      seqs.ws_row0[seqs.count] = row0;
      seqs.split_begin[seqs.count + 1] = static_cast<int32_t>(seqs.split_begin[seqs.count] + split.splits);
      row0 += split.splits > 1 ? split.splits * p.num_heads : 0;
      ++seqs.count;
    }
    const int64_t z = seqs.split_begin[seqs.count];
    switch (p.head_dim / 32) {
#define SNAP_ROWS(D)                                                                                                 \
  case D:                                                                                                            \
    launch_decode<D>(q + b0 * qd, q_positions + b0, 1, kv, p, seqs, z, pipelined, out + b0 * qd, ws_state, ws_acc, \
                     stream);                                                                                        \
    break;
      SNAP_ROWS(1) SNAP_ROWS(2) SNAP_ROWS(3) SNAP_ROWS(4) SNAP_ROWS(5) SNAP_ROWS(6) SNAP_ROWS(7) SNAP_ROWS(8)
#undef SNAP_ROWS
    }
    if (z > seqs.count)  // some row has several splits
      attention_merge_kernel<RowSeqs><<<dim3(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(seqs.count)), p.head_dim, 0,
                               stream>>>(ws_state, ws_acc, seqs, p.num_heads, p.head_dim, out + b0 * qd);
    b0 = b;
  }
  return cudaGetLastError();
}

}  // namespace snap::kernels
