// CUDA twins of the CPU ops in kernels/kernels.h and kernels/attention_paged.h: same
// arguments (device pointers) plus the stream. Each launcher picks the launch shape; the
// kernels are `<op>_kernel` in <op>.cu. Activations are f32 on the device as on the CPU;
// weights and KV are bf16 (f32 accumulation). Launch errors are reported by the CUDA runtime
// (cudaGetLastError after the launch); cuBLAS calls return their status.
#pragma once

#include <cublas_v2.h>

#include "kernels/cuda/cublas_lazy.h"
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_paged.h"

namespace snap::kernels {

// --- norms, rope, activations (f32 activations) --------------------------------------
// y[t, :] = x[t, :] / sqrt(mean(x[t, :]²) + eps) · weight; y may alias x. One block per token.
void rms_norm_cuda(const float* x, const float* weight, float* y, int64_t num_tokens, int64_t hidden_size, float eps,
                   cudaStream_t stream);
// In-place rotate_half RoPE of x[num_tokens, num_heads, head_dim]; inv_freq[head_dim/2] on device
// (rope_inv_freq(cfg) on the host: none, linear and llama3 differ only there).
void rope_cuda(float* x, const int32_t* positions, int64_t num_tokens, int num_heads, int head_dim,
               const float* inv_freq, cudaStream_t stream);
// rope_cuda on q [num_tokens, q_heads, head_dim] and k [num_tokens, k_heads, head_dim] (same
// positions) in one launch: the bits of two rope_cuda calls.
void rope_qk_cuda(float* q, int q_heads, float* k, int k_heads, const int32_t* positions, int64_t num_tokens,
                  int head_dim, const float* inv_freq, cudaStream_t stream);
// out[i] = silu(gate[i]) · up[i]; out may alias gate.
void swiglu_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// out[i] = gelu_tanh(gate[i]) · up[i] (GeGLU, Gemma 3's MLP; geglu_cpu's twin); out may alias gate.
void geglu_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// x[i] += y[i] (the residual stream).
void residual_add_cuda(float* x, const float* y, int64_t n, cudaStream_t stream);
// x[i] *= s (Gemma 3's embedding scale, as LlamaForward::embed multiplies each f32 element).
void scale_cuda(float* x, float s, int64_t n, cudaStream_t stream);

// --- embedding and dtype conversion ----------------------------------------------------
// out[t, :] = f32(table[ids[t], :]) for table[vocab_size, hidden_size] in bf16. An id outside
// [0, vocab_size) gives a row of NaN (never a silent wrong row; the host validates ids first).
void embedding_gather_cuda(const __nv_bfloat16* table, const int32_t* ids, int64_t num_tokens, int64_t hidden_size,
                           int64_t vocab_size, float* out, cudaStream_t stream);
// --- block-format weights (llama.cpp's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K-Q6_K) on the device
// A matrix [rows, cols] in one of ggml's block formats, its blocks split into row-major arrays
// (16-byte aligned quant rows for the GEMV's loads). 32-weight blocks (cols % 32 == 0):
//  - q8_0: quants int8 [rows, cols]; w = d·q (exact in f32);
//  - q4_0: quants [rows, cols / 2] bytes, each block's 16 as in the file (byte j: weight j in the
//    low nibble, weight j + 16 in the high); w = d·(q − 8) (exact);
//  - q4_1: the same nibbles and mins [rows, cols / 32]; w = d·q + m (one f32 rounding, as
//    ggml's dequantizer);
//  - q5_0: the same nibbles and extra = each block's 4 bytes of fifth bits (bit j: weight j);
//    w = d·(q − 16) (exact);
//  - q5_1: q5_0's nibbles and fifth bits, and mins; w = d·q + m (one rounding, as q4_1);
//  scales (and q4_1's mins) f16 bits [rows, cols / 32].
// 256-weight super-blocks (cols % 256 == 0), scales = each super-block's f16 d [rows, cols / 256]:
//  - q4_k: quants [rows, cols / 2] (the file's 128 bytes a super-block: byte 32·g + l holds
//    weight 64·g + l in the low nibble and 64·g + 32 + l in the high), mins = the f16 dmin,
//    extra = the file's 12 bytes of 6-bit sub-block scales and mins; w = (d·sc)·q − dmin·m
//    (one rounding, as ggml's dequantizer);
//  - q6_k: quants [rows, cols · 3 / 4] (the file's ql[128] then qh[64]), extra = the 16 int8
//    sub-block scales; w = d·sc·(q − 32) (exact);
//  - q5_k: quants [rows, cols · 5 / 8] (the file's qh[32] then qs[128]: q4_k's nibbles, and bit
//    2·g (2·g + 1) of qh[l] the fifth bit of weight 64·g + l (+ 32)), mins and extra as q4_k;
//    w = (d·sc)·q − dmin·m (one rounding);
//  - q3_k: quants [rows, cols · 3 / 8] (the file's hmask[32] then qs[64]: bits 2·s.. of qs byte
//    32·g + l are the low two bits of weight 128·g + 32·s + l, bit 4·g + s of hmask[l] its third),
//    extra = the file's 12 bytes of sixteen 6-bit scales (offset 32); w = (d·(sc − 32))·(q − 4)
//    (exact);
//  - q2_k: quants [rows, cols / 4] (the file's qs[64], laid out as q3_k's), mins = the f16 dmin,
//    extra = the file's 16 bytes of 4-bit scale (low) and min (high) per 16 weights;
//    w = (d·sc)·q − dmin·m (one rounding).
enum class BlockFormat : uint8_t { q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k, q5_k, q3_k, q2_k };
struct BlockWeights {
  BlockFormat format = BlockFormat::q8_0;
  const void* quants = nullptr;
  const uint16_t* scales = nullptr;
  const uint16_t* mins = nullptr;    // q4_1, q5_1, q4_k, q5_k, q2_k
  const uint8_t* extra = nullptr;    // q5_0, q5_1 and the K formats
};
#if defined(__CUDACC__)
#define SNAP_HOST_DEVICE __host__ __device__
#else
#define SNAP_HOST_DEVICE
#endif
// Weights per block (the unit of scales): 32, or 256 for the K formats.
SNAP_HOST_DEVICE constexpr int64_t block_format_elems(BlockFormat f) {
  return f >= BlockFormat::q4_k ? 256 : 32;
}
// Bytes of quants, and of extra, in a row of `cols` weights.
SNAP_HOST_DEVICE constexpr int64_t block_quant_row_bytes(BlockFormat f, int64_t cols) {
  switch (f) {
    case BlockFormat::q8_0: return cols;
    case BlockFormat::q6_k: return cols / 4 * 3;
    case BlockFormat::q5_k: return cols / 8 * 5;
    case BlockFormat::q3_k: return cols / 8 * 3;
    case BlockFormat::q2_k: return cols / 4;
    default: return cols / 2;
  }
}
SNAP_HOST_DEVICE constexpr int64_t block_extra_row_bytes(BlockFormat f, int64_t cols) {
  switch (f) {
    case BlockFormat::q5_0:
    case BlockFormat::q5_1: return cols / 32 * 4;
    case BlockFormat::q4_k:
    case BlockFormat::q5_k:
    case BlockFormat::q3_k: return cols / 256 * 12;
    case BlockFormat::q6_k:
    case BlockFormat::q2_k: return cols / 256 * 16;
    default: return 0;
  }
}
SNAP_HOST_DEVICE constexpr bool block_format_has_mins(BlockFormat f) {
  return f == BlockFormat::q4_1 || f == BlockFormat::q5_1 || f == BlockFormat::q4_k || f == BlockFormat::q5_k ||
         f == BlockFormat::q2_k;
}
inline const char* block_format_name(BlockFormat f) {
  switch (f) {
    case BlockFormat::q8_0: return "q8_0";
    case BlockFormat::q4_0: return "q4_0";
    case BlockFormat::q4_1: return "q4_1";
    case BlockFormat::q5_0: return "q5_0";
    case BlockFormat::q5_1: return "q5_1";
    case BlockFormat::q4_k: return "q4_k";
    case BlockFormat::q6_k: return "q6_k";
    case BlockFormat::q5_k: return "q5_k";
    case BlockFormat::q3_k: return "q3_k";
    case BlockFormat::q2_k: return "q2_k";
  }
  return "?";
}
// The same weights, rows [begin, begin + n) of a matrix of `cols` columns.
inline BlockWeights block_rows_from(const BlockWeights& w, int64_t cols, int64_t begin) {
  BlockWeights v = w;
  const int64_t per_row = cols / block_format_elems(w.format);
  v.quants = static_cast<const uint8_t*>(w.quants) + begin * block_quant_row_bytes(w.format, cols);
  v.scales += begin * per_row;
  if (w.mins != nullptr) v.mins += begin * per_row;
  if (w.extra != nullptr) v.extra += begin * block_extra_row_bytes(w.format, cols);
  return v;
}
// embedding_gather_cuda over a block-format table [vocab_size, hidden_size]: out = its weights.
void embedding_gather_blocks_cuda(const BlockWeights& table, const int32_t* ids, int64_t num_tokens,
                                  int64_t hidden_size, int64_t vocab_size, float* out, cudaStream_t stream);
// out[i] = bf16(w[i]), round to nearest even, for the first n weights (whole rows) of a
// block-format matrix: its rows as cuBLAS input for prompt chunks.
void dequant_blocks_to_bf16_cuda(const BlockWeights& w, int64_t n, __nv_bfloat16* out, cudaStream_t stream);
// y[i] = bf16(x[i]), round to nearest even (the cuBLAS GEMM's activation input).
void f32_to_bf16_cuda(const float* x, __nv_bfloat16* y, int64_t n, cudaStream_t stream);
// y[i] = f32(x[i]), exact (a bf16 exchange's result back into the f32 activations).
void bf16_to_f32_cuda(const __nv_bfloat16* x, float* y, int64_t n, cudaStream_t stream);

// --- matmul: y[num_tokens, rows] = x[num_tokens, cols] · wᵀ (+ bias[rows]) -----------------
// w is row-major [rows = out_features, cols = in_features] in bf16, as WeightView.
// Prompt chunks: cuBLAS bf16 x bf16 -> f32 with f32 compute (cublasGemmEx, CUBLAS_COMPUTE_32F).
// x must already be bf16 (f32_to_bf16_cuda). cuBLAS picks its kernel by shape, so a row's bits
// may depend on num_tokens: decode rows use matmul_rowwise_cuda instead. ldy: y's row pitch
// (0: rows), so that a slab of w's rows fills its columns of a wider y.
cublasStatus_t matmul_bf16_cuda(cublasHandle_t handle, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                const float* bias, float* y, int64_t num_tokens, int64_t rows, int64_t cols,
                                cudaStream_t stream, int64_t ldy = 0);
// Decode rows (the twin of matmul_rowwise_cpu): f32 x, bf16 w, f32 accumulation in an order
// fixed by cols alone, so each row's result is bitwise independent of num_tokens and of what
// shares the step (batch invariance). Memory-bound: each weight row is read once per 8 tokens.
// `loads`: 16-byte weight loads each lane keeps in flight (1 or 4; the bits are the same,
// bench_cuda_kernels times both).
void matmul_rowwise_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t num_tokens,
                         int64_t rows, int64_t cols, cudaStream_t stream, int loads = 4);
// The same over block-format weights: each weight is exact in f32 (Q4_1's d·q + m rounds once,
// as ggml's dequantizer), so y is the GEMV over the dequantized matrix up to summation order;
// batch-invariant by the same rule (a lane takes 16 Q8_0 quants or one 32-weight Q4 block per
// 16-byte load, in an order fixed by cols).
void matmul_rowwise_blocks_cuda(const float* x, const BlockWeights& w, const float* bias, float* y, int64_t num_tokens,
                                int64_t rows, int64_t cols, cudaStream_t stream, int loads = 4);
// Fused decode GEMVs: the same per-row code as matmul_rowwise_cuda, several outputs in one launch
// (one launch costs a few µs on the GPU, about what a 4096 × 1024 GEMV reads in). Each output's
// bits equal the separate launches' (the path, vector or scalar, follows cols and the alignment
// of x and of every weight: give aligned bases to keep matmul_rowwise_cuda's path).
//  - multi: outs[i].y [num_tokens, outs[i].rows] = x · outs[i].wᵀ (+ bias), e.g. q, k and v;
//    up to 3 outputs of one weight format per launch (more, or formats mixed: several).
//  - residual: y [num_tokens, rows] += x · wᵀ (+ bias): matmul_rowwise_cuda then residual_add_cuda.
//  - swiglu: out [num_tokens, rows] = SwiGLU(x · gateᵀ, x · upᵀ), a row's gate and up in one
//    warp: two matmul_rowwise_cuda then swiglu_cuda.
struct RowwiseOut {
  const __nv_bfloat16* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t rows = 0;
  BlockWeights blocks;  // blocks.quants set: the weights are in a block format (w unused)
};
void matmul_rowwise_multi_cuda(const float* x, const RowwiseOut* outs, int count, int64_t num_tokens, int64_t cols,
                               cudaStream_t stream, int loads = 4);
void matmul_rowwise_residual_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y,
                                  int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream);
void matmul_rowwise_swiglu_cuda(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out,
                                int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream);
//  - geglu: the same with GeGLU (Gemma 3's MLP): two matmul_rowwise_cuda then geglu_cuda.
void matmul_rowwise_geglu_cuda(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out,
                               int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream);
// Block-format forms of residual, swiglu and geglu (gate and up of one format).
void matmul_rowwise_residual_blocks_cuda(const float* x, const BlockWeights& w, const float* bias, float* y,
                                         int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream);
void matmul_rowwise_swiglu_blocks_cuda(const float* x, const BlockWeights& gate, const BlockWeights& up, float* out,
                                       int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream);
void matmul_rowwise_geglu_blocks_cuda(const float* x, const BlockWeights& gate, const BlockWeights& up, float* out,
                                      int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t stream);

// --- sampling --------------------------------------------------------------------------
// ids[t] = argmax_v logits[t, v] (greedy; lowest id wins ties, NaN never wins; all -inf/NaN -> 0),
// as sample_cpu with temperature 0. One block per row; only num_tokens ids go to the host.
void argmax_cuda(const float* logits, int64_t num_tokens, int64_t vocab_size, int32_t* ids, cudaStream_t stream);

// --- attention over the paged per-KV-head cache --------------------------------------------
// The device form of PagedKv: the same block layout with bf16 K/V, and `heads` a DEVICE array
// of PagedKvHead whose block_table pointers are device pointers. max_length is the host's
// max over heads of heads[g].length (sizes the key splits without reading the device).
struct PagedKvCuda {
  const __nv_bfloat16* k_base = nullptr;  // block b: [block_size, head_dim] at k_base + b*k_block_stride
  const __nv_bfloat16* v_base = nullptr;
  const int32_t* pos_base = nullptr;  // block b: [block_size] at pos_base + b*pos_block_stride
  int64_t k_block_stride = 0;
  int64_t v_block_stride = 0;
  int64_t pos_block_stride = 0;
  int block_size = 0;
  const PagedKvHead* heads = nullptr;  // [num_kv_heads], device memory
  int64_t max_length = 0;
};
// Same semantics as attention_paged_cpu (causal by position, sliding window, GQA, zeros for a
// query with no visible key): q, out [num_tokens, num_heads, head_dim] f32 on the device.
// Few query rows (decode): keys split into parts per head ("flash-decoding", attention_split),
// merged in split order, so long heads use every SM and a row's bits do not depend on the
// other rows. head_dim must be a multiple of 32, at most 256. `workspace` holds the split
// partials: at least attention_paged_cuda_workspace_bytes(...) bytes (0 when unsplit).
// Returns cudaErrorInvalidValue for unsupported shapes or a short workspace, else the launch's
// cudaGetLastError().
// The decode form's key split: with at most 64 query rows per KV head, each head's keys are cut
// into parts of `keys` keys — 512, or the largest power of two down to 64 that still makes at
// least 256 blocks (parts × KV heads), so that a short head (SnapKV's 2048 keys) spreads over
// the SMs as a 128K one does. It depends only on the rows, the KV heads and max_length, so
// every row of a call is cut alike. splits == 1 (keys 0): one pass over every key.
struct AttentionSplit {
  int64_t splits = 1, keys = 0;
};
// The decode form: at most 64 query rows (tokens × the GQA group) per KV head.
inline bool attention_decode_form(int64_t num_tokens, const AttentionParams& p) {
  return p.num_kv_heads > 0 && num_tokens * (p.num_heads / p.num_kv_heads) <= 64;
}
inline AttentionSplit attention_split(int64_t num_tokens, const AttentionParams& p, int64_t max_length) {
  if (!attention_decode_form(num_tokens, p)) return {};
  int64_t keys = 512;
  while (keys > 64 && (max_length + keys - 1) / keys * p.num_kv_heads < 256) keys /= 2;
  if (max_length <= keys) return {};
  return {(max_length + keys - 1) / keys, keys};
}
// Which kernel runs the decode form (the split and the workspace are the same for both):
//  - key_threads (the default): a block holds up to 8 query rows of one KV head; keys stream
//    through shared memory as raw bf16 in aligned chunks of 64, two threads per key score it
//    against every row (so each K element is read from shared memory once per chunk, not once
//    per row), and the weighted sum of V runs with a thread per dimension pair and key class.
//  - row_warps: the prompt-form kernel run on decode rows (a warp per row, a lane per key, K and
//    V staged as f32): every row re-reads the chunk from shared memory. Kept for comparison
//    (bench_cuda_kernels times both; SNAP_DEVICE_DECODE_ATTENTION=row_warps in DeviceForward).
// Both meet attention_paged_cpu within the same tolerance; their bits differ. Within one kernel
// a row's bits depend only on its own query and keys.
// pipelined: key_threads with its K/V chunks copied by cp.async into two shared-memory stages, the
// next chunk in flight while one is computed (where the K/V rows are 16-byte aligned, as the
// pool's are; else key_threads itself): the same bits as key_threads.
enum class DecodeAttention { key_threads, row_warps, pipelined };
inline size_t attention_paged_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, int64_t max_length) {
  const int64_t splits = attention_split(num_tokens, p, max_length).splits;
  if (splits <= 1) return 0;
  return sizeof(float) * static_cast<size_t>(splits * num_tokens * p.num_heads) * (2 + static_cast<size_t>(p.head_dim));
}
cudaError_t attention_paged_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                 const PagedKvCuda& kv, const AttentionParams& p, float* out, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream,
                                 DecodeAttention decode = DecodeAttention::key_threads);

// A decode step of many sequences (continuous batching) in one launch and one merge: row b of
// q/out [num_rows, num_heads, head_dim] is one decode query of its own sequence, at
// q_positions[b], over views[b] (a HOST array of num_rows views of one pool: the same slabs,
// strides and block size; each its own heads and max_length). Each row is cut into the splits
// attention_split(1, p, views[b].max_length) gives it, as attention_paged_cuda cuts it alone,
// and the blocks run the same kernel code on the same values: row b's output is bitwise that of
// attention_paged_cuda(q + b·num_heads·head_dim, q_positions + b, 1, views[b], ...) with the
// same `decode` kernel, whatever the other rows are (key_threads and pipelined launch once per
// 64 rows; row_warps runs the rows one by one). The workspace holds every row's partials in
// row order: attention_decode_rows_workspace_bytes, the sum of the rows' own.
// Returns cudaErrorInvalidValue for unsupported shapes, views of different slabs or a short
// workspace, else the launches' cudaGetLastError().
inline size_t attention_decode_rows_workspace_bytes(int64_t num_rows, const PagedKvCuda* views,
                                                    const AttentionParams& p) {
  size_t total = 0;
  for (int64_t b = 0; b < num_rows; ++b) total += attention_paged_cuda_workspace_bytes(1, p, views[b].max_length);
  return total;
}
// Whether views[0, num_rows) are views of one pool: the same slabs, strides and block size.
inline bool attention_views_share_slabs(const PagedKvCuda* views, int64_t num_rows) {
  for (int64_t b = 1; b < num_rows; ++b) {
    const PagedKvCuda &v = views[b], &kv = views[0];
    if (v.k_base != kv.k_base || v.v_base != kv.v_base || v.pos_base != kv.pos_base ||
        v.k_block_stride != kv.k_block_stride || v.v_block_stride != kv.v_block_stride ||
        v.pos_block_stride != kv.pos_block_stride || v.block_size != kv.block_size)
      return false;
  }
  return true;
}
cudaError_t attention_decode_rows_cuda(const float* q, const int32_t* q_positions, int64_t num_rows,
                                       const PagedKvCuda* views, const AttentionParams& p, float* out,
                                       void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                       DecodeAttention decode = DecodeAttention::key_threads);

// The tensor-core form for prompt chunks: the same semantics on bf16 MMAs (f32 accumulation),
// FlashAttention-2 style. A row's bits depend only on its own query and keys, never on the
// other rows of the call. No workspace; no key splits (many rows: a prompt chunk). Needs what
// attention_prefill_tc_supported says (the device pool's views always have it); otherwise
// cudaErrorInvalidValue. Three kernels (bench_cuda_kernels times each; DeviceForward takes
// SNAP_DEVICE_PROMPT_ATTENTION):
//  - mma (the default; attention_prefill_mma.cu): mma.sync m16n8k16 with S, the softmax and P
//    in registers, K/V through ldmatrix, double-buffered with cp.async. f32-accurate: the f32
//    operands (q·scale, the softmax weights) go in as bf16 hi + lo pairs, two MMAs each, so it
//    meets attention_paged_cpu's reference with the f32 kernel's tolerance (its bits differ).
//  - mma_bf16: the same kernel with q·scale and the weights rounded once to bf16, one MMA each
//    (FlashAttention's precision, half the tensor work); within a bf16 tolerance only.
//  - wmma (attention_prefill_tc.cu): the first tensor-core kernel, WMMA m16n16k16 with S and P
//    through shared memory and synchronous loads; f32-accurate as mma.
enum class PrefillAttention { mma, mma_bf16, wmma };
inline bool attention_prefill_tc_supported(const AttentionParams& p, const PagedKvCuda& kv) {
  return p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0 && p.head_dim % 32 == 0 && p.head_dim >= 32 &&
         p.head_dim <= 256 && kv.block_size > 0 && kv.k_block_stride % 8 == 0 && kv.v_block_stride % 8 == 0 &&
         reinterpret_cast<uintptr_t>(kv.k_base) % 16 == 0 && reinterpret_cast<uintptr_t>(kv.v_base) % 16 == 0;
}
cudaError_t attention_prefill_tc_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                      const PagedKvCuda& kv, const AttentionParams& p, float* out,
                                      cudaStream_t stream, PrefillAttention kernel = PrefillAttention::mma);
// The mma kernels directly (attention_prefill_tc_cuda's mma and mma_bf16, which run 4 warps).
// warps: 4 (64 query rows per block) or 8 (128 rows: half the K/V loads per row; 4 where its
// shared memory would not fit, head_dim ≥ 224 with split operands); else cudaErrorInvalidValue.
// Both give the same bits (a row's bits never depend on the rows beside it).
cudaError_t attention_prefill_mma_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                       const PagedKvCuda& kv, const AttentionParams& p, float* out,
                                       cudaStream_t stream, bool bf16_operands, int warps = 4);

// --- KV cache writes (slot = block · block_size + offset) -------------------------------------
// Appends K/V rows [num_tokens, num_kv_heads, head_dim] f32 as bf16 at the ends of the heads'
// block tables: row (t, g) becomes logical entry heads[g].length − num_tokens + t of head g (the
// DEVICE head table must already hold the new lengths and blocks); pos_base[slot] = positions[t].
// Slabs are [slots, head_dim] bf16 and [slots] int32.
void kv_append_cuda(const float* k_new, const float* v_new, const int32_t* positions, int64_t num_tokens,
                    int num_kv_heads, int head_dim, const PagedKvHead* heads, int block_size, __nv_bfloat16* k_base,
                    __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t stream);
// *word[i] = value[i] for i < count, on the stream: small edits of device buffers (the words
// may lie in different buffers: the views of several sequences) carried in the launch's
// arguments (no host memory to keep alive, no wait). 1.9 KB of arguments.
struct WordEdits {
  static constexpr int k_max = 160;
  int32_t count = 0;
  int32_t* word[k_max];
  int32_t value[k_max];
};
void word_edits_cuda(const WordEdits& edits, cudaStream_t stream);
// A few rows' append in one launch (a decode step: one or more sequences' rows, at most
// KvSlots::k_max): row r of k_new/v_new ([rows, head_dim], r = t · num_kv_heads + g, t a token
// or a sequence's decode row) to slots.slot[r] (the host computes them), pos_base[slot] =
// positions[r / num_kv_heads], and `edits` applied (the views' new block ids and lengths).
// 3 KB of arguments, under the 4 KB every CUDA version takes.
struct KvSlots {
  static constexpr int k_max = 128;
  int32_t count = 0;
  int64_t slot[k_max];
};
void kv_append_slots_cuda(const float* k_new, const float* v_new, const int32_t* positions, int num_kv_heads,
                          int head_dim, const KvSlots& slots, const WordEdits& edits, __nv_bfloat16* k_base,
                          __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t stream);
// Row copies src_slots[i] -> dst_slots[i] (K, V and position); the two sets must not overlap.
void kv_gather_cuda(const int64_t* src_slots, const int64_t* dst_slots, int64_t count, int head_dim,
                    __nv_bfloat16* k_base, __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t stream);

// --- SnapKV selection (one layer, after its prefill) ------------------------------------------
// The twin of snapkv_scores/snapkv_select in worker/kv/selection.h, without the model types:
// budget B, window W, pooling kernel k (odd), max or avg pooling, mean or max over the group.
struct SnapKvCudaParams {
  int64_t budget = 1024;
  int window = 32;
  int kernel = 31;  // as SnapKvParams (worker/kv/selection.h): avg pooling, mean over the group
  bool max_pooling = false;
  bool max_aggregation = false;
};
// q_window: [W, num_heads, head_dim] f32, the queries of positions N−W..N−1 (after RoPE).
// kv: heads of at least num_tokens keys, key j at logical index j (a prefill: position j).
// Writes scores [num_kv_heads][N−W] (pooled, NaN -> −inf) and kept [num_kv_heads][B]: per
// head the top B−W prefix positions by (score desc, position asc) in ascending order, then
// N−W..N−1. Needs N > B > W >= 1, k odd, head_dim <= 256; else cudaErrorInvalidValue (and a
// workspace size of 0). p.scale is not used: 1/sqrt(head_dim) as on the CPU.
size_t snapkv_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp);
cudaError_t snapkv_select_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                               const AttentionParams& p, const SnapKvCudaParams& sp, float* scores, int32_t* kept,
                               void* workspace, size_t workspace_bytes, cudaStream_t stream);

// The pooled scores alone (steps 1-4 of snapkv_select_cuda; what AdaKV selects on): needs
// N > W >= 1, k odd, head_dim <= 256 (budget unused); else cudaErrorInvalidValue / size 0.
size_t snapkv_scores_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp);
cudaError_t snapkv_scores_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                               const AttentionParams& p, const SnapKvCudaParams& sp, float* scores, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream);

// --- AdaKV selection (one layer): the twin of adakv_select (worker/kv/selection.h) ----------
// SnapKV's scores, then each KV head's own top floor(alpha·(B−W)) prefix positions (the
// safeguard), then the layer's remaining num_kv_heads·(B−W) − safeguards slots to the best
// remaining (score desc, KV head asc, position asc) over all heads. kept_ids: [num_kv_heads·
// (B−W)] ascending, each g·(N−W) + j for prefix position j of head g (heads hold different
// counts; the window N−W..N−1 is kept by every head and not listed). scores as
// snapkv_select_cuda. Needs N > B > W >= 1, alpha in [0, 1]; else cudaErrorInvalidValue.
size_t adakv_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp);
cudaError_t adakv_select_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                              const AttentionParams& p, const SnapKvCudaParams& sp, double alpha, float* scores,
                              int32_t* kept_ids, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// --- H2O (one layer): the twins of H2oAccumulator::add / select ------------------------------
// Accumulation over a prefill chunk: q [num_queries, num_heads, head_dim] f32 (after RoPE) at
// positions first_position .. first_position + num_queries − 1; kv holds keys 0 .. the last
// of them at logical index = position (a fresh prefill). For each query head h and key j:
// acc[h·acc_stride + j] += Σ over the chunk's rows i with position ≥ j of softmax_i(j), rows
// in ascending order onto the running value (the CPU's order). workspace: the rows' softmax
// statistics. Needs head_dim <= 256 and acc_stride >= first_position + num_queries.
size_t h2o_accumulate_cuda_workspace_bytes(int64_t num_queries, const AttentionParams& p);
cudaError_t h2o_accumulate_cuda(const float* q, int64_t num_queries, int64_t first_position, const PagedKvCuda& kv,
                                const AttentionParams& p, float* acc, int64_t acc_stride, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream);
// Selection over N accumulated positions: per KV head the group's scores (mean or max over
// its query heads, in order; NaN -> −inf) into scores [num_kv_heads][N], then the top
// (B − recent) of positions 0 .. N−recent−1 by (score desc, position asc). kept_ids:
// [num_kv_heads·(B − recent)] ascending, each g·N + j (the recent N−recent..N−1 not listed).
// Needs N > B >= recent >= 0; else cudaErrorInvalidValue (and a workspace size of 0).
size_t h2o_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, int64_t budget, int64_t recent);
cudaError_t h2o_select_cuda(const float* acc, int64_t acc_stride, int64_t num_tokens, const AttentionParams& p,
                            int64_t budget, int64_t recent, bool max_aggregation, float* scores, int32_t* kept_ids,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace snap::kernels
