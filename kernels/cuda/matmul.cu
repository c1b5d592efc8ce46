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
//  - Q8_0 weights (…_q8_cuda, RowwiseOut::q8): the same kernels reading int8 quants and their
//    f16 scales; a weight is d · q, exact in f32 (an 11-bit by 8-bit product), so the sums are
//    those of the same GEMV over the dequantized matrix. A lane takes 16 quants per 16-byte load
//    (columns l·16 + 512·i), the same fixed order rule. dequant_q8_0_to_bf16_cuda feeds cuBLAS
//    for prompt chunks.
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

__global__ void bias_add_kernel(float* y, const float* bias, int64_t num_tokens, int64_t rows, int64_t ldy) {
  const int64_t n = num_tokens * rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i / rows * ldy + i % rows] += bias[i % rows];
}

cublasStatus_t matmul_bf16_cuda(cublasHandle_t handle, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                const float* bias, float* y, int64_t num_tokens, int64_t rows, int64_t cols,
                                cudaStream_t stream, int64_t ldy) {
  if (num_tokens <= 0 || rows <= 0) return CUBLAS_STATUS_SUCCESS;
  if (ldy <= 0) ldy = rows;
  cublasStatus_t st = cublas_set_stream(handle, stream);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const float alpha = 1.0f, beta = 0.0f;
  st = cublas_gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(num_tokens),
                      static_cast<int>(cols), &alpha, w, CUDA_R_16BF, static_cast<int>(cols), x, CUDA_R_16BF,
                      static_cast<int>(cols), &beta, y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS || bias == nullptr) return st;
  const int64_t n = num_tokens * rows;
  const int64_t blocks = (n + 255) / 256;
  bias_add_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(y, bias, num_tokens,
                                                                                              rows, ldy);
  return CUBLAS_STATUS_SUCCESS;
}

// f16 bits -> f32, exact (normal, subnormal, inf/NaN), with integer operations only.
__device__ __forceinline__ float f16_bits_to_float(unsigned h) {
  const unsigned sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man · 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}

__global__ void dequant_q8_0_bf16_kernel(const int8_t* q, const uint16_t* d, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(f16_bits_to_float(d[i >> 5]) * static_cast<float>(q[i]));
}

void dequant_q8_0_to_bf16_cuda(const int8_t* q, const uint16_t* d, int64_t n, __nv_bfloat16* out,
                               cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256;
  dequant_q8_0_bf16_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(q, d, n, out);
}

// One block row per token, as embedding_gather_cuda: out = d · q, exact.
__global__ void embedding_gather_q8_0_kernel(const int8_t* q, const uint16_t* d, const int32_t* ids,
                                             int64_t hidden_size, int64_t vocab_size, float* out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * hidden_size;
  const bool valid = id >= 0 && id < vocab_size;
  const int64_t row = valid ? static_cast<int64_t>(id) : 0;
  const int8_t* qr = q + row * hidden_size;
  const uint16_t* dr = d + row * (hidden_size / 32);
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < hidden_size;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x)
    o[i] = valid ? f16_bits_to_float(dr[i >> 5]) * static_cast<float>(qr[i]) : __int_as_float(0x7fc00000);
}

void embedding_gather_q8_0_cuda(const int8_t* q, const uint16_t* d, const int32_t* ids, int64_t num_tokens,
                                int64_t hidden_size, int64_t vocab_size, float* out, cudaStream_t stream) {
  if (num_tokens <= 0 || hidden_size <= 0) return;
  const int64_t xb = (hidden_size + 255) / 256;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(xb < 64 ? xb : 64));
  embedding_gather_q8_0_kernel<<<grid, 256, 0, stream>>>(q, d, ids, hidden_size, vocab_size, out);
}

namespace {
// What one launch computes. store: y_i = x·w_iᵀ (+ bias_i) for each segment i (count ≤ k_max),
// the launch's warps over the segments' rows in order; add: y_0 += x·w_0ᵀ (+ bias_0); swiglu:
// y_0 = SwiGLU(x·w_0ᵀ + b_0, x·w_1ᵀ + b_1) (gate w_0, up w_1, rows_0 = rows_1 rows).
enum class Epilogue { store, add, swiglu };
struct Segments {
  static constexpr int k_max = 3;
  const void* w[k_max] = {};          // bf16 [rows, cols], or Q8_0 quants int8 [rows, cols]
  const uint16_t* d[k_max] = {};      // Q8_0 only: f16 scales [rows, cols / 32]
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

// row_dot for a Q8_0 row (quants qr, scales dr). kVector: 16-byte loads of 16 quants at
// columns l·16 + 512·i (needs cols % 16 == 0, aligned bases; Q8_0 rows have cols % 32 == 0),
// four float4 of x per token; else lane l takes columns l + 32·i. The weight d · q is exact.
template <bool kVector, int kLoads, int kTokens>
__device__ void row_dot_q8(const float* x, const int8_t* qr, const uint16_t* dr, int64_t cols, int64_t t0, int nt,
                           int lane, float (&acc)[kTokens]) {
#pragma unroll
  for (int k = 0; k < kTokens; ++k) acc[k] = 0.0f;
  if (kVector) {
    const auto consume = [&](const uint4& raw, int64_t c) {
      const float scale = f16_bits_to_float(dr[c >> 5]);
      float wf[16];
      const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
#pragma unroll
        for (int b = 0; b < 4; ++b)  // byte b of the word, sign-extended
          wf[4 * e + b] = scale * static_cast<float>(static_cast<int>(words[e] << (24 - 8 * b)) >> 24);
      }
#pragma unroll
      for (int k = 0; k < kTokens; ++k) {
        if (k < nt) {
          const float4* xv = reinterpret_cast<const float4*>(x + (t0 + k) * cols + c);
          float s = acc[k];
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const float4 a = xv[v];
            s = fmaf(wf[4 * v], a.x, s);
            s = fmaf(wf[4 * v + 1], a.y, s);
            s = fmaf(wf[4 * v + 2], a.z, s);
            s = fmaf(wf[4 * v + 3], a.w, s);
          }
          acc[k] = s;
        }
      }
    };
    int64_t c = static_cast<int64_t>(lane) * 16;
    for (; c + (kLoads - 1) * 512 < cols; c += kLoads * 512) {
      uint4 raw[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) raw[u] = *reinterpret_cast<const uint4*>(qr + c + u * 512);
#pragma unroll
      for (int u = 0; u < kLoads; ++u) consume(raw[u], c + u * 512);
    }
    for (; c < cols; c += 512) consume(*reinterpret_cast<const uint4*>(qr + c), c);
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float wf = f16_bits_to_float(dr[c >> 5]) * static_cast<float>(qr[c]);
#pragma unroll
      for (int k = 0; k < kTokens; ++k)
        if (k < nt) acc[k] = fmaf(wf, x[(t0 + k) * cols + c], acc[k]);
    }
  }
}

// Segment i's row r: bf16 or Q8_0 (kQ8).
template <bool kQ8, bool kVector, int kLoads, int kTokens>
__device__ void seg_row_dot(const float* x, const void* w, const uint16_t* d, int64_t r, int64_t cols, int64_t t0,
                            int nt, int lane, float (&acc)[kTokens]) {
  if constexpr (kQ8)
    row_dot_q8<kVector, kLoads, kTokens>(x, static_cast<const int8_t*>(w) + r * cols, d + r * (cols / 32), cols, t0,
                                         nt, lane, acc);
  else
    row_dot<kVector, kLoads, kTokens>(x, static_cast<const __nv_bfloat16*>(w) + r * cols, cols, t0, nt, lane, acc);
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
template <bool kQ8, bool kVector, int kLoads, int kTokens, Epilogue kEpi>
__global__ void matmul_rowwise_kernel(const float* x, Segments seg, int64_t num_tokens, int64_t cols) {
  const int lane = threadIdx.x & 31;
  const unsigned groups = static_cast<unsigned>((num_tokens + kTokens - 1) / kTokens);  // 32-bit division below
  const int64_t group = blockIdx.x % groups, row_block = blockIdx.x / groups;
  int64_t r = row_block * k_warps + (threadIdx.x >> 5);
  // The warp's segment, with constant indices only (a dynamic index into the parameter struct
  // would copy it to local memory).
  const void* w = seg.w[0];
  const uint16_t* d = seg.d[0];
  const float* bias = seg.bias[0];
  float* y = seg.y[0];
  int64_t rows = seg.rows[0];
  if (kEpi == Epilogue::store) {
#pragma unroll
    for (int i = 1; i < Segments::k_max; ++i)
      if (i < seg.count && r >= rows) {
        r -= rows;
        w = seg.w[i];
        d = seg.d[i];
        bias = seg.bias[i];
        y = seg.y[i];
        rows = seg.rows[i];
      }
  }
  if (r >= rows) return;
  const int64_t t0 = group * kTokens;
  const int nt = static_cast<int>(num_tokens - t0 < kTokens ? num_tokens - t0 : kTokens);
  float acc[kTokens];
  seg_row_dot<kQ8, kVector, kLoads, kTokens>(x, w, d, r, cols, t0, nt, lane, acc);
  if constexpr (kEpi == Epilogue::swiglu) {
    float up[kTokens];
    seg_row_dot<kQ8, kVector, kLoads, kTokens>(x, seg.w[1], seg.d[1], r, cols, t0, nt, lane, up);
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
template <bool kQ8, int kTokens, Epilogue kEpi>
void launch_rowwise(const float* x, const Segments& seg, int64_t total_rows, bool vector, int64_t num_tokens,
                    int64_t cols, cudaStream_t stream, int loads) {
  const dim3 grid(static_cast<unsigned>((total_rows + k_warps - 1) / k_warps * ((num_tokens + kTokens - 1) / kTokens)));
  if (!vector)
    matmul_rowwise_kernel<kQ8, false, 1, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
  else if (loads <= 1)
    matmul_rowwise_kernel<kQ8, true, 1, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
  else
    matmul_rowwise_kernel<kQ8, true, 4, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
}

// The path: vector when cols is a multiple of a lane's load (8 bf16, 16 quants) and x and every
// weight are 16-byte aligned. q8: every segment is Q8_0 (cols % 32 == 0), else every one bf16.
template <Epilogue kEpi>
void rowwise(const float* x, const Segments& seg, int64_t num_tokens, int64_t cols, cudaStream_t stream, int loads,
             bool q8) {
  int64_t total = 0;
  bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  for (int i = 0; i < seg.count; ++i) {
    total += kEpi == Epilogue::swiglu && i > 0 ? 0 : seg.rows[i];
    aligned = aligned && reinterpret_cast<uintptr_t>(seg.w[i]) % 16 == 0;
  }
  if (num_tokens <= 0 || total <= 0) return;
  const bool vector = cols % (q8 ? 16 : 8) == 0 && aligned;
  if (q8) {
    if (num_tokens == 1)
      launch_rowwise<true, 1, kEpi>(x, seg, total, vector, num_tokens, cols, stream, loads);
    else
      launch_rowwise<true, k_group_tokens, kEpi>(x, seg, total, vector, num_tokens, cols, stream, loads);
  } else if (num_tokens == 1) {
    launch_rowwise<false, 1, kEpi>(x, seg, total, vector, num_tokens, cols, stream, loads);
  } else {
    launch_rowwise<false, k_group_tokens, kEpi>(x, seg, total, vector, num_tokens, cols, stream, loads);
  }
}
}  // namespace

void matmul_rowwise_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t num_tokens,
                         int64_t rows, int64_t cols, cudaStream_t stream, int loads) {
  const RowwiseOut out{w, bias, y, rows};
  matmul_rowwise_multi_cuda(x, &out, 1, num_tokens, cols, stream, loads);
}

void matmul_rowwise_q8_cuda(const float* x, const int8_t* q, const uint16_t* d, const float* bias, float* y,
                            int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream, int loads) {
  RowwiseOut out{nullptr, bias, y, rows};
  out.q8 = q;
  out.q8_scales = d;
  matmul_rowwise_multi_cuda(x, &out, 1, num_tokens, cols, stream, loads);
}

void matmul_rowwise_multi_cuda(const float* x, const RowwiseOut* outs, int count, int64_t num_tokens, int64_t cols,
                               cudaStream_t stream, int loads) {
  // Up to k_max outputs of one kind (bf16 or Q8_0) per launch: a run of either kind, in order.
  for (int at = 0; at < count;) {
    Segments seg;
    const bool q8 = outs[at].q8 != nullptr;
    for (; seg.count < Segments::k_max && at < count && (outs[at].q8 != nullptr) == q8; ++seg.count, ++at) {
      const RowwiseOut& o = outs[at];
      seg.w[seg.count] = q8 ? static_cast<const void*>(o.q8) : static_cast<const void*>(o.w);
      seg.d[seg.count] = o.q8_scales;
      seg.bias[seg.count] = o.bias;
      seg.y[seg.count] = o.y;
      seg.rows[seg.count] = o.rows > 0 ? o.rows : 0;
    }
    rowwise<Epilogue::store>(x, seg, num_tokens, cols, stream, loads, q8);
  }
}

namespace {
void residual(const float* x, const void* w, const uint16_t* d, const float* bias, float* y, int64_t num_tokens,
              int64_t rows, int64_t cols, cudaStream_t stream) {
  Segments seg;
  seg.count = 1;
  seg.w[0] = w;
  seg.d[0] = d;
  seg.bias[0] = bias;
  seg.y[0] = y;
  seg.rows[0] = rows;
  rowwise<Epilogue::add>(x, seg, num_tokens, cols, stream, 4, d != nullptr);
}

void swiglu(const float* x, const void* gate, const uint16_t* gate_d, const void* up, const uint16_t* up_d, float* out,
            int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  Segments seg;  // gate's segment carries the output; up's only its weights (and no bias)
  seg.count = 2;
  seg.w[0] = gate;
  seg.w[1] = up;
  seg.d[0] = gate_d;
  seg.d[1] = up_d;
  seg.y[0] = out;
  seg.rows[0] = seg.rows[1] = rows;
  rowwise<Epilogue::swiglu>(x, seg, num_tokens, cols, stream, 4, gate_d != nullptr);
}
}  // namespace

void matmul_rowwise_residual_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y,
                                  int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  residual(x, w, nullptr, bias, y, num_tokens, rows, cols, stream);
}

void matmul_rowwise_residual_q8_cuda(const float* x, const int8_t* q, const uint16_t* d, const float* bias, float* y,
                                     int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  residual(x, q, d, bias, y, num_tokens, rows, cols, stream);
}

void matmul_rowwise_swiglu_cuda(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out,
                                int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  swiglu(x, gate, nullptr, up, nullptr, out, num_tokens, rows, cols, stream);
}

void matmul_rowwise_swiglu_q8_cuda(const float* x, const int8_t* gate_q, const uint16_t* gate_d, const int8_t* up_q,
                                   const uint16_t* up_d, float* out, int64_t num_tokens, int64_t rows, int64_t cols,
                                   cudaStream_t stream) {
  swiglu(x, gate_q, gate_d, up_q, up_d, out, num_tokens, rows, cols, stream);
}

}  // namespace snap::kernels
