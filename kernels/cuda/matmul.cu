// CUDA twins of matmul_cpu / matmul_rowwise_cpu for bf16 weights w[rows, cols] (row-major,
// out x in), y[num_tokens, rows] = x · wᵀ (+ bias).
//  - matmul_bf16_cuda: prompt chunks through cuBLAS (bf16 in, f32 out, f32 compute). Row-major
//    y = x·wᵀ is column-major yᵀ = w_cmᵀ · x_cm, i.e. GemmEx(T, N, m = rows, n = tokens, k = cols).
//  - matmul_rowwise_cuda: decode rows, batch-invariant by construction. One warp per output
//    row r and group of ≤ 8 tokens (a lone token gets a 1-token kernel, same FMAs); lane l accumulates columns {l·8 + 256·i .. +8} (vector
//    path, cols % 8 == 0) or {l + 32·i} (scalar path) in ascending i, then a fixed xor-shuffle
//    tree. The order depends only on cols (and the path, which depends only on cols and
//    alignment), never on num_tokens or which tokens share the group.
//  - the fused decode GEMVs run that same per-row code in one launch for several outputs:
//    matmul_rowwise_multi_cuda (q, k and v over the same x), matmul_rowwise_residual_cuda (o_proj
//    or down_proj added into the residual stream) and matmul_rowwise_swiglu_cuda (gate and up of
//    a row in one warp, then SwiGLU). Each output's bits are those of the separate launches.
#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

namespace {
constexpr int k_warps = 8;        // output rows per 256-thread block
constexpr int k_group_tokens = 8;  // tokens sharing one read of a weight row

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
}  // namespace

__global__ void bias_add_kernel(float* y, const float* bias, int64_t num_tokens, int64_t rows) {
  const int64_t n = num_tokens * rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += bias[i % rows];
}

cublasStatus_t matmul_bf16_cuda(cublasHandle_t handle, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                const float* bias, float* y, int64_t num_tokens, int64_t rows, int64_t cols,
                                cudaStream_t stream) {
  if (num_tokens <= 0 || rows <= 0) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t st = cublas_set_stream(handle, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const float alpha = 1.0f, beta = 0.0f;
  st = cublas_gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(num_tokens),
                      static_cast<int>(cols), &alpha, w, CUDA_R_16BF, static_cast<int>(cols), x, CUDA_R_16BF,
                      static_cast<int>(cols), &beta, y, CUDA_R_32F, static_cast<int>(rows), CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS || bias == nullptr) return st;
  const int64_t n = num_tokens * rows;
  const int64_t blocks = (n + 255) / 256;
  bias_add_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(y, bias, num_tokens,
                                                                                              rows);
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
// What one launch computes. store: y_i = x·w_iᵀ (+ bias_i) for each segment i (count ≤ k_max),
// the launch's warps over the segments' rows in order; add: y_0 += x·w_0ᵀ (+ bias_0); swiglu:
// y_0 = SwiGLU(x·w_0ᵀ + b_0, x·w_1ᵀ + b_1) (gate w_0, up w_1, rows_0 = rows_1 rows).
enum class Epilogue { store, add, swiglu };
struct Segments {
  static constexpr int k_max = 3;
  const __nv_bfloat16* w[k_max] = {};
  const float* bias[k_max] = {};
  float* y[k_max] = {};
  int64_t rows[k_max] = {};
  int count = 0;
};

// A weight row's dot products with the nt (≤ kTokens) tokens from t0, per lane, before the warp
// sum. kVector: 16-byte loads of 8 bf16 weights and two float4 of x (needs cols % 8 == 0 and
// aligned bases). kLoads (vector path): how many of a lane's 16-byte weight loads are issued
// before the first of them is used. A decode GEMV is bound by HBM latency × bytes in flight,
// and one load per lane keeps only 512 B per warp in flight; kLoads = 4 keeps 2 KB. The FMAs
// still consume the chunks in ascending column order, so every kLoads gives the same bits.
template <bool kVector, int kLoads, int kTokens>
__device__ void row_dot(const float* x, const __nv_bfloat16* wr, int64_t cols, int64_t t0, int nt, int lane,
                        float (&acc)[kTokens]) {
#pragma unroll
  for (int k = 0; k < kTokens; ++k) acc[k] = 0.0f;
  if (kVector) {
    // 8 bf16 weights (one 16-byte load) at column c, times 8 columns of each token's x.
    const auto consume = [&](const uint4& raw, int64_t c) {
      float wf[8];  // bf16 -> f32 is the bits shifted up: exact, and no type punning
      const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        wf[2 * e] = __uint_as_float(words[e] << 16);
        wf[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
      }
#pragma unroll
      for (int k = 0; k < kTokens; ++k) {
        if (k < nt) {
          const float4* xv = reinterpret_cast<const float4*>(x + (t0 + k) * cols + c);
          const float4 a = xv[0], b = xv[1];
          float s = acc[k];
          s = fmaf(wf[0], a.x, s);
          s = fmaf(wf[1], a.y, s);
          s = fmaf(wf[2], a.z, s);
          s = fmaf(wf[3], a.w, s);
          s = fmaf(wf[4], b.x, s);
          s = fmaf(wf[5], b.y, s);
          s = fmaf(wf[6], b.z, s);
          s = fmaf(wf[7], b.w, s);
          acc[k] = s;
        }
      }
    };
    int64_t c = static_cast<int64_t>(lane) * 8;
    for (; c + (kLoads - 1) * 256 < cols; c += kLoads * 256) {
      uint4 raw[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) raw[u] = *reinterpret_cast<const uint4*>(wr + c + u * 256);
#pragma unroll
      for (int u = 0; u < kLoads; ++u) consume(raw[u], c + u * 256);
    }
    for (; c < cols; c += 256) consume(*reinterpret_cast<const uint4*>(wr + c), c);
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float wf = __bfloat162float(wr[c]);
#pragma unroll
      for (int k = 0; k < kTokens; ++k)
        if (k < nt) acc[k] = fmaf(wf, x[(t0 + k) * cols + c], acc[k]);
    }
  }
}
}  // namespace

// Grid: x = ceil(rows / k_warps) · groups (rows: the segments' total, or rows_0 for swiglu;
// groups = ceil(num_tokens / kTokens)), the token groups of a row block next to each other:
// blocks run roughly in index order, so the groups read the block's weight rows at about the
// same time and all but the first find them in L2 (with the groups outermost, a batch of 32
// decode rows streamed every matrix from HBM 4 times). One warp per output row; a warp's
// segment is warp-uniform.
// kTokens: tokens sharing one read of a weight row (k_group_tokens, or 1 for a lone decode row:
// fewer registers, so more warps per SM; a token's FMAs are the same either way, so its bits are).
template <bool kVector, int kLoads, int kTokens, Epilogue kEpi>
__global__ void matmul_rowwise_kernel(const float* x, Segments seg, int64_t num_tokens, int64_t cols) {
  const int lane = threadIdx.x & 31;
  const unsigned groups = static_cast<unsigned>((num_tokens + kTokens - 1) / kTokens);  // 32-bit division below
  const int64_t group = blockIdx.x % groups, row_block = blockIdx.x / groups;
  int64_t r = row_block * k_warps + (threadIdx.x >> 5);
  // The warp's segment, with constant indices only (a dynamic index into the parameter struct
  // would copy it to local memory).
  const __nv_bfloat16* w = seg.w[0];
  const float* bias = seg.bias[0];
  float* y = seg.y[0];
  int64_t rows = seg.rows[0];
  if (kEpi == Epilogue::store) {
#pragma unroll
    for (int i = 1; i < Segments::k_max; ++i)
      if (i < seg.count && r >= rows) {
        r -= rows;
        w = seg.w[i];
        bias = seg.bias[i];
        y = seg.y[i];
        rows = seg.rows[i];
      }
  }
  if (r >= rows) return;
  const int64_t t0 = group * kTokens;
  const int nt = static_cast<int>(num_tokens - t0 < kTokens ? num_tokens - t0 : kTokens);
  float acc[kTokens];
  row_dot<kVector, kLoads, kTokens>(x, w + r * cols, cols, t0, nt, lane, acc);
  if constexpr (kEpi == Epilogue::swiglu) {
    float up[kTokens];
    row_dot<kVector, kLoads, kTokens>(x, seg.w[1] + r * cols, cols, t0, nt, lane, up);
#pragma unroll
    for (int k = 0; k < kTokens; ++k) {
      // As the separate launches: gate and up stored with their bias (or + 0), then swiglu_cuda.
      const float g = warp_sum(acc[k]) + (bias != nullptr ? bias[r] : 0.0f);
      const float u = warp_sum(up[k]) + (seg.bias[1] != nullptr ? seg.bias[1][r] : 0.0f);
      if (lane == 0 && k < nt) y[(t0 + k) * rows + r] = g / (1.0f + expf(-g)) * u;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kTokens; ++k) {
      const float s = warp_sum(acc[k]) + (bias != nullptr ? bias[r] : 0.0f);  // every lane sums, even past nt
      if (lane == 0 && k < nt) {
        float* out = y + (t0 + k) * rows + r;
        *out = kEpi == Epilogue::add ? *out + s : s;
      }
    }
  }
}

namespace {
template <int kTokens, Epilogue kEpi>
void launch_rowwise(const float* x, const Segments& seg, int64_t total_rows, bool vector, int64_t num_tokens,
                    int64_t cols, cudaStream_t stream, int loads) {
  const dim3 grid(static_cast<unsigned>((total_rows + k_warps - 1) / k_warps * ((num_tokens + kTokens - 1) / kTokens)));
  if (!vector)
    matmul_rowwise_kernel<false, 1, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
  else if (loads <= 1)
    matmul_rowwise_kernel<true, 1, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
  else
    matmul_rowwise_kernel<true, 4, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
}

// The path: vector when cols % 8 == 0 and x and every weight are 16-byte aligned.
template <Epilogue kEpi>
void rowwise(const float* x, const Segments& seg, int64_t num_tokens, int64_t cols, cudaStream_t stream, int loads) {
  int64_t total = 0;
  bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  for (int i = 0; i < seg.count; ++i) {
    total += kEpi == Epilogue::swiglu && i > 0 ? 0 : seg.rows[i];
    aligned = aligned && reinterpret_cast<uintptr_t>(seg.w[i]) % 16 == 0;
  }
  if (num_tokens <= 0 || total <= 0) return;
  const bool vector = cols % 8 == 0 && aligned;
  if (num_tokens == 1)
    launch_rowwise<1, kEpi>(x, seg, total, vector, num_tokens, cols, stream, loads);
  else
    launch_rowwise<k_group_tokens, kEpi>(x, seg, total, vector, num_tokens, cols, stream, loads);
}
}  // namespace

void matmul_rowwise_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t num_tokens,
                         int64_t rows, int64_t cols, cudaStream_t stream, int loads) {
  const RowwiseOut out{w, bias, y, rows};
  matmul_rowwise_multi_cuda(x, &out, 1, num_tokens, cols, stream, loads);
}

void matmul_rowwise_multi_cuda(const float* x, const RowwiseOut* outs, int count, int64_t num_tokens, int64_t cols,
                               cudaStream_t stream, int loads) {
  for (int at = 0; at < count; at += Segments::k_max) {  // more outputs than one launch takes: several
    Segments seg;
    for (; seg.count < Segments::k_max && at + seg.count < count; ++seg.count) {
      const RowwiseOut& o = outs[at + seg.count];
      seg.w[seg.count] = o.w;
      seg.bias[seg.count] = o.bias;
      seg.y[seg.count] = o.y;
      seg.rows[seg.count] = o.rows > 0 ? o.rows : 0;
    }
    rowwise<Epilogue::store>(x, seg, num_tokens, cols, stream, loads);
  }
}

void matmul_rowwise_residual_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y,
                                  int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  Segments seg;
  seg.count = 1;
  seg.w[0] = w;
  seg.bias[0] = bias;
  seg.y[0] = y;
  seg.rows[0] = rows;
  rowwise<Epilogue::add>(x, seg, num_tokens, cols, stream, 4);
}

void matmul_rowwise_swiglu_cuda(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out,
                                int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  Segments seg;  // gate's segment carries the output; up's only its weights (and no bias)
  seg.count = 2;
  seg.w[0] = gate;
  seg.w[1] = up;
  seg.y[0] = out;
  seg.rows[0] = seg.rows[1] = rows;
  rowwise<Epilogue::swiglu>(x, seg, num_tokens, cols, stream, 4);
}

}  // namespace snap::kernels
