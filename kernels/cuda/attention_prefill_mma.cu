// The FlashAttention-2-class prompt kernel (attention_prefill_mma_cuda in kernels_cuda.h):
// causal GQA attention of prompt chunks over the paged per-KV-head cache, on mma.sync m16n8k16
// bf16 MMAs with f32 accumulation (ptx.cuh), everything of a row in registers.
//   Block = 64 query rows (t, h) of one KV head g, 4 warps of 16 rows each (or 128 rows, 8 warps:
//   attention_prefill_mma_cuda's `warps`), so the rows of a GQA group share every K/V load. Keys stream through shared memory in aligned chunks of 64,
//   double-buffered: cp.async fetches chunk c + 1 (16-byte pieces through the head's block
//   table, zeros past the last key any row sees) while the warps compute on chunk c. Per chunk
//   a warp computes S = Q·Kᵀ (16 × 64) into registers (Q from registers, K through ldmatrix),
//   runs the online softmax on its registers (a row's 64 scores are spread over the 4 lanes of
//   its MMA group: two shuffles for a max), rescales O, converts the weights P into the A
//   operand of the next MMA in registers — an m16n8k16 accumulator pair is an A fragment — and
//   adds P·V (V through ldmatrix.trans). No S or P in shared memory, no barrier inside a chunk.
// Precision, a template choice:
//  - kSplit (PrefillAttention::mma, the default): f32-accurate, as the WMMA kernel
//    (attention_prefill_tc.cu): q·scale and the softmax weights each go in as a bf16 pair
//    (hi = bf16(x), lo = bf16(x − hi), two MMAs, lo first), so scores and weights are within
//    ~2^-18 relative of f32's; the plain reference is attention_paged_cpu's with the f32
//    kernel's tolerance.
//  - !kSplit (PrefillAttention::mma_bf16): q·scale and the weights rounded once to bf16, one MMA
//    each, half the tensor work — FlashAttention's own precision. A score is then off by up to
//    ~2^-9·Σ|q_i·k_i|, and each weight by as much relative, so it meets the reference within a
//    bf16 tolerance (tests/cuda/test_cuda_ops.cpp states it), not f32's.
// A row's bits depend only on its own query and keys: chunks start at multiples of 64
// whatever rows share the block, an MMA row depends only on its own A row, a row's reductions
// stay within its 4 lanes in a fixed order, and a chunk in which a row sees no key leaves it
// exactly as it was (weights 0, rescale factor 1).
#include <cmath>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/ptx.cuh"

namespace snap::kernels {

namespace {
// A warp holds 16 query rows; a block 4 warps (64 rows, the default) or 8 (128 rows: half the
// K/V traffic per row, one block per SM at head_dim 128).
constexpr int k_mma_keys = 64;                // keys per chunk
constexpr int k_mma_pad = 8;                  // bf16 per shared row (16 B): ldmatrix rows fall in distinct banks
constexpr int k_mma_stages = 2;               // chunks in flight

// Byte offsets in the dynamic shared memory; every region is a multiple of 128 bytes
// (64 rows × (hd + 8) × 2 bytes = 128·(hd + 8)).
struct MmaLayout {
  size_t kv, qhi, qlo, rows, total;
};
__host__ __device__ inline MmaLayout mma_layout(int hd, bool split, int warps) {
  const int rows = 16 * warps;
  const size_t tile = sizeof(__nv_bfloat16) * k_mma_keys * (hd + k_mma_pad);  // one K or V chunk
  const size_t qtile = sizeof(__nv_bfloat16) * rows * (hd + k_mma_pad);
  MmaLayout L{};
  L.kv = 0;  // stage s: K at 2s·tile, V at (2s + 1)·tile
  L.qhi = L.kv + 2 * k_mma_stages * tile;
  L.qlo = L.qhi + qtile;
  L.rows = L.qlo + (split ? qtile : 0);
  L.total = L.rows + sizeof(int64_t) * (2 * rows + 2);  // rows' key ranges, their union
  return L;
}
}  // namespace

// kD = head_dim / 16. Grid: x row chunks of 16·kWarps, y KV heads.
template <int kD, bool kSplit, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    attention_prefill_mma_kernel(const float* q, const int32_t* q_positions, int64_t num_tokens, PagedKvCuda kv,
                                 AttentionParams p, float* out) {
  constexpr int hd = kD * 16;
  constexpr int ld = hd + k_mma_pad;           // shared rows (bf16)
  constexpr int tile = k_mma_keys * ld;         // elements of one K or V chunk
  constexpr int pieces = hd / 8;                // 16-byte pieces of a key row
  constexpr int k_mma_rows = 16 * kWarps;       // query rows per block
  extern __shared__ __align__(128) unsigned char mma_smem[];
  const MmaLayout L = mma_layout(hd, kSplit, kWarps);
  __nv_bfloat16* kv_s = reinterpret_cast<__nv_bfloat16*>(mma_smem + L.kv);
  __nv_bfloat16* qhi_s = reinterpret_cast<__nv_bfloat16*>(mma_smem + L.qhi);
  __nv_bfloat16* qlo_s = reinterpret_cast<__nv_bfloat16*>(mma_smem + L.qlo);
  int64_t* lo_s = reinterpret_cast<int64_t*>(mma_smem + L.rows);
  int64_t* hi_s = lo_s + k_mma_rows;
  int64_t* range_s = hi_s + k_mma_rows;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gq = lane >> 2, tq = lane & 3;  // the MMA fragments' row group and thread in group

  const paged::BlockSpan span = paged::block_span(kv, p, num_tokens, k_mma_rows);
  const int nrows = span.nrows;
  const PagedKvHead head = span.head;

  paged::span_visible(kv, span, q_positions, p.sliding_window, tid, k_mma_rows, lo_s, hi_s);  // each row's keys
  // q·scale staged as bf16 (hi, and lo when split), warp w's rows at w·16·ld, zeros past the end.
  for (int idx = tid; idx < k_mma_rows * hd; idx += blockDim.x) {
    const int rr = idx / hd, i = idx % hd;
    const float x = rr < nrows ? q[paged::span_row(span, p.num_heads, rr) * hd + i] * p.scale : 0.0f;
    const __nv_bfloat16 hi = __float2bfloat16_rn(x);
    qhi_s[rr * ld + i] = hi;
    if constexpr (kSplit) qlo_s[rr * ld + i] = __float2bfloat16_rn(x - __bfloat162float(hi));
  }
  __syncthreads();
  if (tid == 0) paged::range_union(lo_s, hi_s, 0, nrows, &range_s[0], &range_s[1]);  // [0, 0): no key at all
  // This warp's Q (hi) as A fragments, one per 16 dimensions; lane l names row l % 16, columns
  // 8·(l / 16) of the tile (matrices: rows 0-7 | 8-15 × columns 0-7 | 8-15).
  const int a_row = warp * 16 + (lane & 15), a_col = (lane >> 4) * 8;
  uint32_t qa[kD][4];
#pragma unroll
  for (int kk = 0; kk < kD; ++kk) ptx::ldmatrix_x4(qa[kk], qhi_s + a_row * ld + kk * 16 + a_col);
  __syncthreads();  // range_s is set
  const int64_t lo_all = range_s[0], hi_all = range_s[1];
  int64_t w_lo, w_hi;  // the union over this warp's rows
  paged::range_union(lo_s, hi_s, warp * 16, warp * 16 + 16, &w_lo, &w_hi);
  // This lane's two rows: a = warp·16 + gq (accumulator elements 0, 1), b = a + 8 (2, 3).
  const int64_t lo_a = lo_s[warp * 16 + gq], hi_a = hi_s[warp * 16 + gq];
  const int64_t lo_b = lo_s[warp * 16 + gq + 8], hi_b = hi_s[warp * 16 + gq + 8];
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this lane's share of the sum
  float o[2 * kD][4];  // O, 8 dimensions per MMA tile
#pragma unroll
  for (int d = 0; d < 2 * kD; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;

  const int64_t first = lo_all - lo_all % k_mma_keys;
  const int64_t chunks = hi_all > first ? (hi_all - first + k_mma_keys - 1) / k_mma_keys : 0;
  // Chunk c's K and V rows into stage `stage`, 16 bytes per cp.async; zeros past hi_all.
  auto fetch = [&](int64_t c, int stage) {
    const int64_t j0 = first + c * k_mma_keys;
    __nv_bfloat16* k_dst = kv_s + 2 * stage * tile;
    __nv_bfloat16* v_dst = k_dst + tile;
    for (int idx = tid; idx < k_mma_keys * pieces; idx += blockDim.x) {
      const int jj = idx / pieces, c8 = (idx % pieces) * 8;
      const int64_t j = j0 + jj;
      const bool valid = j < hi_all;
      const __nv_bfloat16* k_src = kv.k_base;
      const __nv_bfloat16* v_src = kv.v_base;
      if (valid) {
        const paged::KvRows rows = paged::kv_rows(kv, head, j, hd);
        k_src = rows.k + c8;
        v_src = rows.v + c8;
      }
      ptx::cp_async_16(k_dst + jj * ld + c8, k_src, valid);
      ptx::cp_async_16(v_dst + jj * ld + c8, v_src, valid);
    }
  };
  if (chunks > 0) fetch(0, 0);
  ptx::cp_async_commit();

  for (int64_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) fetch(c + 1, static_cast<int>((c + 1) & 1));
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();  // chunk c has landed (this thread's part) ...
    __syncthreads();          // ... and every thread's
    const int64_t j0 = first + c * k_mma_keys;
    const __nv_bfloat16* k_s = kv_s + 2 * (c & 1) * tile;
    const __nv_bfloat16* v_s = k_s + tile;
    if (w_lo < w_hi && w_lo < j0 + k_mma_keys && w_hi > j0) {  // some row of this warp sees a key here
      // S = Q·Kᵀ: s[n] holds keys j0 + 8n + 2·tq + {0, 1} of rows a (elements 0, 1) and b (2, 3).
      float s[k_mma_keys / 8][4];
#pragma unroll
      for (int n = 0; n < k_mma_keys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD; ++kk) {
        uint32_t qlo[4];
        if constexpr (kSplit) ptx::ldmatrix_x4(qlo, qlo_s + a_row * ld + kk * 16 + a_col);
#pragma unroll
        for (int np = 0; np < k_mma_keys / 16; ++np) {
          // B fragments of key tiles 2np and 2np + 1: lane l names key 16np + l % 8 + 8·(l / 16),
          // dimensions 16kk + 8·((l / 8) % 2).
          uint32_t kb[4];
          ptx::ldmatrix_x4(kb, k_s + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * ld + kk * 16 + ((lane >> 3) & 1) * 8);
          if constexpr (kSplit) {
            ptx::mma_bf16_16816(s[2 * np], qlo, kb[0], kb[1]);
            ptx::mma_bf16_16816(s[2 * np + 1], qlo, kb[2], kb[3]);
          }
          ptx::mma_bf16_16816(s[2 * np], qa[kk], kb[0], kb[1]);
          ptx::mma_bf16_16816(s[2 * np + 1], qa[kk], kb[2], kb[3]);
        }
      }
      // The online softmax on the registers: each row's keys are on its 4 lanes (xor 1, 2).
      // Each row's visible keys as offsets in the chunk, [a0, a1) and [b0, b1) within [0, 64].
      auto clip = [&](int64_t x) { return static_cast<int>(x < j0 ? 0 : x > j0 + k_mma_keys ? k_mma_keys : x - j0); };
      const int a0 = clip(lo_a), a1 = clip(hi_a), b0 = clip(lo_b), b1 = clip(hi_b);
      float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
      for (int n = 0; n < k_mma_keys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = 8 * n + 2 * tq + e;
          if (j >= a0 && j < a1) mx_a = fmaxf(mx_a, s[n][e]);
          if (j >= b0 && j < b1) mx_b = fmaxf(mx_b, s[n][2 + e]);
        }
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
      const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
      const float f_a = mn_a == m_a ? 1.0f : expf(m_a - mn_a);  // 0 on the row's first keys; 1 if none here
      const float f_b = mn_b == m_b ? 1.0f : expf(m_b - mn_b);
      float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
      for (int n = 0; n < k_mma_keys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = 8 * n + 2 * tq + e;
          s[n][e] = j >= a0 && j < a1 ? expf(s[n][e] - mn_a) : 0.0f;
          s[n][2 + e] = j >= b0 && j < b1 ? expf(s[n][2 + e] - mn_b) : 0.0f;
          sum_a += s[n][e];
          sum_b += s[n][2 + e];
        }
      l_a = l_a * f_a + sum_a;
      l_b = l_b * f_b + sum_b;
      m_a = mn_a;
      m_b = mn_b;
#pragma unroll
      for (int d = 0; d < 2 * kD; ++d) {
        o[d][0] *= f_a;
        o[d][1] *= f_a;
        o[d][2] *= f_b;
        o[d][3] *= f_b;
      }
      // O += P·V, 16 keys at a time: key tiles 2kk and 2kk + 1 of S are the A fragment.
#pragma unroll
      for (int kk = 0; kk < k_mma_keys / 16; ++kk) {
        uint32_t phi[4], plo[4];
        const float w[4][2] = {{s[2 * kk][0], s[2 * kk][1]},
                               {s[2 * kk][2], s[2 * kk][3]},
                               {s[2 * kk + 1][0], s[2 * kk + 1][1]},
                               {s[2 * kk + 1][2], s[2 * kk + 1][3]}};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          phi[i] = ptx::pack_bf16x2(w[i][0], w[i][1]);
          if constexpr (kSplit) {
            const float h0 = __uint_as_float(phi[i] << 16), h1 = __uint_as_float(phi[i] & 0xffff0000u);
            plo[i] = ptx::pack_bf16x2(w[i][0] - h0, w[i][1] - h1);
          }
        }
#pragma unroll
        for (int dp = 0; dp < kD; ++dp) {
          // B fragments of dimension tiles 2dp and 2dp + 1 (transposed): lane l names key
          // 16kk + l % 8 + 8·((l / 8) % 2), dimensions 16dp + 8·(l / 16).
          uint32_t vb[4];
          ptx::ldmatrix_x4_trans(vb, v_s + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + dp * 16 + (lane >> 4) * 8);
          if constexpr (kSplit) {
            ptx::mma_bf16_16816(o[2 * dp], plo, vb[0], vb[1]);
            ptx::mma_bf16_16816(o[2 * dp + 1], plo, vb[2], vb[3]);
          }
          ptx::mma_bf16_16816(o[2 * dp], phi, vb[0], vb[1]);
          ptx::mma_bf16_16816(o[2 * dp + 1], phi, vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before chunk c + 2 overwrites it
  }

  // out = O / l; a row's sum is its 4 lanes' shares (the same bits on each lane).
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp * 16 + gq + 8 * half;
    if (row >= nrows) continue;
    const float l = half == 0 ? l_a : l_b;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: zeros
    float* dst = out + paged::span_row(span, p.num_heads, row) * hd + 2 * tq;
#pragma unroll
    for (int d = 0; d < 2 * kD; ++d) {
      dst[8 * d] = o[d][2 * half] * inv;
      dst[8 * d + 1] = o[d][2 * half + 1] * inv;
    }
  }
}

namespace {
constexpr size_t k_max_smem = 227 * 1024;  // sm_90's most per block (sm_80: 163 KiB)

template <int kD, bool kSplit, int kWarps>
void launch_mma(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKvCuda& kv,
                const AttentionParams& p, float* out, cudaStream_t stream) {
  const size_t smem = mma_layout(kD * 16, kSplit, kWarps).total;
  if (smem > 48 * 1024)  // above the default the kernel opts in (sm_80: up to 163 KiB; sm_90: 227 KiB)
    cudaFuncSetAttribute(attention_prefill_mma_kernel<kD, kSplit, kWarps>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const int64_t rows_total = num_tokens * (p.num_heads / p.num_kv_heads);
  const int64_t rows = 16 * kWarps;
  const dim3 grid(static_cast<unsigned>((rows_total + rows - 1) / rows), static_cast<unsigned>(p.num_kv_heads));
  attention_prefill_mma_kernel<kD, kSplit, kWarps>
      <<<grid, kWarps * 32, smem, stream>>>(q, q_positions, num_tokens, kv, p, out);
}

// 8 warps where their shared memory fits (not at head_dim ≥ 224 with split operands), else 4.
template <int kD, bool kSplit>
void launch_warps(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKvCuda& kv,
                  const AttentionParams& p, float* out, cudaStream_t stream, int warps) {
  if (warps == 8 && mma_layout(kD * 16, kSplit, 8).total <= k_max_smem)
    launch_mma<kD, kSplit, 8>(q, q_positions, num_tokens, kv, p, out, stream);
  else
    launch_mma<kD, kSplit, 4>(q, q_positions, num_tokens, kv, p, out, stream);
}

template <bool kSplit>
void dispatch_mma(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKvCuda& kv,
                  const AttentionParams& p, float* out, cudaStream_t stream, int warps) {
  switch (p.head_dim / 32) {
    case 1: launch_warps<2, kSplit>(q, q_positions, num_tokens, kv, p, out, stream, warps); break;
    case 2: launch_warps<4, kSplit>(q, q_positions, num_tokens, kv, p, out, stream, warps); break;
    case 3: launch_warps<6, kSplit>(q, q_positions, num_tokens, kv, p, out, stream, warps); break;
    case 4: launch_warps<8, kSplit>(q, q_positions, num_tokens, kv, p, out, stream, warps); break;
    case 5: launch_warps<10, kSplit>(q, q_positions, num_tokens, kv, p, out, stream, warps); break;
    case 6: launch_warps<12, kSplit>(q, q_positions, num_tokens, kv, p, out, stream, warps); break;
    case 7: launch_warps<14, kSplit>(q, q_positions, num_tokens, kv, p, out, stream, warps); break;
    case 8: launch_warps<16, kSplit>(q, q_positions, num_tokens, kv, p, out, stream, warps); break;
  }
}
}  // namespace

cudaError_t attention_prefill_mma_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                       const PagedKvCuda& kv, const AttentionParams& p, float* out,
                                       cudaStream_t stream, bool bf16_operands, int warps) {
  if (num_tokens <= 0) return cudaSuccess;
  if (!attention_prefill_tc_supported(p, kv) || (warps != 4 && warps != 8)) return cudaErrorInvalidValue;
  if (bf16_operands)
    dispatch_mma<false>(q, q_positions, num_tokens, kv, p, out, stream, warps);
  else
    dispatch_mma<true>(q, q_positions, num_tokens, kv, p, out, stream, warps);
  return cudaGetLastError();
}

}  // namespace snap::kernels
