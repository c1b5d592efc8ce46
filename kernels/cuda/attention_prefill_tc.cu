// The WMMA tensor-core twin of attention_paged_cuda for prompt chunks (attention_prefill_tc_cuda
// in kernels_cuda.h with PrefillAttention::wmma; the default, mma, is attention_prefill_mma.cu):
// causal GQA attention over the paged per-KV-head cache with bf16 MMAs (WMMA m16n16k16, f32
// accumulation), FlashAttention-2 style: tiled online softmax, no N×N matrix.
//   Block = 64 query rows (t, h) of one KV head g, 4 warps of 16 rows each; the rows of a GQA
//   group share every K/V load. Keys stream through shared memory in aligned chunks of 64
//   (bf16, rows padded by 8 elements). Per chunk a warp computes S = Q·Kᵀ (16 × 64) on the
//   tensor cores, stores it to its shared tile, runs the online softmax on it (two lanes per
//   row, the even and the odd keys), writes the weights P as bf16 pairs, rescales its O
//   fragments row by row
//   (the fragments' row of each element is read from a loaded row-index tile, since WMMA
//   leaves the element mapping unspecified) and adds P·V on the tensor cores.
// Numerics: f32-accurate, so the plain reference is attention_paged_cpu's (attention_paged_ref)
// with the f32 kernel's tolerance. K and V are the cache's bf16, exact as MMA operands; the
// f32 operands — q·scale and each chunk's softmax weights exp(s − m) — are each carried as a
// pair of bf16 (hi = bf16(x), lo = bf16(x − hi); x − hi − lo ≤ 2^-18·|x|) and multiplied as
// two MMAs (lo first), accumulating in f32. So scores and weights are within ~2^-18 relative
// of f32's instead of bf16's 2^-9, at twice the MMAs of a plain bf16 kernel.
// A row's bits depend only on its own query and keys: chunks start at multiples of 64
// whatever rows share the block, and a chunk in which a row sees no key leaves it exactly as
// it was (its weights are 0, its rescale factor 1), so the bits do not depend on how a prompt
// is cut into chunks or which rows share a block.
#include <mma.h>

#include <cmath>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/paged_kv.cuh"

namespace snap::kernels {

namespace {
namespace wmma = nvcuda::wmma;

constexpr int k_tc_warps = 4;
constexpr int k_tc_rows = 16 * k_tc_warps;  // query rows per block
constexpr int k_tc_keys = 64;               // keys per shared-memory chunk
constexpr int k_tc_pad = 8;                 // bf16 padding per shared row (16 B): ldm stays a multiple of 8

__host__ __device__ constexpr size_t align128(size_t x) { return (x + 127) / 128 * 128; }

// Byte offsets in the dynamic shared memory (every region 128-byte aligned; WMMA needs 32).
struct TcLayout {
  size_t k, v, qlo, s, p, f, rows, total;
};
// P tiles of one warp: hi then lo, [16][72] bf16 each.
constexpr int k_tc_ptile = 16 * (k_tc_keys + k_tc_pad);
__host__ __device__ inline TcLayout tc_layout(int hd) {
  TcLayout L{};
  const size_t kv = align128(sizeof(__nv_bfloat16) * k_tc_keys * (hd + k_tc_pad));
  L.k = 0;                                                             // K chunk; Q hi before, O after the loop
  L.v = L.k + kv;                                                      // V chunk
  L.qlo = L.v + kv;                                                    // Q lo [64][hd + 8] bf16
  L.s = L.qlo + align128(sizeof(__nv_bfloat16) * k_tc_rows * (hd + k_tc_pad));  // per warp: S, [64 keys][16 rows] f32
  L.p = L.s + align128(sizeof(float) * k_tc_warps * 16 * k_tc_keys);   // per warp: P hi, P lo
  L.f = L.p + align128(sizeof(__nv_bfloat16) * k_tc_warps * 2 * k_tc_ptile);
  L.rows = L.f + align128(sizeof(float) * (k_tc_warps * 16 + 16 * 16));    // per-row factors, row-index tile
  L.total = L.rows + align128(sizeof(int64_t) * (2 * k_tc_rows + 2));      // rows' key ranges, their union
  return L;
}
}  // namespace

// kD = head_dim / 16: the MMA tiles along a head. Grid: x row chunks of 64, y KV heads.
template <int kD>
__global__ void __launch_bounds__(k_tc_warps * 32)
    attention_prefill_tc_kernel(const float* q, const int32_t* q_positions, int64_t num_tokens, PagedKvCuda kv,
                                AttentionParams p, float* out) {
  constexpr int hd = kD * 16;
  constexpr int ld = hd + k_tc_pad;           // K, V and staged Q rows (bf16)
  constexpr int ldp = k_tc_keys + k_tc_pad;   // P rows (bf16)
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const TcLayout L = tc_layout(hd);
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(tc_smem + L.k);
  __nv_bfloat16* v_s = reinterpret_cast<__nv_bfloat16*>(tc_smem + L.v);
  __nv_bfloat16* qlo_s = reinterpret_cast<__nv_bfloat16*>(tc_smem + L.qlo);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* s_w = reinterpret_cast<float*>(tc_smem + L.s) + warp * 16 * k_tc_keys;
  __nv_bfloat16* p_hi = reinterpret_cast<__nv_bfloat16*>(tc_smem + L.p) + warp * 2 * k_tc_ptile;
  __nv_bfloat16* p_lo = p_hi + k_tc_ptile;
  float* f_w = reinterpret_cast<float*>(tc_smem + L.f) + warp * 16;
  float* row_tile = reinterpret_cast<float*>(tc_smem + L.f) + k_tc_warps * 16;  // [16][16]: (i, j) = i
  int64_t* lo_s = reinterpret_cast<int64_t*>(tc_smem + L.rows);
  int64_t* hi_s = lo_s + k_tc_rows;
  int64_t* range_s = hi_s + k_tc_rows;

  const paged::BlockSpan span = paged::block_span(kv, p, num_tokens, k_tc_rows);
  const int nrows = span.nrows;
  const PagedKvHead head = span.head;

  paged::span_visible(kv, span, q_positions, p.sliding_window, tid, k_tc_rows, lo_s, hi_s);  // each row's keys
  for (int idx = tid; idx < 16 * 16; idx += blockDim.x) row_tile[idx] = static_cast<float>(idx / 16);
  // q·scale as a bf16 pair: hi staged in the K region (then held in registers), lo in its own
  // region (read at each use: registers would spill); warp w's rows at w·16·ld, zeros past the end.
  for (int idx = tid; idx < k_tc_rows * hd; idx += blockDim.x) {
    const int rr = idx / hd, i = idx % hd;
    const float x = rr < nrows ? q[paged::span_row(span, p.num_heads, rr) * hd + i] * p.scale : 0.0f;
    const __nv_bfloat16 hi = __float2bfloat16_rn(x);
    k_s[rr * ld + i] = hi;
    qlo_s[rr * ld + i] = __float2bfloat16_rn(x - __bfloat162float(hi));
  }
  __syncthreads();
  if (tid == 0) paged::range_union(lo_s, hi_s, 0, nrows, &range_s[0], &range_s[1]);  // [0, 0): no key at all
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qhi[kD];
#pragma unroll
  for (int kk = 0; kk < kD; ++kk) wmma::load_matrix_sync(qhi[kk], k_s + warp * 16 * ld + kk * 16, ld);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> rows_of;  // the row of each element
  wmma::load_matrix_sync(rows_of, row_tile, 16, wmma::mem_row_major);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[kD];
#pragma unroll
  for (int d = 0; d < kD; ++d) wmma::fill_fragment(o[d], 0.0f);
  __syncthreads();  // Q hi is in registers before the first chunk overwrites k_s; range_s is set
  const int64_t lo_all = range_s[0], hi_all = range_s[1];
  int64_t w_lo, w_hi;  // the union over this warp's rows
  paged::range_union(lo_s, hi_s, warp * 16, warp * 16 + 16, &w_lo, &w_hi);
  // The softmax: lane → row `mine` of the warp, keys [half·32, half·32 + 32) of each chunk.
  const int mine = lane >> 1, half = lane & 1;
  const int64_t my_lo = lo_s[warp * 16 + mine], my_hi = hi_s[warp * 16 + mine];
  float m = -INFINITY, l = 0.0f;

  for (int64_t j0 = lo_all - lo_all % k_tc_keys; j0 < hi_all; j0 += k_tc_keys) {
    const int n = static_cast<int>(hi_all - j0 < k_tc_keys ? hi_all - j0 : k_tc_keys);
    // K and V rows of the chunk, 8 bf16 (16 B) per load; rows past n are zeros (P·V reads them).
    for (int idx = tid; idx < k_tc_keys * (hd / 8); idx += blockDim.x) {
      const int jj = idx / (hd / 8), c = (idx % (hd / 8)) * 8;
      uint4 kr = make_uint4(0u, 0u, 0u, 0u), vr = make_uint4(0u, 0u, 0u, 0u);
      if (jj < n) {
        paged::kv_piece(kv, head, j0 + jj, hd, c, &kr, &vr);
      }
      *reinterpret_cast<uint4*>(k_s + jj * ld + c) = kr;
      *reinterpret_cast<uint4*>(v_s + jj * ld + c) = vr;
    }
    __syncthreads();
    if (w_lo < w_hi && w_lo < j0 + n && w_hi > j0) {  // some row of this warp sees a key here (warp-uniform)
#pragma unroll
      for (int nt = 0; nt < k_tc_keys / 16; ++nt) {  // S = Q·Kᵀ, 16 keys at a time
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
        wmma::fill_fragment(sf, 0.0f);
#pragma unroll
        for (int kk = 0; kk < kD; ++kk) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kf;  // (k, n) = K[n][k]
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qlo;
          wmma::load_matrix_sync(kf, k_s + nt * 16 * ld + kk * 16, ld);
          wmma::load_matrix_sync(qlo, qlo_s + warp * 16 * ld + kk * 16, ld);
          wmma::mma_sync(sf, qlo, kf, sf);
          wmma::mma_sync(sf, qhi[kk], kf, sf);
        }
        wmma::store_matrix_sync(s_w + nt * 16 * 16, sf, 16, wmma::mem_col_major);
      }
      __syncwarp();
      // S is column-major (key, row) with ld 16 and lane `half` takes the keys of its parity,
      // so the 32 lanes read 32 different banks.
      const int64_t a = my_lo > j0 ? my_lo : j0, b = my_hi < j0 + n ? my_hi : j0 + n;
      float mx = -INFINITY;
      for (int c = 0; c < 32; ++c) {
        const int col = 2 * c + half;
        if (j0 + col >= a && j0 + col < b) mx = fmaxf(mx, s_w[col * 16 + mine]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_new = fmaxf(m, mx);
      const float f = m_new == m ? 1.0f : expf(m - m_new);  // 0 on the row's first keys; 1 if none here
      float sum = 0.0f;
      for (int c = 0; c < 32; ++c) {
        const int col = 2 * c + half;
        const float w = j0 + col >= a && j0 + col < b ? expf(s_w[col * 16 + mine] - m_new) : 0.0f;
        sum += w;
        const __nv_bfloat16 hi = __float2bfloat16_rn(w);
        p_hi[mine * ldp + col] = hi;
        p_lo[mine * ldp + col] = __float2bfloat16_rn(w - __bfloat162float(hi));
      }
      const float other = __shfl_xor_sync(0xffffffffu, sum, 1);
      l = l * f + (half == 0 ? sum + other : other + sum);  // the even keys' sum first, on both lanes
      m = m_new;
      if (half == 0) f_w[mine] = f;
      __syncwarp();
#pragma unroll
      for (int d = 0; d < kD; ++d)  // O = O·f, row by row
#pragma unroll
        for (int e = 0; e < o[d].num_elements; ++e) o[d].x[e] *= f_w[static_cast<int>(rows_of.x[e])];
#pragma unroll
      for (int kk = 0; kk < k_tc_keys / 16; ++kk) {  // O += P·V, 16 keys at a time
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> phi, plo;
        wmma::load_matrix_sync(phi, p_hi + kk * 16, ldp);
        wmma::load_matrix_sync(plo, p_lo + kk * 16, ldp);
#pragma unroll
        for (int d = 0; d < kD; ++d) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vf;  // (k, n) = V[k][n]
          wmma::load_matrix_sync(vf, v_s + kk * 16 * ld + d * 16, ld);
          wmma::mma_sync(o[d], plo, vf, o[d]);
          wmma::mma_sync(o[d], phi, vf, o[d]);
        }
      }
    }
    __syncthreads();  // every warp is done with this chunk's K and V
  }

  // out = O / l, through shared memory (the K/V region: 4 warps × 16 × hd floats fit in it).
  if (half == 0) f_w[mine] = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: zeros
  float* o_w = reinterpret_cast<float*>(tc_smem + L.k) + warp * 16 * hd;
#pragma unroll
  for (int d = 0; d < kD; ++d) wmma::store_matrix_sync(o_w + d * 16, o[d], hd, wmma::mem_row_major);
  __syncwarp();
  for (int idx = lane; idx < 16 * hd; idx += 32) {
    const int rr = idx / hd, i = idx % hd;
    const int row = warp * 16 + rr;
    if (row >= nrows) continue;
    out[paged::span_row(span, p.num_heads, row) * hd + i] = o_w[idx] * f_w[rr];
  }
}

namespace {
template <int kD>
void launch_tc(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKvCuda& kv,
               const AttentionParams& p, float* out, cudaStream_t stream) {
  const size_t smem = tc_layout(kD * 16).total;
  if (smem > 48 * 1024)  // above the default the kernel opts in (sm_80: up to 163 KiB; sm_90: 227 KiB)
    cudaFuncSetAttribute(attention_prefill_tc_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  const int64_t rows_total = num_tokens * (p.num_heads / p.num_kv_heads);
  const dim3 grid(static_cast<unsigned>((rows_total + k_tc_rows - 1) / k_tc_rows), static_cast<unsigned>(p.num_kv_heads));
  attention_prefill_tc_kernel<kD><<<grid, k_tc_warps * 32, smem, stream>>>(q, q_positions, num_tokens, kv, p, out);
}
}  // namespace

cudaError_t attention_prefill_tc_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                      const PagedKvCuda& kv, const AttentionParams& p, float* out,
                                      cudaStream_t stream, PrefillAttention kernel) {
  if (kernel != PrefillAttention::wmma)
    return attention_prefill_mma_cuda(q, q_positions, num_tokens, kv, p, out, stream,
                                      kernel == PrefillAttention::mma_bf16);
  if (num_tokens <= 0) return cudaSuccess;
  if (!attention_prefill_tc_supported(p, kv)) return cudaErrorInvalidValue;
  switch (p.head_dim / 32) {
    case 1: launch_tc<2>(q, q_positions, num_tokens, kv, p, out, stream); break;
    case 2: launch_tc<4>(q, q_positions, num_tokens, kv, p, out, stream); break;
    case 3: launch_tc<6>(q, q_positions, num_tokens, kv, p, out, stream); break;
    case 4: launch_tc<8>(q, q_positions, num_tokens, kv, p, out, stream); break;
    case 5: launch_tc<10>(q, q_positions, num_tokens, kv, p, out, stream); break;
    case 6: launch_tc<12>(q, q_positions, num_tokens, kv, p, out, stream); break;
    case 7: launch_tc<14>(q, q_positions, num_tokens, kv, p, out, stream); break;
    case 8: launch_tc<16>(q, q_positions, num_tokens, kv, p, out, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace snap::kernels
