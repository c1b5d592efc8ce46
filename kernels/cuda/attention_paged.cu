// CUDA twin of attention_paged_cpu: causal GQA attention over the paged per-KV-head cache
// (bf16 K/V, f32 q/out, f32 accumulation), FlashAttention-style: tiled online softmax, no
// N×N matrix anywhere.
//   Block = 16 query rows (t, h) of one KV head g (the rows of a GQA group share every K/V
//   load) × one key split; 4 warps, each owning 4 rows. Keys stream through shared memory in
//   chunks of 32 (K padded to head_dim + 1 floats so lane j reading key j is conflict-free);
//   lane j scores key j, the warp's max/sum give the online-softmax update, and each lane
//   accumulates head_dim / 32 output dims (V reads are consecutive across lanes).
//   Prefill: many rows, one split (prompt chunks normally take attention_prefill_tc.cu).
//   Decode (≤ 64 rows per KV head): each head's keys are cut into splits of attention_split's
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
  const int group = p.num_heads / p.num_kv_heads;
  const int g = blockIdx.y;
  const int64_t split = blockIdx.z;
  const int64_t rows_total = num_tokens * group;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * k_rows;
  const int nrows = static_cast<int>(rows_total - r0 < k_rows ? rows_total - r0 : k_rows);
  const PagedKvHead head = kv.heads[g];
  const int64_t kb = splits > 1 ? split * split_keys : 0;
  const int64_t ke = splits > 1 ? (kb + split_keys < head.length ? kb + split_keys : head.length) : head.length;

  if (tid < nrows) {  // this row's visible keys within [kb, ke)
    const int64_t t = (r0 + tid) / group;
    const int32_t qp = q_positions[t];
    int64_t hi = paged::first_above(kv, head, qp);
    int64_t lo = p.sliding_window > 0 ? paged::first_above(kv, head, static_cast<int64_t>(qp) - p.sliding_window) : 0;
    lo = lo > kb ? lo : kb;
    hi = hi < ke ? hi : ke;
    lo_s[tid] = lo;
    hi_s[tid] = hi > lo ? hi : lo;
  }
  for (int idx = tid; idx < nrows * hd; idx += blockDim.x) {
    const int rr = idx / hd, i = idx % hd;
    const int64_t r = r0 + rr;
    const int64_t t = r / group;
    const int h = g * group + static_cast<int>(r % group);
    q_s[idx] = q[(t * p.num_heads + h) * hd + i] * p.scale;
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
        if (idx < n * (hd / 8)) {
          const int jj = idx / (hd / 8), i = (idx % (hd / 8)) * 8;
          const int64_t j = j0 + jj;
          const int64_t blk = head.block_table[j / kv.block_size], slot = j % kv.block_size;
          kr[u] = *reinterpret_cast<const uint4*>(kv.k_base + blk * kv.k_block_stride + slot * hd + i);
          vr[u] = *reinterpret_cast<const uint4*>(kv.v_base + blk * kv.v_block_stride + slot * hd + i);
        }
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
        const int64_t blk = head.block_table[j / kv.block_size], slot = j % kv.block_size;
        k_s[jj * (hd + 1) + i] = __bfloat162float(kv.k_base[blk * kv.k_block_stride + slot * hd + i]);
        v_s[jj * hd + i] = __bfloat162float(kv.v_base[blk * kv.v_block_stride + slot * hd + i]);
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
    const int64_t r = r0 + rr;
    const int64_t t = r / group;
    const int h = g * group + static_cast<int>(r % group);
    const int64_t row = t * p.num_heads + h;
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

// out = Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s, M = max_s m_s, in split order; zeros
// when no split saw a key. One block per (token, head), one thread per dim.
__global__ void attention_merge_kernel(const float* ws_state, const float* ws_acc, int64_t splits, int64_t rows,
                                       int head_dim, float* out) {
  const int64_t row = blockIdx.x;
  const int d = threadIdx.x;
  float mx = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) mx = fmaxf(mx, ws_state[2 * (s * rows + row)]);
  float num = 0.0f, den = 0.0f;
  if (mx > -INFINITY) {
    for (int64_t s = 0; s < splits; ++s) {
      const float w = expf(ws_state[2 * (s * rows + row)] - mx);
      num += w * ws_acc[(s * rows + row) * head_dim + d];
      den += w * ws_state[2 * (s * rows + row) + 1];
    }
  }
  out[row * head_dim + d] = den > 0.0f ? num / den : 0.0f;
}

size_t attention_paged_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, int64_t max_length) {
  const int64_t splits = attention_split(num_tokens, p, max_length).splits;
  if (splits <= 1) return 0;
  return sizeof(float) * static_cast<size_t>(splits * num_tokens * p.num_heads) * (2 + static_cast<size_t>(p.head_dim));
}

namespace {
template <int kDims>
void launch(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKvCuda& kv,
            const AttentionParams& p, const AttentionSplit& split, float* out, float* ws_state, float* ws_acc,
            cudaStream_t stream) {
  const size_t smem = smem_bytes(kDims * 32);
  // Above the 48 KiB default (head_dim > 128) the kernel must opt in (sm_80: up to 163 KiB).
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(attention_paged_kernel<kDims>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  const int64_t rows_total = num_tokens * (p.num_heads / p.num_kv_heads);
  const dim3 grid(static_cast<unsigned>((rows_total + k_rows - 1) / k_rows), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(split.splits));
  // 16-byte K/V loads where every row starts 16-byte aligned (the device pool's views do).
  const bool vec = kv.k_block_stride % 8 == 0 && kv.v_block_stride % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(kv.k_base) % 16 == 0 && reinterpret_cast<uintptr_t>(kv.v_base) % 16 == 0;
  attention_paged_kernel<kDims><<<grid, k_warps * 32, smem, stream>>>(q, q_positions, num_tokens, kv, p, split.splits,
                                                                     split.keys, vec, out, ws_state, ws_acc);
}
}  // namespace

cudaError_t attention_paged_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                 const PagedKvCuda& kv, const AttentionParams& p, float* out, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.head_dim % 32 != 0 || p.head_dim < 32 ||
      p.head_dim > 256 || kv.block_size <= 0)
    return cudaErrorInvalidValue;
  const AttentionSplit split = attention_split(num_tokens, p, kv.max_length);
  const int64_t splits = split.splits;
  if (workspace_bytes < attention_paged_cuda_workspace_bytes(num_tokens, p, kv.max_length) ||
      splits > 65535)  // grid z: 33.5M keys per head
    return cudaErrorInvalidValue;
  float* ws_state = splits > 1 ? static_cast<float*>(workspace) : nullptr;
  float* ws_acc = splits > 1 ? ws_state + 2 * splits * num_tokens * p.num_heads : nullptr;
  switch (p.head_dim / 32) {
    case 1: launch<1>(q, q_positions, num_tokens, kv, p, split, out, ws_state, ws_acc, stream); break;
    case 2: launch<2>(q, q_positions, num_tokens, kv, p, split, out, ws_state, ws_acc, stream); break;
    case 3: launch<3>(q, q_positions, num_tokens, kv, p, split, out, ws_state, ws_acc, stream); break;
    case 4: launch<4>(q, q_positions, num_tokens, kv, p, split, out, ws_state, ws_acc, stream); break;
    case 5: launch<5>(q, q_positions, num_tokens, kv, p, split, out, ws_state, ws_acc, stream); break;
    case 6: launch<6>(q, q_positions, num_tokens, kv, p, split, out, ws_state, ws_acc, stream); break;
    case 7: launch<7>(q, q_positions, num_tokens, kv, p, split, out, ws_state, ws_acc, stream); break;
    case 8: launch<8>(q, q_positions, num_tokens, kv, p, split, out, ws_state, ws_acc, stream); break;
  }
  if (splits > 1) {
    const int64_t rows = num_tokens * p.num_heads;
    attention_merge_kernel<<<static_cast<unsigned>(rows), p.head_dim, 0, stream>>>(ws_state, ws_acc, splits, rows,
                                                                                  p.head_dim, out);
  }
  return cudaGetLastError();
}

}  // namespace snap::kernels
