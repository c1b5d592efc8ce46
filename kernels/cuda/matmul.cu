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
//    a row in one warp, then SwiGLU; matmul_rowwise_geglu_cuda: GeGLU, Gemma 3's). Each output's
//    bits are those of the separate launches.
//  - block-format weights (…_blocks_cuda, RowwiseOut::blocks: llama.cpp's Q8_0, Q4_0, Q4_1, Q5_0,
//    Q5_1, Q2_K-Q6_K split into arrays, kernels_cuda.h): the same kernels; each weight is computed
//    as ggml's dequantizer does (exact in f32, or Q4_1/Q5_1's d·q + m and Q2_K/Q4_K/Q5_K's
//    (d·sc)·q − dmin·m rounded once), so the sums are those of the same GEMV over the dequantized
//    matrix. A lane takes 16 Q8_0 quants per 16-byte load (columns l·16 + 512·i), or a 32-weight
//    (Q3_K, Q2_K: 64-weight) unit of the others (row_dot_units), the same fixed-order rule.
//    dequant_blocks_to_bf16_cuda feeds cuBLAS for prompt chunks.
#include <type_traits>

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

namespace {
// Weight formats of the row kernels (template arguments): bf16, or 1 + a BlockFormat.
constexpr int k_bf16 = 0;
constexpr int code(BlockFormat f) { return 1 + static_cast<int>(f); }
constexpr int k_q8_0 = code(BlockFormat::q8_0), k_q4_0 = code(BlockFormat::q4_0), k_q4_1 = code(BlockFormat::q4_1),
              k_q5_0 = code(BlockFormat::q5_0), k_q5_1 = code(BlockFormat::q5_1), k_q4_k = code(BlockFormat::q4_k),
              k_q6_k = code(BlockFormat::q6_k), k_q5_k = code(BlockFormat::q5_k), k_q3_k = code(BlockFormat::q3_k),
              k_q2_k = code(BlockFormat::q2_k);
// Weights per lane load of the vector paths' units: 64 for the 2-bit-quant formats (16 bytes of
// qs), else 32.
SNAP_HOST_DEVICE constexpr int unit_elems(int kFmt) { return kFmt == k_q3_k || kFmt == k_q2_k ? 64 : 32; }
SNAP_HOST_DEVICE constexpr BlockFormat block_format(int kFmt) { return static_cast<BlockFormat>(kFmt - 1); }

int format_code(BlockFormat f) { return code(f); }

// Q4_K's 6-bit scale and min of sub-block j (0..7) from its 12 packed bytes, as ggml's
// get_scale_min_k4.
__device__ __forceinline__ void k4_scale_min(const uint8_t* p, int j, float* sc, float* mn) {
  if (j < 4) {
    *sc = static_cast<float>(p[j] & 63);
    *mn = static_cast<float>(p[j + 4] & 63);
  } else {
    *sc = static_cast<float>((p[j + 4] & 15) | ((p[j - 4] >> 6) << 4));
    *mn = static_cast<float>((p[j + 4] >> 4) | ((p[j] >> 6) << 4));
  }
}

// Q3_K's signed scale i (0..15) from its 12 packed bytes: the low four bits in the low (i < 8) or
// high nibble of byte i % 8, the top two in bits 2·(i / 4) of byte 8 + i % 4; offset 32.
__device__ __forceinline__ float k3_scale(const uint8_t* p, int i) {
  const unsigned lo = (p[i & 7] >> (4 * (i >> 3))) & 15u, hi = (p[8 + (i & 3)] >> (2 * (i >> 2))) & 3u;
  return static_cast<float>(static_cast<int>(lo | (hi << 4)) - 32);
}

// The weights of the formats, from their parts, as ggml's dequantizers compute them.
__device__ __forceinline__ float q4_1_weight(float d, float q, float m) { return __fadd_rn(d * q, m); }
// (d·sc)·q − dmin·m: both products exact, one rounding.
__device__ __forceinline__ float q4_k_weight(float d_sc, float q, float m) { return __fsub_rn(d_sc * q, m); }

// The weight w[i] of a row's block data (quants qr, scales dr, mins mr, extra er), i in [0, cols)
// (or a flat index over whole rows: a row is whole blocks).
template <int kFmt>
__device__ __forceinline__ float block_weight(const uint8_t* qr, const uint16_t* dr, const uint16_t* mr,
                                              const uint8_t* er, int64_t i) {
  if constexpr (kFmt == k_q4_k || kFmt == k_q5_k) {
    // Super-block s; its weight 64·g + 32·h + l is nibble h of qs byte 32·g + l (Q5_K: and bit
    // 2·g + h of qh[l] its fifth).
    const int64_t s = i >> 8;
    const int w = static_cast<int>(i & 255), g = w >> 6, h = (w >> 5) & 1, l = w & 31;
    const uint8_t* sb = qr + s * (kFmt == k_q4_k ? 128 : 160);
    const unsigned byte = sb[(kFmt == k_q4_k ? 0 : 32) + g * 32 + l];
    unsigned q = h != 0 ? byte >> 4 : byte & 15u;
    if constexpr (kFmt == k_q5_k) q |= ((sb[l] >> (2 * g + h)) & 1u) << 4;
    float sc, mn;
    k4_scale_min(er + s * 12, 2 * g + h, &sc, &mn);
    return q4_k_weight(f16_bits_to_float(dr[s]) * sc, static_cast<float>(q), f16_bits_to_float(mr[s]) * mn);
  } else if constexpr (kFmt == k_q3_k || kFmt == k_q2_k) {
    // Weight 128·g + 32·j + l (j, l < 32) of a super-block: bits 2·j.. of qs byte 32·g + l (Q3_K:
    // bit 4·g + j of hmask[l] its third, q − 4 when clear); scale (weight / 16).
    const int64_t s = i >> 8;
    const int w = static_cast<int>(i & 255), g = w >> 7, j = (w >> 5) & 3, l = w & 31;
    if constexpr (kFmt == k_q3_k) {
      const uint8_t* sb = qr + s * 96;
      const int q = static_cast<int>((sb[32 + g * 32 + l] >> (2 * j)) & 3u) -
                    (((sb[l] >> (4 * g + j)) & 1u) != 0 ? 0 : 4);
      return f16_bits_to_float(dr[s]) * k3_scale(er + s * 12, w >> 4) * static_cast<float>(q);
    } else {
      const unsigned q = (qr[s * 64 + g * 32 + l] >> (2 * j)) & 3u, sc = er[s * 16 + (w >> 4)];
      return q4_k_weight(f16_bits_to_float(dr[s]) * static_cast<float>(sc & 15u), static_cast<float>(q),
                         f16_bits_to_float(mr[s]) * static_cast<float>(sc >> 4));
    }
  } else if constexpr (kFmt == k_q6_k) {
    // Weight 128·n + 32·k + l (k, l < 32) of a super-block: nibble k / 2 of ql[64·n + 32·(k % 2)
    // + l], high bits 2k.. of qh[32·n + l]; scale 8·n + 2·k + l / 16.
    const int64_t s = i >> 8;
    const int w = static_cast<int>(i & 255), n = w >> 7, k = (w >> 5) & 3, l = w & 31;
    const uint8_t* sb = qr + s * 192;
    const unsigned lo = sb[n * 64 + (k & 1) * 32 + l], hb = sb[128 + n * 32 + l];
    const int q = static_cast<int>(((k >> 1) != 0 ? lo >> 4 : lo & 15u) | (((hb >> (2 * k)) & 3u) << 4)) - 32;
    const auto sc = static_cast<int8_t>(er[s * 16 + n * 8 + 2 * k + l / 16]);
    return f16_bits_to_float(dr[s]) * static_cast<float>(sc) * static_cast<float>(q);
  } else {
    const int64_t b = i >> 5;
    const int j = static_cast<int>(i & 31);
    const float d = f16_bits_to_float(dr[b]);
    if constexpr (kFmt == k_q8_0) return d * static_cast<float>(static_cast<const int8_t*>(static_cast<const void*>(qr))[i]);
    const unsigned byte = qr[b * 16 + (j & 15)];
    const unsigned nib = j < 16 ? byte & 15u : byte >> 4;
    if constexpr (kFmt == k_q4_0) return d * (static_cast<float>(nib) - 8.0f);
    if constexpr (kFmt == k_q5_0 || kFmt == k_q5_1) {
      const unsigned q = nib | (((er[b * 4 + (j >> 3)] >> (j & 7)) & 1u) << 4);
      if constexpr (kFmt == k_q5_1) return q4_1_weight(d, static_cast<float>(q), f16_bits_to_float(mr[b]));
      return d * (static_cast<float>(q) - 16.0f);
    }
    return q4_1_weight(d, static_cast<float>(nib), f16_bits_to_float(mr[b]));
  }
}

// A row's arrays of a block-format matrix.
struct BlockRow {
  const uint8_t* q;
  const uint16_t* d;
  const uint16_t* m;
  const uint8_t* e;
};
template <int kFmt>
__device__ __forceinline__ BlockRow block_row(const void* q, const uint16_t* d, const uint16_t* m, const uint8_t* e,
                                              int64_t r, int64_t cols) {
  constexpr BlockFormat f = block_format(kFmt);
  const int64_t per_row = cols / block_format_elems(f);
  return {static_cast<const uint8_t*>(q) + r * block_quant_row_bytes(f, cols), d + r * per_row,
          m != nullptr ? m + r * per_row : nullptr, e != nullptr ? e + r * block_extra_row_bytes(f, cols) : nullptr};
}
}  // namespace

template <int kFmt>
__global__ void dequant_blocks_bf16_kernel(const uint8_t* q, const uint16_t* d, const uint16_t* m, const uint8_t* e,
                                           int64_t n, __nv_bfloat16* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(block_weight<kFmt>(q, d, m, e, i));
}

namespace {
// Calls fn(std::integral_constant<int, kFmt>{}) with the row kernels' code of format f.
template <typename Fn>
void with_format(BlockFormat f, Fn&& fn) {
  switch (f) {
    case BlockFormat::q8_0: fn(std::integral_constant<int, k_q8_0>{}); break;
    case BlockFormat::q4_0: fn(std::integral_constant<int, k_q4_0>{}); break;
    case BlockFormat::q4_1: fn(std::integral_constant<int, k_q4_1>{}); break;
    case BlockFormat::q5_0: fn(std::integral_constant<int, k_q5_0>{}); break;
    case BlockFormat::q5_1: fn(std::integral_constant<int, k_q5_1>{}); break;
    case BlockFormat::q4_k: fn(std::integral_constant<int, k_q4_k>{}); break;
    case BlockFormat::q6_k: fn(std::integral_constant<int, k_q6_k>{}); break;
    case BlockFormat::q5_k: fn(std::integral_constant<int, k_q5_k>{}); break;
    case BlockFormat::q3_k: fn(std::integral_constant<int, k_q3_k>{}); break;
    case BlockFormat::q2_k: fn(std::integral_constant<int, k_q2_k>{}); break;
  }
}
}  // namespace

void dequant_blocks_to_bf16_cuda(const BlockWeights& w, int64_t n, __nv_bfloat16* out, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  const auto* q = static_cast<const uint8_t*>(w.quants);
  with_format(w.format, [&](auto fmt) {
    constexpr int F = decltype(fmt)::value;
    dequant_blocks_bf16_kernel<F><<<grid, 256, 0, stream>>>(q, w.scales, w.mins, w.extra, n, out);
  });
}

// One block row per token, as embedding_gather_cuda: out = the row's weights.
template <int kFmt>
__global__ void embedding_gather_blocks_kernel(const uint8_t* q, const uint16_t* d, const uint16_t* m, const uint8_t* e,
                                               const int32_t* ids, int64_t hidden_size, int64_t vocab_size, float* out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * hidden_size;
  const bool valid = id >= 0 && id < vocab_size;
  const BlockRow row = block_row<kFmt>(q, d, m, e, valid ? static_cast<int64_t>(id) : 0, hidden_size);
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < hidden_size;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x)
    o[i] = valid ? block_weight<kFmt>(row.q, row.d, row.m, row.e, i) : __int_as_float(0x7fc00000);
}

void embedding_gather_blocks_cuda(const BlockWeights& table, const int32_t* ids, int64_t num_tokens,
                                  int64_t hidden_size, int64_t vocab_size, float* out, cudaStream_t stream) {
  if (num_tokens <= 0 || hidden_size <= 0) return;
  const int64_t xb = (hidden_size + 255) / 256;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(xb < 64 ? xb : 64));
  const auto* q = static_cast<const uint8_t*>(table.quants);
  with_format(table.format, [&](auto fmt) {
    constexpr int F = decltype(fmt)::value;
    embedding_gather_blocks_kernel<F><<<grid, 256, 0, stream>>>(
        q, table.scales, table.mins, table.extra, ids, hidden_size, vocab_size, out);
  });
}

namespace {
// What one launch computes. store: y_i = x·w_iᵀ (+ bias_i) for each segment i (count ≤ k_max),
// the launch's warps over the segments' rows in order; add: y_0 += x·w_0ᵀ (+ bias_0); swiglu
// (geglu): y_0 = SwiGLU(x·w_0ᵀ + b_0, x·w_1ᵀ + b_1) (GeGLU) (gate w_0, up w_1, rows_0 = rows_1 rows).
enum class Epilogue { store, add, swiglu, geglu };
__host__ __device__ constexpr bool gated(Epilogue e) { return e == Epilogue::swiglu || e == Epilogue::geglu; }
struct Segments {
  static constexpr int k_max = 3;
  const void* w[k_max] = {};      // bf16 [rows, cols], or a block format's quants
  const uint16_t* d[k_max] = {};  // block formats: f16 scales, one a block (32 or 256 weights)
  const uint16_t* m[k_max] = {};  // Q4_1, Q5_1, Q4_K, Q5_K, Q2_K: f16 mins (dmin)
  const uint8_t* e[k_max] = {};   // Q5_0, Q5_1 and the K formats: their extra bytes (kernels_cuda.h)
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

// acc[k] += Σ_j wf[j] · x[t0 + k, c + j], j ascending, for the nt tokens (x 16-byte aligned at c).
template <int kN, int kTokens>
__device__ __forceinline__ void fma_tokens(const float (&wf)[kN], const float* x, int64_t cols, int64_t t0, int64_t c,
                                           int nt, float (&acc)[kTokens]) {
#pragma unroll
  for (int k = 0; k < kTokens; ++k) {
    if (k < nt) {
      const float4* xv = reinterpret_cast<const float4*>(x + (t0 + k) * cols + c);
      float s = acc[k];
#pragma unroll
      for (int v = 0; v < kN / 4; ++v) {
        const float4 a = xv[v];
        s = fmaf(wf[4 * v], a.x, s);
        s = fmaf(wf[4 * v + 1], a.y, s);
        s = fmaf(wf[4 * v + 2], a.z, s);
        s = fmaf(wf[4 * v + 3], a.w, s);
      }
      acc[k] = s;
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
      fma_tokens<16, kTokens>(wf, x, cols, t0, c, nt, acc);
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

// row_dot for the formats read 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) or 64 (Q3_K, Q2_K)
// weights per lane load (row arrays br). kVector: lane l takes the row's units l + 32·i, each one 16-byte
// load of quants (Q5_K, Q6_K, Q3_K: and one of their high bits), in ascending i; else lane l takes
// columns l + 32·i.
//  - Q4_0/Q4_1/Q5_0/Q5_1: unit u is block u, its 32 weights in ascending order (eight float4 of x);
//  - Q4_K: unit u is the quant bytes 16·u .. + 15 of the row: super-block s = u / 8, g = u % 8 / 2,
//    h = u % 2; their low nibbles are weights 256·s + 64·g + 16·h + (0..15) (sub-block 2g), the
//    high ones those + 32 (sub-block 2g + 1): the low 16, then the high 16;
//  - Q5_K: as Q4_K (qs bytes 16·(u % 8) .. of super-block u / 8), with qh bytes 16·h .. + 15:
//    bit 2g of each the low weights' fifth, bit 2g + 1 the high ones';
//  - Q6_K: unit u of super-block s = u / 8, n = u % 8 / 4, k = u % 4: ql bytes 64·n + 16·k ..
//    + 15 and qh bytes 32·n + 16·(k % 2) .. + 15; low nibbles (qh bits 2·(k / 2)..) are weights
//    256·s + 128·n + 16·k + (0..15) (scale 8·n + k), high nibbles (qh bits 2·(k / 2) + 4..)
//    those + 64 (scale 8·n + k + 4): the low 16, then the high 16;
//  - Q3_K, Q2_K: 64-weight units, the qs bytes 32·g + 16·h .. + 15 of super-block s = u / 4
//    (g = u % 4 / 2, h = u % 2; Q3_K: and hmask bytes 16·h .. + 15): bits 2·j.. of each are
//    weights 256·s + 128·g + 32·j + 16·h + (0..15) (scale 8·g + 2·j + h; Q3_K's third bits: bit
//    4·g + j of the hmask bytes), in ascending j.
template <int kFmt, bool kVector, int kLoads, int kTokens>
__device__ void row_dot_units(const float* x, const BlockRow& br, int64_t cols, int64_t t0, int nt, int lane,
                              float (&acc)[kTokens]) {
#pragma unroll
  for (int k = 0; k < kTokens; ++k) acc[k] = 0.0f;
  if (kVector) {
    const int64_t units = cols / unit_elems(kFmt);
    // Unit u's quant load (Q5_K, Q6_K, Q3_K: and its high-bits load; the others leave hi zero).
    const auto load = [&](int64_t u, uint4* lo, uint4* hi) {
      if constexpr (kFmt == k_q3_k) {
        const uint8_t* sb = br.q + (u >> 2) * 96;
        *lo = *reinterpret_cast<const uint4*>(sb + 32 + (u & 3) * 16);
        *hi = *reinterpret_cast<const uint4*>(sb + (u & 1) * 16);
      } else if constexpr (kFmt == k_q2_k) {
        *lo = *reinterpret_cast<const uint4*>(br.q + u * 16);
        *hi = uint4{};
      } else if constexpr (kFmt == k_q5_k) {
        const uint8_t* sb = br.q + (u >> 3) * 160;
        *lo = *reinterpret_cast<const uint4*>(sb + 32 + (u & 7) * 16);
        *hi = *reinterpret_cast<const uint4*>(sb + (u & 1) * 16);
      } else if constexpr (kFmt == k_q6_k) {
        const uint8_t* sb = br.q + (u >> 3) * 192;
        const int n = static_cast<int>(u >> 2) & 1, k = static_cast<int>(u & 3);
        *lo = *reinterpret_cast<const uint4*>(sb + n * 64 + k * 16);
        *hi = *reinterpret_cast<const uint4*>(sb + 128 + n * 32 + (k & 1) * 16);
      } else {
        *lo = *reinterpret_cast<const uint4*>(br.q + u * 16);
        *hi = uint4{};
      }
    };
    const auto consume = [&](const uint4& raw, const uint4& raw_hi, int64_t u) {
      const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
      if constexpr (kFmt == k_q3_k || kFmt == k_q2_k) {
        const int64_t s = u >> 2;
        const int g = static_cast<int>(u >> 1) & 1, h = static_cast<int>(u & 1);
        const float d = f16_bits_to_float(br.d[s]);
        const float dmin = kFmt == k_q2_k ? f16_bits_to_float(br.m[s]) : 0.0f;
        const unsigned hwords[4] = {raw_hi.x, raw_hi.y, raw_hi.z, raw_hi.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int sub = 8 * g + 2 * j + h;  // the 16 weights' scale
          float wf[16];
          if constexpr (kFmt == k_q3_k) {
            const float dl = d * k3_scale(br.e + s * 12, sub);
#pragma unroll
            for (int e = 0; e < 16; ++e) {
              const unsigned byte = (words[e >> 2] >> (8 * (e & 3))) & 0xffu;
              const unsigned hb = (hwords[e >> 2] >> (8 * (e & 3))) & 0xffu;
              const int q = static_cast<int>((byte >> (2 * j)) & 3u) - (((hb >> (4 * g + j)) & 1u) != 0 ? 0 : 4);
              wf[e] = dl * static_cast<float>(q);
            }
          } else {
            const unsigned sc = br.e[s * 16 + sub];
            const float dl = d * static_cast<float>(sc & 15u), ml = dmin * static_cast<float>(sc >> 4);
#pragma unroll
            for (int e = 0; e < 16; ++e) {
              const unsigned byte = (words[e >> 2] >> (8 * (e & 3))) & 0xffu;
              wf[e] = q4_k_weight(dl, static_cast<float>((byte >> (2 * j)) & 3u), ml);
            }
          }
          fma_tokens<16, kTokens>(wf, x, cols, t0, s * 256 + g * 128 + j * 32 + h * 16, nt, acc);
        }
      } else if constexpr (kFmt == k_q4_k || kFmt == k_q5_k || kFmt == k_q6_k) {
        float lo[16], hi[16];
        int64_t c;
        if constexpr (kFmt == k_q4_k || kFmt == k_q5_k) {
          const int64_t s = u >> 3;
          const int g = static_cast<int>(u >> 1) & 3;
          c = s * 256 + g * 64 + (u & 1) * 16;
          const float d = f16_bits_to_float(br.d[s]), dmin = f16_bits_to_float(br.m[s]);
          float sc_lo, mn_lo, sc_hi, mn_hi;
          k4_scale_min(br.e + s * 12, 2 * g, &sc_lo, &mn_lo);
          k4_scale_min(br.e + s * 12, 2 * g + 1, &sc_hi, &mn_hi);
          const float dl = d * sc_lo, ml = dmin * mn_lo, dh = d * sc_hi, mh = dmin * mn_hi;
          const unsigned hwords[4] = {raw_hi.x, raw_hi.y, raw_hi.z, raw_hi.w};
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            const unsigned byte = (words[e >> 2] >> (8 * (e & 3))) & 0xffu;
            unsigned ql = byte & 15u, qh = byte >> 4;
            if (kFmt == k_q5_k) {
              const unsigned hb = (hwords[e >> 2] >> (8 * (e & 3))) & 0xffu;
              ql |= ((hb >> (2 * g)) & 1u) << 4;
              qh |= ((hb >> (2 * g + 1)) & 1u) << 4;
            }
            lo[e] = q4_k_weight(dl, static_cast<float>(ql), ml);
            hi[e] = q4_k_weight(dh, static_cast<float>(qh), mh);
          }
        } else {
          const int64_t s = u >> 3;
          const int n = static_cast<int>(u >> 2) & 1, k = static_cast<int>(u & 3), shift = (k >> 1) * 2;
          c = s * 256 + n * 128 + k * 16;
          const float d = f16_bits_to_float(br.d[s]);
          const float dl = d * static_cast<float>(static_cast<int8_t>(br.e[s * 16 + n * 8 + k]));
          const float dh = d * static_cast<float>(static_cast<int8_t>(br.e[s * 16 + n * 8 + k + 4]));
          const unsigned hwords[4] = {raw_hi.x, raw_hi.y, raw_hi.z, raw_hi.w};
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            const unsigned byte = (words[e >> 2] >> (8 * (e & 3))) & 0xffu;
            const unsigned hb = (hwords[e >> 2] >> (8 * (e & 3))) & 0xffu;
            lo[e] = dl * static_cast<float>(static_cast<int>((byte & 15u) | (((hb >> shift) & 3u) << 4)) - 32);
            hi[e] = dh * static_cast<float>(static_cast<int>((byte >> 4) | (((hb >> (shift + 4)) & 3u) << 4)) - 32);
          }
        }
        fma_tokens<16, kTokens>(lo, x, cols, t0, c, nt, acc);
        fma_tokens<16, kTokens>(hi, x, cols, t0, c + (kFmt == k_q6_k ? 64 : 32), nt, acc);
      } else {
        const float d = f16_bits_to_float(br.d[u]);
        const float m = kFmt == k_q4_1 || kFmt == k_q5_1 ? f16_bits_to_float(br.m[u]) : 0.0f;
        const unsigned high = kFmt == k_q5_0 || kFmt == k_q5_1 ? *reinterpret_cast<const unsigned*>(br.e + u * 4) : 0u;
        float wf[32];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
#pragma unroll
          for (int by = 0; by < 4; ++by) {  // byte 4e + by: weight 4e + by (low nibble), 16 + 4e + by (high)
            const int j = 4 * e + by;
            const unsigned byte = (words[e] >> (8 * by)) & 0xffu;
            unsigned lo = byte & 15u, hi = byte >> 4;
            if (kFmt == k_q5_0 || kFmt == k_q5_1) {  // the fifth bits
              lo |= ((high >> j) & 1u) << 4;
              hi |= ((high >> (j + 16)) & 1u) << 4;
            }
            if (kFmt == k_q4_0) {
              wf[j] = d * (static_cast<float>(lo) - 8.0f);
              wf[16 + j] = d * (static_cast<float>(hi) - 8.0f);
            } else if (kFmt == k_q5_0) {
              wf[j] = d * (static_cast<float>(lo) - 16.0f);
              wf[16 + j] = d * (static_cast<float>(hi) - 16.0f);
            } else {  // Q4_1, Q5_1
              wf[j] = q4_1_weight(d, static_cast<float>(lo), m);
              wf[16 + j] = q4_1_weight(d, static_cast<float>(hi), m);
            }
          }
        }
        fma_tokens<32, kTokens>(wf, x, cols, t0, u * 32, nt, acc);
      }
    };
    int64_t u = lane;
    for (; u + (kLoads - 1) * 32 < units; u += kLoads * 32) {
      uint4 raw[kLoads], raw_hi[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) load(u + i * 32, &raw[i], &raw_hi[i]);
#pragma unroll
      for (int i = 0; i < kLoads; ++i) consume(raw[i], raw_hi[i], u + i * 32);
    }
    for (; u < units; u += 32) {
      uint4 raw, raw_hi;
      load(u, &raw, &raw_hi);
      consume(raw, raw_hi, u);
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float wf = block_weight<kFmt>(br.q, br.d, br.m, br.e, c);
#pragma unroll
      for (int k = 0; k < kTokens; ++k)
        if (k < nt) acc[k] = fmaf(wf, x[(t0 + k) * cols + c], acc[k]);
    }
  }
}

// Segment row r's dot products, by format.
template <int kFmt, bool kVector, int kLoads, int kTokens>
__device__ void seg_row_dot(const float* x, const void* w, const uint16_t* d, const uint16_t* m, const uint8_t* e,
                            int64_t r, int64_t cols, int64_t t0, int nt, int lane, float (&acc)[kTokens]) {
  if constexpr (kFmt == k_bf16) {
    row_dot<kVector, kLoads, kTokens>(x, static_cast<const __nv_bfloat16*>(w) + r * cols, cols, t0, nt, lane, acc);
  } else {
    const BlockRow br = block_row<kFmt>(w, d, m, e, r, cols);
    if constexpr (kFmt == k_q8_0)
      row_dot_q8<kVector, kLoads, kTokens>(x, reinterpret_cast<const int8_t*>(br.q), br.d, cols, t0, nt, lane, acc);
    else
      row_dot_units<kFmt, kVector, kLoads, kTokens>(x, br, cols, t0, nt, lane, acc);
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
template <int kFmt, bool kVector, int kLoads, int kTokens, Epilogue kEpi>
__global__ void matmul_rowwise_kernel(const float* x, Segments seg, int64_t num_tokens, int64_t cols) {
  const int lane = threadIdx.x & 31;
  const unsigned groups = static_cast<unsigned>((num_tokens + kTokens - 1) / kTokens);  // 32-bit division below
  const int64_t group = blockIdx.x % groups, row_block = blockIdx.x / groups;
  int64_t r = row_block * k_warps + (threadIdx.x >> 5);
  // The warp's segment, with constant indices only (a dynamic index into the parameter struct
  // would copy it to local memory).
  const void* w = seg.w[0];
  const uint16_t* d = seg.d[0];
  const uint16_t* m = seg.m[0];
  const uint8_t* e = seg.e[0];
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
        m = seg.m[i];
        e = seg.e[i];
        bias = seg.bias[i];
        y = seg.y[i];
        rows = seg.rows[i];
      }
  }
  if (r >= rows) return;
  const int64_t t0 = group * kTokens;
  const int nt = static_cast<int>(num_tokens - t0 < kTokens ? num_tokens - t0 : kTokens);
  float acc[kTokens];
  seg_row_dot<kFmt, kVector, kLoads, kTokens>(x, w, d, m, e, r, cols, t0, nt, lane, acc);
  if constexpr (gated(kEpi)) {
    float up[kTokens];
    seg_row_dot<kFmt, kVector, kLoads, kTokens>(x, seg.w[1], seg.d[1], seg.m[1], seg.e[1], r, cols, t0, nt, lane, up);
#pragma unroll
    for (int k = 0; k < kTokens; ++k) {
      // As the separate launches: gate and up stored with their bias (or + 0), then swiglu_cuda
      // (geglu_cuda), the same expression.
      const float g = warp_sum(acc[k]) + (bias != nullptr ? bias[r] : 0.0f);
      const float u = warp_sum(up[k]) + (seg.bias[1] != nullptr ? seg.bias[1][r] : 0.0f);
      if (lane == 0 && k < nt) {
        float a;
        if constexpr (kEpi == Epilogue::swiglu) {
          a = g / (1.0f + expf(-g)) * u;
        } else {
          constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
          constexpr float k_cubic = 0.044715f;
          const float inner = k_sqrt_2_over_pi * (g + k_cubic * g * g * g);
          a = 0.5f * g * (1.0f + tanhf(inner)) * u;
        }
        y[(t0 + k) * rows + r] = a;
      }
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
template <int kFmt, int kTokens, Epilogue kEpi>
void launch_rowwise(const float* x, const Segments& seg, int64_t total_rows, bool vector, int64_t num_tokens,
                    int64_t cols, cudaStream_t stream, int loads) {
  const dim3 grid(static_cast<unsigned>((total_rows + k_warps - 1) / k_warps * ((num_tokens + kTokens - 1) / kTokens)));
  if (!vector)
    matmul_rowwise_kernel<kFmt, false, 1, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
  else if (loads <= 1)
    matmul_rowwise_kernel<kFmt, true, 1, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
  else
    matmul_rowwise_kernel<kFmt, true, 4, kTokens, kEpi><<<grid, k_warps * 32, 0, stream>>>(x, seg, num_tokens, cols);
}

template <int kFmt, Epilogue kEpi>
void launch_tokens(const float* x, const Segments& seg, int64_t total_rows, bool vector, int64_t num_tokens,
                   int64_t cols, cudaStream_t stream, int loads) {
  if (num_tokens == 1)
    launch_rowwise<kFmt, 1, kEpi>(x, seg, total_rows, vector, num_tokens, cols, stream, loads);
  else
    launch_rowwise<kFmt, k_group_tokens, kEpi>(x, seg, total_rows, vector, num_tokens, cols, stream, loads);
}

// The path: vector when cols is a multiple of a lane's load (8 bf16, 16 Q8_0 quants, a 32-weight
// Q4 block) and x and every weight are 16-byte aligned. fmt: every segment's format.
template <Epilogue kEpi>
void rowwise(const float* x, const Segments& seg, int64_t num_tokens, int64_t cols, cudaStream_t stream, int loads,
             int fmt) {
  int64_t total = 0;
  bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  for (int i = 0; i < seg.count; ++i) {
    total += gated(kEpi) && i > 0 ? 0 : seg.rows[i];
    aligned = aligned && reinterpret_cast<uintptr_t>(seg.w[i]) % 16 == 0;
  }
  if (num_tokens <= 0 || total <= 0) return;
  const bool vector = cols % (fmt == k_bf16 ? 8 : fmt == k_q8_0 ? 16 : 32) == 0 && aligned;
  if (fmt == k_bf16) {
    launch_tokens<k_bf16, kEpi>(x, seg, total, vector, num_tokens, cols, stream, loads);
    return;
  }
  with_format(block_format(fmt), [&](auto c) {
    launch_tokens<decltype(c)::value, kEpi>(x, seg, total, vector, num_tokens, cols, stream, loads);
  });
}

int out_format(const RowwiseOut& o) { return o.blocks.quants != nullptr ? format_code(o.blocks.format) : k_bf16; }
}  // namespace

void matmul_rowwise_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t num_tokens,
                         int64_t rows, int64_t cols, cudaStream_t stream, int loads) {
  const RowwiseOut out{w, bias, y, rows, {}};
  matmul_rowwise_multi_cuda(x, &out, 1, num_tokens, cols, stream, loads);
}

void matmul_rowwise_blocks_cuda(const float* x, const BlockWeights& w, const float* bias, float* y, int64_t num_tokens,
                                int64_t rows, int64_t cols, cudaStream_t stream, int loads) {
  const RowwiseOut out{nullptr, bias, y, rows, w};
  matmul_rowwise_multi_cuda(x, &out, 1, num_tokens, cols, stream, loads);
}

void matmul_rowwise_multi_cuda(const float* x, const RowwiseOut* outs, int count, int64_t num_tokens, int64_t cols,
                               cudaStream_t stream, int loads) {
  // Up to k_max outputs of one format per launch: a run of one format, in order.
  for (int at = 0; at < count;) {
    Segments seg;
    const int fmt = out_format(outs[at]);
    for (; seg.count < Segments::k_max && at < count && out_format(outs[at]) == fmt; ++seg.count, ++at) {
      const RowwiseOut& o = outs[at];
      seg.w[seg.count] = fmt == k_bf16 ? static_cast<const void*>(o.w) : o.blocks.quants;
      seg.d[seg.count] = o.blocks.scales;
      seg.m[seg.count] = o.blocks.mins;
      seg.e[seg.count] = o.blocks.extra;
      seg.bias[seg.count] = o.bias;
      seg.y[seg.count] = o.y;
      seg.rows[seg.count] = o.rows > 0 ? o.rows : 0;
    }
    rowwise<Epilogue::store>(x, seg, num_tokens, cols, stream, loads, fmt);
  }
}

namespace {
// w: a bf16 matrix (blocks null) or the block-format one.
void residual(const float* x, const __nv_bfloat16* w, const BlockWeights* blocks, const float* bias, float* y,
              int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  Segments seg;
  seg.count = 1;
  seg.w[0] = blocks != nullptr ? blocks->quants : static_cast<const void*>(w);
  if (blocks != nullptr) {
    seg.d[0] = blocks->scales;
    seg.m[0] = blocks->mins;
    seg.e[0] = blocks->extra;
  }
  seg.bias[0] = bias;
  seg.y[0] = y;
  seg.rows[0] = rows;
  rowwise<Epilogue::add>(x, seg, num_tokens, cols, stream, 4, blocks != nullptr ? format_code(blocks->format) : k_bf16);
}

template <Epilogue kEpi>
void gated_mlp(const float* x, const void* gate, const void* up, const BlockWeights* gb, const BlockWeights* ub,
               float* out, int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  Segments seg;  // gate's segment carries the output; up's only its weights (and no bias)
  seg.count = 2;
  seg.w[0] = gate;
  seg.w[1] = up;
  if (gb != nullptr) {
    seg.d[0] = gb->scales;
    seg.m[0] = gb->mins;
    seg.e[0] = gb->extra;
    seg.d[1] = ub->scales;
    seg.m[1] = ub->mins;
    seg.e[1] = ub->extra;
  }
  seg.y[0] = out;
  seg.rows[0] = seg.rows[1] = rows;
  rowwise<kEpi>(x, seg, num_tokens, cols, stream, 4, gb != nullptr ? format_code(gb->format) : k_bf16);
}
}  // namespace

void matmul_rowwise_residual_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y,
                                  int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  residual(x, w, nullptr, bias, y, num_tokens, rows, cols, stream);
}

void matmul_rowwise_residual_blocks_cuda(const float* x, const BlockWeights& w, const float* bias, float* y,
                                         int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  residual(x, nullptr, &w, bias, y, num_tokens, rows, cols, stream);
}

void matmul_rowwise_swiglu_cuda(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out,
                                int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  gated_mlp<Epilogue::swiglu>(x, gate, up, nullptr, nullptr, out, num_tokens, rows, cols, stream);
}

void matmul_rowwise_swiglu_blocks_cuda(const float* x, const BlockWeights& gate, const BlockWeights& up, float* out,
                                       int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  gated_mlp<Epilogue::swiglu>(x, gate.quants, up.quants, &gate, &up, out, num_tokens, rows, cols, stream);
}

void matmul_rowwise_geglu_cuda(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out,
                               int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  gated_mlp<Epilogue::geglu>(x, gate, up, nullptr, nullptr, out, num_tokens, rows, cols, stream);
}

void matmul_rowwise_geglu_blocks_cuda(const float* x, const BlockWeights& gate, const BlockWeights& up, float* out,
                                      int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream) {
  gated_mlp<Epilogue::geglu>(x, gate.quants, up.quants, &gate, &up, out, num_tokens, rows, cols, stream);
}

}  // namespace snap::kernels
