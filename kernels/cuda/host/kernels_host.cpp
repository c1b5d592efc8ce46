// CPU twins of kernels/cuda/kernels_cuda.h for the host twin of the runtime (cuda_runtime.h
// here): each launcher checks its shapes as the CUDA launcher does (cudaErrorInvalidValue on
// the same conditions), checks that its pointers are device memory (cudaErrorIllegalAddress
// otherwise), and computes its result with the CPU kernels that tests/cuda uses as the
// references (kernels/cpu, worker/kv/selection.cpp). Results match the GPU's within those
// tests' bounds, not bitwise: these are not the CUDA kernels and verify nothing about them.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <tuple>
#include <vector>

#include "kernels/attention_paged.h"
#include "kernels/cpu/geglu.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/block_split.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "worker/kv/selection.h"
#include "worker/model/dequant.h"

namespace snap::kernels {
namespace {

using hostcuda::require_device;

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();

uint16_t* bits(__nv_bfloat16* p) { return reinterpret_cast<uint16_t*>(p); }
const uint16_t* bits(const __nv_bfloat16* p) { return reinterpret_cast<const uint16_t*>(p); }

size_t f32s(int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 0)) * sizeof(float); }

// The paged device cache as the CPU kernels read it (bf16 K/V), after checking that its head
// table and every block table it will read are device memory.
bool paged_view(const PagedKvCuda& kv, int num_kv_heads, PagedKv* out) {
  if (!require_device(kv.heads, sizeof(PagedKvHead) * static_cast<size_t>(num_kv_heads), "PagedKvCuda::heads"))
    return false;
  for (int g = 0; g < num_kv_heads; ++g) {
    const PagedKvHead& h = kv.heads[g];
    const int64_t blocks = kv.block_size > 0 ? (h.length + kv.block_size - 1) / kv.block_size : 0;
    if (!require_device(h.block_table, sizeof(int32_t) * static_cast<size_t>(blocks), "a KV head's block table"))
      return false;
    if (blocks > 0 && !require_device(kv.k_base, 2, "PagedKvCuda::k_base")) return false;
  }
  out->dtype = DType::bf16;
  out->k_base = kv.k_base;
  out->v_base = kv.v_base;
  out->pos_base = kv.pos_base;
  out->k_block_stride = kv.k_block_stride;
  out->v_block_stride = kv.v_block_stride;
  out->pos_block_stride = kv.pos_block_stride;
  out->block_size = kv.block_size;
  out->heads = kv.heads;
  return true;
}

// Keys 0..n−1 of every KV head (logical index j), as f32 [num_kv_heads][n][head_dim].
std::vector<float> gather_keys(const PagedKvCuda& kv, int num_kv_heads, int head_dim, int64_t n) {
  std::vector<float> k(static_cast<size_t>(num_kv_heads) * n * head_dim);
  for (int g = 0; g < num_kv_heads; ++g) {
    const PagedKvHead& h = kv.heads[g];
    for (int64_t j = 0; j < n && j < h.length; ++j) {
      const int32_t b = h.block_table[j / kv.block_size];
      const uint16_t* row = bits(kv.k_base) + b * kv.k_block_stride + (j % kv.block_size) * head_dim;
      float* dst = k.data() + (static_cast<size_t>(g) * n + j) * head_dim;
      for (int d = 0; d < head_dim; ++d) dst[d] = bf16_to_f32(row[d]);
    }
  }
  return k;
}

bool heads_hold(const PagedKvCuda& kv, int num_kv_heads, int64_t n) {
  for (int g = 0; g < num_kv_heads; ++g)
    if (kv.heads[g].length < n) return false;
  return true;
}

LayerQk layer_qk(const float* q, int64_t num_queries, const std::vector<float>& k, int64_t n, const AttentionParams& p) {
  LayerQk qk;
  qk.q = q;
  qk.num_queries = num_queries;
  qk.k = k.data();
  qk.kv_head_stride = n * p.head_dim;
  qk.num_tokens = n;
  qk.num_heads = p.num_heads;
  qk.num_kv_heads = p.num_kv_heads;
  qk.head_dim = p.head_dim;
  return qk;
}

SnapKvParams snap_params(const SnapKvCudaParams& sp) {
  SnapKvParams s;
  s.budget = sp.budget;
  s.window = sp.window;
  s.kernel = sp.kernel;
  s.pooling = sp.max_pooling ? KvPooling::max : KvPooling::avg;
  s.aggregation = sp.max_aggregation ? GqaAggregation::max : GqaAggregation::mean;
  s.keep_scores = true;
  return s;
}

// The launchers' validity rules (snapkv.cu, adakv.cu, h2o.cu).
bool snap_common_valid(int64_t n, const AttentionParams& p, const SnapKvCudaParams& sp) {
  return p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0 && p.head_dim > 0 && p.head_dim <= 256 &&
         sp.window >= 1 && n > sp.window && sp.kernel >= 1 && sp.kernel % 2 == 1 &&
         n * p.num_kv_heads < (int64_t{1} << 31);
}
bool snap_valid(int64_t n, const AttentionParams& p, const SnapKvCudaParams& sp) {
  return snap_common_valid(n, p, sp) && sp.budget > sp.window && n > sp.budget;
}
bool h2o_shape_ok(const AttentionParams& p) {
  return p.num_kv_heads > 0 && p.num_heads > 0 && p.num_heads % p.num_kv_heads == 0 && p.head_dim > 0 &&
         p.head_dim <= 256;
}
bool h2o_select_valid(int64_t n, const AttentionParams& p, int64_t budget, int64_t recent) {
  return h2o_shape_ok(p) && budget >= 1 && recent >= 0 && recent <= budget && n > budget &&
         n * p.num_kv_heads < (int64_t{1} << 31);
}

// A nominal workspace for the selections: the launchers only check that they got it.
size_t nominal_workspace(int64_t n, const AttentionParams& p) {
  return sizeof(float) * static_cast<size_t>(n) * static_cast<size_t>(p.num_kv_heads) * 4 + 256;
}

}  // namespace

void rms_norm_cuda(const float* x, const float* weight, float* y, int64_t num_tokens, int64_t hidden_size, float eps,
                   cudaStream_t) {
  const size_t bytes = f32s(num_tokens * hidden_size);
  if (!require_device(x, bytes, "rms_norm x") || !require_device(weight, f32s(hidden_size), "rms_norm weight") ||
      !require_device(y, bytes, "rms_norm y"))
    return;
  rms_norm_cpu(x, weight, y, num_tokens, hidden_size, eps);
}

void rope_cuda(float* x, const int32_t* positions, int64_t num_tokens, int num_heads, int head_dim,
               const float* inv_freq, cudaStream_t) {
  if (num_tokens <= 0) return;
  if (!require_device(x, f32s(num_tokens * num_heads * head_dim), "rope x") ||
      !require_device(positions, sizeof(int32_t) * num_tokens, "rope positions") ||
      !require_device(inv_freq, f32s(head_dim / 2), "rope inv_freq"))
    return;
  rope_cpu(x, positions, num_tokens, num_heads, head_dim, inv_freq);
}

void rope_qk_cuda(float* q, int q_heads, float* k, int k_heads, const int32_t* positions, int64_t num_tokens,
                  int head_dim, const float* inv_freq, cudaStream_t stream) {
  rope_cuda(q, positions, num_tokens, q_heads, head_dim, inv_freq, stream);
  rope_cuda(k, positions, num_tokens, k_heads, head_dim, inv_freq, stream);
}

void swiglu_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t) {
  if (!require_device(gate, f32s(n), "swiglu gate") || !require_device(up, f32s(n), "swiglu up") ||
      !require_device(out, f32s(n), "swiglu out"))
    return;
  swiglu_cpu(gate, up, out, n);
}

void geglu_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t) {
  if (!require_device(gate, f32s(n), "geglu gate") || !require_device(up, f32s(n), "geglu up") ||
      !require_device(out, f32s(n), "geglu out"))
    return;
  geglu_cpu(gate, up, out, n);
}

void scale_cuda(float* x, float s, int64_t n, cudaStream_t) {
  if (!require_device(x, f32s(n), "scale x")) return;
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void residual_add_cuda(float* x, const float* y, int64_t n, cudaStream_t) {
  if (!require_device(x, f32s(n), "residual x") || !require_device(y, f32s(n), "residual y")) return;
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void embedding_gather_cuda(const __nv_bfloat16* table, const int32_t* ids, int64_t num_tokens, int64_t hidden_size,
                           int64_t vocab_size, float* out, cudaStream_t) {
  if (!require_device(table, 2 * static_cast<size_t>(vocab_size * hidden_size), "embedding table") ||
      !require_device(ids, sizeof(int32_t) * num_tokens, "embedding ids") ||
      !require_device(out, f32s(num_tokens * hidden_size), "embedding out"))
    return;
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* row = out + t * hidden_size;
    const int32_t id = ids[t];
    if (id < 0 || id >= vocab_size) {
      std::fill(row, row + hidden_size, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const uint16_t* src = bits(table) + static_cast<int64_t>(id) * hidden_size;
    for (int64_t d = 0; d < hidden_size; ++d) row[d] = bf16_to_f32(src[d]);
  }
}

void f32_to_bf16_cuda(const float* x, __nv_bfloat16* y, int64_t n, cudaStream_t) {
  if (!require_device(x, f32s(n), "f32_to_bf16 x") || !require_device(y, 2 * static_cast<size_t>(n), "f32_to_bf16 y"))
    return;
  for (int64_t i = 0; i < n; ++i) bits(y)[i] = f32_to_bf16(x[i]);
}

void bf16_to_f32_cuda(const __nv_bfloat16* x, float* y, int64_t n, cudaStream_t) {
  if (!require_device(x, 2 * static_cast<size_t>(std::max<int64_t>(n, 0)), "bf16_to_f32 x") ||
      !require_device(y, f32s(n), "bf16_to_f32 y"))
    return;
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(bits(x)[i]);
}

cublasStatus_t matmul_bf16_cuda(cublasHandle_t handle, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                const float* bias, float* y, int64_t num_tokens, int64_t rows, int64_t cols,
                                cudaStream_t, int64_t ldy) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (num_tokens <= 0 || rows <= 0) return CUBLAS_STATUS_SUCCESS;
  if (ldy <= 0) ldy = rows;
  if (!require_device(x, 2 * static_cast<size_t>(num_tokens * cols), "GEMM x") ||
      !require_device(w, 2 * static_cast<size_t>(rows * cols), "GEMM w") ||
      (bias && !require_device(bias, f32s(rows), "GEMM bias")) ||
      !require_device(y, f32s((num_tokens - 1) * ldy + rows), "GEMM y"))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  std::vector<float> xf(static_cast<size_t>(num_tokens * cols));
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(bits(x)[i]);
  WeightView wv;
  wv.dtype = DType::bf16;
  wv.data = w;
  wv.rows = rows;
  wv.cols = cols;
  std::vector<float> dense(static_cast<size_t>(num_tokens * rows));
  matmul_cpu(xf.data(), wv, bias, dense.data(), num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t) std::copy_n(dense.data() + t * rows, rows, y + t * ldy);
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
// A block-format matrix (kernels_cuda.h BlockWeights) [rows, cols]: its arrays checked to be
// device memory of their sizes; false (the error set) if not.
bool check_blocks(const BlockWeights& w, int64_t rows, int64_t cols, const char* what) {
  const int64_t nblocks = rows * (cols / block_format_elems(w.format));
  return require_device(w.quants, static_cast<size_t>(rows * block_quant_row_bytes(w.format, cols)), what) &&
         require_device(w.scales, 2 * static_cast<size_t>(nblocks), what) &&
         (!block_format_has_mins(w.format) || require_device(w.mins, 2 * static_cast<size_t>(nblocks), what)) &&
         (block_extra_row_bytes(w.format, cols) == 0 ||
          require_device(w.extra, static_cast<size_t>(rows * block_extra_row_bytes(w.format, cols)), what));
}

// Rows [r0, r0 + n) back in llama.cpp's blocks (common/dtype.h, ggml).
void to_ggml_blocks(const BlockWeights& w, int64_t cols, int64_t r0, int64_t n, std::vector<uint8_t>* out) {
  const int64_t nb = n * (cols / block_format_elems(w.format));
  out->resize(static_cast<size_t>(nb * block_format_ggml_bytes(w.format)));
  join_ggml_blocks(block_rows_from(w, cols, r0), nb, out->data());
}

// Rows [r0, r0 + n) as f32: the CPU's dequantizer (worker/model/dequant.h, bit-exact with the
// gguf package's) on their ggml blocks, the values the CUDA kernels compute.
void block_rows_to_f32(const BlockWeights& w, int64_t cols, int64_t r0, int64_t n, float* out) {
  thread_local std::vector<uint8_t> blocks;
  to_ggml_blocks(w, cols, r0, n, &blocks);
  const Status st = dequantize(ggml_type_of(block_format_dtype(w.format)), blocks.data(), out, n * cols);
  CHECK(st.ok()) << "host twin: " << st.message();
}
}  // namespace

void embedding_gather_blocks_cuda(const BlockWeights& table, const int32_t* ids, int64_t num_tokens,
                                  int64_t hidden_size, int64_t vocab_size, float* out, cudaStream_t) {
  if (num_tokens <= 0 || hidden_size <= 0) return;
  if (!check_blocks(table, vocab_size, hidden_size, "embedding table") ||
      !require_device(ids, sizeof(int32_t) * num_tokens, "embedding ids") ||
      !require_device(out, f32s(num_tokens * hidden_size), "embedding out"))
    return;
  for (int64_t r = 0; r < num_tokens; ++r) {
    float* row = out + r * hidden_size;
    const int32_t id = ids[r];
    if (id < 0 || id >= vocab_size) {
      std::fill(row, row + hidden_size, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    block_rows_to_f32(table, hidden_size, id, 1, row);
  }
}

void dequant_blocks_to_bf16_cuda(const BlockWeights& w, int64_t n, __nv_bfloat16* out, cudaStream_t) {
  if (n <= 0) return;
  if (!check_blocks(w, 1, n, "dequant_blocks input") || !require_device(out, 2 * static_cast<size_t>(n), "dequant_blocks out"))
    return;
  std::vector<float> f(static_cast<size_t>(n));
  block_rows_to_f32(w, n, 0, 1, f.data());
  for (int64_t i = 0; i < n; ++i) bits(out)[i] = f32_to_bf16(f[i]);
}

void matmul_rowwise_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y, int64_t num_tokens,
                         int64_t rows, int64_t cols, cudaStream_t, int) {
  if (num_tokens <= 0 || rows <= 0) return;
  if (!require_device(x, f32s(num_tokens * cols), "matmul_rowwise x") ||
      !require_device(w, 2 * static_cast<size_t>(rows * cols), "matmul_rowwise w") ||
      (bias && !require_device(bias, f32s(rows), "matmul_rowwise bias")) ||
      !require_device(y, f32s(num_tokens * rows), "matmul_rowwise y"))
    return;
  WeightView wv;
  wv.dtype = DType::bf16;
  wv.data = w;
  wv.rows = rows;
  wv.cols = cols;
  matmul_rowwise_cpu(x, wv, bias, y, num_tokens);
}

namespace {
// A block-format matrix as the CPU's kernels read it: llama.cpp's blocks (every format: dtype_cpu_blocks).
struct HostMatrix {
  DType dtype = DType::f32;
  std::vector<uint8_t> bytes;
};

// The matrix w [rows, cols] as a HostMatrix, kept between calls: joining (or dequantizing) the
// whole matrix for every decoded token was most of the twin's decode time. An entry is rebuilt
// when its arrays' tags differ (hostcuda::content_tag: a copy or memset wrote into them, or they
// were freed and allocated again), and every entry is dropped when any device memory is freed,
// so that the cache holds no matrix of freed memory.
// Weights that a kernel rewrites in place between two GEMVs are not seen: nothing does that.
// Shared so that a caller keeps its matrix while another thread's call drops the cache.
std::shared_ptr<const HostMatrix> host_matrix(const BlockWeights& w, int64_t rows, int64_t cols) {
  using Key = std::tuple<const void*, const void*, const void*, const void*, int, int64_t, int64_t>;
  using Tags = std::array<uint64_t, 4>;
  static std::mutex mu;
  static std::map<Key, std::pair<Tags, std::shared_ptr<const HostMatrix>>> cache;
  static uint64_t frees = 0;
  const Key key{w.quants, w.scales, w.mins, w.extra, static_cast<int>(w.format), rows, cols};
  const Tags tags{snap::hostcuda::content_tag(w.quants), snap::hostcuda::content_tag(w.scales),
                  w.mins ? snap::hostcuda::content_tag(w.mins) : 0, w.extra ? snap::hostcuda::content_tag(w.extra) : 0};
  std::lock_guard<std::mutex> lock(mu);
  if (const uint64_t now = snap::hostcuda::free_count(); now != frees) {
    cache.clear();
    frees = now;
  }
  if (auto it = cache.find(key); it != cache.end() && it->second.first == tags) return it->second.second;
  auto m = std::make_shared<HostMatrix>();
  m->dtype = block_format_dtype(w.format);
  static_assert(dtype_cpu_blocks(DType::q2_k) && dtype_cpu_blocks(DType::q5_k), "the CPU reads every block format");
  to_ggml_blocks(w, cols, 0, rows, &m->bytes);
  cache[key] = {tags, m};
  return m;
}

// x · wᵀ (+ bias) over a block-format matrix into out (host memory of num_tokens · rows floats),
// once x, the weights and the bias are checked to be device memory; false (the error set) if
// not. The matrix is put back in llama.cpp's blocks for the CPU's f32-activation kernels (the
// same f32 weight values and f32 activations as the CUDA kernels): below
// k_matmul_gemm_min_tokens_quant tokens its SIMD matvec, which decodes the blocks in registers
// (matmul_gemm_cpu converted the whole matrix to f32 for every decoded token: a one-token
// batch of SmolLM2 on the twin ran at a quarter of the CPU engine's speed), else its converting
// sgemm; in their orders, not the kernels' (their batch invariance is the emulator's to check,
// not the twin's).
bool rowwise_blocks(const float* x, const BlockWeights& w, const float* bias, float* out, int64_t num_tokens,
                    int64_t rows, int64_t cols, const char* what) {
  if (!check_blocks(w, rows, cols, what) || !require_device(x, f32s(num_tokens * cols), what) ||
      (bias && !require_device(bias, f32s(rows), what)))
    return false;
  const std::shared_ptr<const HostMatrix> m = host_matrix(w, rows, cols);
  const WeightView wv{m->dtype, m->bytes.data(), rows, cols};
  if (num_tokens < k_matmul_gemm_min_tokens_quant)
    matmul_matvec_f32act_cpu(x, wv, bias, out, num_tokens);
  else
    matmul_gemm_cpu(x, wv, bias, out, num_tokens);
  return true;
}
}  // namespace

void matmul_rowwise_blocks_cuda(const float* x, const BlockWeights& w, const float* bias, float* y, int64_t num_tokens,
                                int64_t rows, int64_t cols, cudaStream_t, int) {
  if (num_tokens <= 0 || rows <= 0) return;
  if (!require_device(y, f32s(num_tokens * rows), "matmul_rowwise_blocks y")) return;
  rowwise_blocks(x, w, bias, y, num_tokens, rows, cols, "matmul_rowwise_blocks inputs");
}

void matmul_rowwise_multi_cuda(const float* x, const RowwiseOut* outs, int count, int64_t num_tokens, int64_t cols,
                               cudaStream_t stream, int loads) {
  for (int i = 0; i < count; ++i) {
    if (outs[i].blocks.quants != nullptr)
      matmul_rowwise_blocks_cuda(x, outs[i].blocks, outs[i].bias, outs[i].y, num_tokens, outs[i].rows, cols, stream,
                                 loads);
    else
      matmul_rowwise_cuda(x, outs[i].w, outs[i].bias, outs[i].y, num_tokens, outs[i].rows, cols, stream, loads);
  }
}

void matmul_rowwise_residual_blocks_cuda(const float* x, const BlockWeights& w, const float* bias, float* y,
                                         int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t) {
  if (num_tokens <= 0 || rows <= 0) return;
  if (!require_device(y, f32s(num_tokens * rows), "matmul_rowwise_residual_blocks y")) return;
  std::vector<float> part(static_cast<size_t>(num_tokens * rows));
  if (!rowwise_blocks(x, w, bias, part.data(), num_tokens, rows, cols, "matmul_rowwise_residual_blocks inputs")) return;
  for (size_t i = 0; i < part.size(); ++i) y[i] += part[i];
}

namespace {
void gated_blocks(const float* x, const BlockWeights& gate, const BlockWeights& up, float* out, int64_t num_tokens,
                  int64_t rows, int64_t cols, bool geglu) {
  if (num_tokens <= 0 || rows <= 0) return;
  if (!require_device(out, f32s(num_tokens * rows), "matmul_rowwise gated blocks out")) return;
  std::vector<float> g(static_cast<size_t>(num_tokens * rows)), u(g.size());
  if (!rowwise_blocks(x, gate, nullptr, g.data(), num_tokens, rows, cols, "matmul_rowwise gated blocks gate") ||
      !rowwise_blocks(x, up, nullptr, u.data(), num_tokens, rows, cols, "matmul_rowwise gated blocks up"))
    return;
  if (geglu)
    geglu_cpu(g.data(), u.data(), out, static_cast<int64_t>(g.size()));
  else
    swiglu_cpu(g.data(), u.data(), out, static_cast<int64_t>(g.size()));
}
}  // namespace

void matmul_rowwise_swiglu_blocks_cuda(const float* x, const BlockWeights& gate, const BlockWeights& up, float* out,
                                       int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t) {
  gated_blocks(x, gate, up, out, num_tokens, rows, cols, false);
}

void matmul_rowwise_geglu_blocks_cuda(const float* x, const BlockWeights& gate, const BlockWeights& up, float* out,
                                      int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t) {
  gated_blocks(x, gate, up, out, num_tokens, rows, cols, true);
}

void matmul_rowwise_residual_cuda(const float* x, const __nv_bfloat16* w, const float* bias, float* y,
                                  int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t) {
  if (num_tokens <= 0 || rows <= 0) return;
  if (!require_device(x, f32s(num_tokens * cols), "matmul_rowwise_residual x") ||
      !require_device(w, 2 * static_cast<size_t>(rows * cols), "matmul_rowwise_residual w") ||
      (bias && !require_device(bias, f32s(rows), "matmul_rowwise_residual bias")) ||
      !require_device(y, f32s(num_tokens * rows), "matmul_rowwise_residual y"))
    return;
  std::vector<float> part(static_cast<size_t>(num_tokens * rows));
  matmul_rowwise_cpu(x, WeightView{DType::bf16, w, rows, cols}, bias, part.data(), num_tokens);
  for (size_t i = 0; i < part.size(); ++i) y[i] += part[i];
}

namespace {
// The twin of the fused gate/up GEMVs with SwiGLU (geglu false) or GeGLU.
void gated_bf16(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out, int64_t num_tokens,
                int64_t rows, int64_t cols, bool geglu) {
  if (num_tokens <= 0 || rows <= 0) return;
  if (!require_device(x, f32s(num_tokens * cols), "matmul_rowwise gated x") ||
      !require_device(gate, 2 * static_cast<size_t>(rows * cols), "matmul_rowwise gated gate") ||
      !require_device(up, 2 * static_cast<size_t>(rows * cols), "matmul_rowwise gated up") ||
      !require_device(out, f32s(num_tokens * rows), "matmul_rowwise gated out"))
    return;
  std::vector<float> g(static_cast<size_t>(num_tokens * rows)), u(g.size());
  matmul_rowwise_cpu(x, WeightView{DType::bf16, gate, rows, cols}, nullptr, g.data(), num_tokens);
  matmul_rowwise_cpu(x, WeightView{DType::bf16, up, rows, cols}, nullptr, u.data(), num_tokens);
  if (geglu)
    geglu_cpu(g.data(), u.data(), out, static_cast<int64_t>(g.size()));
  else
    swiglu_cpu(g.data(), u.data(), out, static_cast<int64_t>(g.size()));
}
}  // namespace

void matmul_rowwise_swiglu_cuda(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out,
                                int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t) {
  gated_bf16(x, gate, up, out, num_tokens, rows, cols, false);
}

void matmul_rowwise_geglu_cuda(const float* x, const __nv_bfloat16* gate, const __nv_bfloat16* up, float* out,
                               int64_t num_tokens, int64_t rows, int64_t cols, cudaStream_t) {
  gated_bf16(x, gate, up, out, num_tokens, rows, cols, true);
}

void argmax_cuda(const float* logits, int64_t num_tokens, int64_t vocab_size, int32_t* ids, cudaStream_t) {
  if (num_tokens <= 0) return;
  if (!require_device(logits, f32s(num_tokens * vocab_size), "argmax logits") ||
      !require_device(ids, sizeof(int32_t) * num_tokens, "argmax ids"))
    return;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits + t * vocab_size;
    float bv = k_neg_inf;
    int64_t bi = -1;
    for (int64_t i = 0; i < vocab_size; ++i)
      if (row[i] > bv) {  // strict: the lowest id of equal values; NaN never compares greater
        bv = row[i];
        bi = i;
      }
    ids[t] = static_cast<int32_t>(bi < 0 ? 0 : bi);
  }
}

namespace {
// Both attention launchers' twin once their shapes are checked: q, positions and out must be
// device memory and the view readable; split_lengths (attention_paged_cuda, whose max_length
// sizes the key splits): no head longer than max_length. Then the CPU attention.
cudaError_t cpu_attention(const float* q, const int32_t* q_positions, int64_t num_tokens, const PagedKvCuda& kv,
                          const AttentionParams& p, float* out, bool split_lengths) {
  const size_t rows = f32s(num_tokens * p.num_heads * p.head_dim);
  PagedKv view;
  if (!require_device(q, rows, "attention q") ||
      !require_device(q_positions, sizeof(int32_t) * num_tokens, "attention q_positions") ||
      !require_device(out, rows, "attention out") || !paged_view(kv, p.num_kv_heads, &view))
    return cudaErrorIllegalAddress;
  for (int g = 0; g < p.num_kv_heads && split_lengths; ++g)
    if (kv.heads[g].length > kv.max_length) return cudaErrorInvalidValue;
  attention_paged_cpu(q, q_positions, num_tokens, view, p, out);
  return cudaSuccess;
}
}  // namespace

cudaError_t attention_paged_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                 const PagedKvCuda& kv, const AttentionParams& p, float* out, void* workspace,
                                 size_t workspace_bytes, cudaStream_t, DecodeAttention) {
  if (num_tokens <= 0) return cudaSuccess;
  if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.head_dim % 32 != 0 || p.head_dim < 32 ||
      p.head_dim > 256 || kv.block_size <= 0 ||
      workspace_bytes < attention_paged_cuda_workspace_bytes(num_tokens, p, kv.max_length) ||
      attention_split(num_tokens, p, kv.max_length).splits > 65535)
    return cudaErrorInvalidValue;
  if (workspace_bytes > 0 && !require_device(workspace, workspace_bytes, "attention workspace"))
    return cudaErrorIllegalAddress;
  return cpu_attention(q, q_positions, num_tokens, kv, p, out, true);
}

cudaError_t attention_decode_rows_cuda(const float* q, const int32_t* q_positions, int64_t num_rows,
                                       const PagedKvCuda* views, const AttentionParams& p, float* out,
                                       void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                       DecodeAttention decode) {
  if (num_rows <= 0) return cudaSuccess;
  if (!attention_views_share_slabs(views, num_rows)) return cudaErrorInvalidValue;
  if (workspace_bytes < attention_decode_rows_workspace_bytes(num_rows, views, p)) return cudaErrorInvalidValue;
  const int64_t qd = int64_t{p.num_heads} * p.head_dim;
  char* ws = static_cast<char*>(workspace);
  for (int64_t b = 0; b < num_rows; ++b) {  // row b alone, in its own part of the workspace
    const size_t own = attention_paged_cuda_workspace_bytes(1, p, views[b].max_length);
    const cudaError_t e = attention_paged_cuda(q + b * qd, q_positions + b, 1, views[b], p, out + b * qd,
                                               own > 0 ? ws : nullptr, own, stream, decode);
    if (e != cudaSuccess) return e;
    ws += own;
  }
  return cudaSuccess;
}

// The tensor-core kernels' twin: the CPU attention (mma and wmma are f32-accurate; mma_bf16's
// twin is as exact, more so than the kernel).
cudaError_t attention_prefill_mma_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                       const PagedKvCuda& kv, const AttentionParams& p, float* out, cudaStream_t,
                                       bool, int warps) {
  if (num_tokens <= 0) return cudaSuccess;
  if (!attention_prefill_tc_supported(p, kv) || (warps != 4 && warps != 8)) return cudaErrorInvalidValue;
  return cpu_attention(q, q_positions, num_tokens, kv, p, out, false);
}
cudaError_t attention_prefill_tc_cuda(const float* q, const int32_t* q_positions, int64_t num_tokens,
                                      const PagedKvCuda& kv, const AttentionParams& p, float* out,
                                      cudaStream_t stream, PrefillAttention) {
  return attention_prefill_mma_cuda(q, q_positions, num_tokens, kv, p, out, stream, false);
}

namespace {
// Row r of the new K/V as bf16 into `slot` with its position, after checking the slab rows are
// device memory (false, the error set, when not).
bool append_row(const float* k_new, const float* v_new, int64_t r, int32_t position, int64_t slot, int head_dim,
                __nv_bfloat16* k_base, __nv_bfloat16* v_base, int32_t* pos_base) {
  uint16_t* kd = bits(k_base) + slot * head_dim;
  uint16_t* vd = bits(v_base) + slot * head_dim;
  if (!require_device(kd, 2 * static_cast<size_t>(head_dim), "KV append: K slab row") ||
      !require_device(vd, 2 * static_cast<size_t>(head_dim), "KV append: V slab row") ||
      !require_device(pos_base + slot, 4, "KV append: position slab"))
    return false;
  for (int d = 0; d < head_dim; ++d) {
    kd[d] = f32_to_bf16(k_new[r * head_dim + d]);
    vd[d] = f32_to_bf16(v_new[r * head_dim + d]);
  }
  pos_base[slot] = position;
  return true;
}
}  // namespace

void kv_append_cuda(const float* k_new, const float* v_new, const int32_t* positions, int64_t num_tokens,
                    int num_kv_heads, int head_dim, const PagedKvHead* heads, int block_size, __nv_bfloat16* k_base,
                    __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t) {
  if (num_tokens <= 0) return;
  const size_t rows = f32s(num_tokens * num_kv_heads * head_dim);
  if (!require_device(k_new, rows, "kv_append k") || !require_device(v_new, rows, "kv_append v") ||
      !require_device(positions, sizeof(int32_t) * num_tokens, "kv_append positions") ||
      !require_device(heads, sizeof(PagedKvHead) * num_kv_heads, "kv_append heads"))
    return;
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int g = 0; g < num_kv_heads; ++g) {
      const int64_t j = heads[g].length - num_tokens + t;
      if (j < 0 || !require_device(heads[g].block_table + j / block_size, 4, "kv_append block table")) return;
      const int64_t slot = int64_t{heads[g].block_table[j / block_size]} * block_size + j % block_size;
      if (!append_row(k_new, v_new, t * num_kv_heads + g, positions[t], slot, head_dim, k_base, v_base, pos_base)) return;
    }
}

void kv_append_slots_cuda(const float* k_new, const float* v_new, const int32_t* positions, int num_kv_heads,
                          int head_dim, const KvSlots& slots, const WordEdits& edits, __nv_bfloat16* k_base,
                          __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t stream) {
  word_edits_cuda(edits, stream);
  if (slots.count <= 0) return;
  const size_t rows = f32s(int64_t{slots.count} * head_dim);
  if (!require_device(k_new, rows, "kv_append_slots k") || !require_device(v_new, rows, "kv_append_slots v") ||
      !require_device(positions, sizeof(int32_t) * ((slots.count + num_kv_heads - 1) / num_kv_heads),
                      "kv_append_slots positions"))
    return;
  for (int r = 0; r < slots.count; ++r)
    if (!append_row(k_new, v_new, r, positions[r / num_kv_heads], slots.slot[r], head_dim, k_base, v_base, pos_base))
      return;
}

void word_edits_cuda(const WordEdits& edits, cudaStream_t) {
  for (int i = 0; i < edits.count; ++i) {
    if (!require_device(edits.word[i], 4, "word_edits word")) return;
    *edits.word[i] = edits.value[i];
  }
}

void kv_gather_cuda(const int64_t* src_slots, const int64_t* dst_slots, int64_t count, int head_dim,
                    __nv_bfloat16* k_base, __nv_bfloat16* v_base, int32_t* pos_base, cudaStream_t) {
  if (count <= 0) return;
  if (!require_device(src_slots, sizeof(int64_t) * count, "kv_gather src slots") ||
      !require_device(dst_slots, sizeof(int64_t) * count, "kv_gather dst slots"))
    return;
  const size_t row = 2 * static_cast<size_t>(head_dim);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t s = src_slots[i], d = dst_slots[i];
    if (!require_device(bits(k_base) + s * head_dim, row, "kv_gather K source") ||
        !require_device(bits(k_base) + d * head_dim, row, "kv_gather K destination") ||
        !require_device(bits(v_base) + s * head_dim, row, "kv_gather V source") ||
        !require_device(bits(v_base) + d * head_dim, row, "kv_gather V destination") ||
        !require_device(pos_base + s, 4, "kv_gather position source") ||
        !require_device(pos_base + d, 4, "kv_gather position destination"))
      return;
    std::memcpy(bits(k_base) + d * head_dim, bits(k_base) + s * head_dim, row);
    std::memcpy(bits(v_base) + d * head_dim, bits(v_base) + s * head_dim, row);
    pos_base[d] = pos_base[s];
  }
}

// --- selections: gather the keys, run worker/kv/selection.cpp, write the device layouts ----
namespace {

// Checks the inputs every selection reads; the keys of 0..n−1 in f32 when they pass.
cudaError_t selection_inputs(const float* q_window, int64_t num_queries, const PagedKvCuda& kv, int64_t n,
                             const AttentionParams& p, std::vector<float>* keys) {
  PagedKv view;
  if (!require_device(q_window, f32s(num_queries * p.num_heads * p.head_dim), "selection queries") ||
      !paged_view(kv, p.num_kv_heads, &view))
    return cudaErrorIllegalAddress;
  if (!heads_hold(kv, p.num_kv_heads, n)) return cudaErrorInvalidValue;
  *keys = gather_keys(kv, p.num_kv_heads, p.head_dim, n);
  return cudaSuccess;
}

void write_scores(const std::vector<std::vector<float>>& s, int64_t per_head, float* scores) {
  for (size_t g = 0; g < s.size(); ++g)
    for (int64_t j = 0; j < per_head; ++j) {
      const float v = s[g][j];
      scores[g * per_head + j] = std::isnan(v) ? k_neg_inf : v;
    }
}

}  // namespace

size_t snapkv_scores_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp) {
  return snap_common_valid(num_tokens, p, sp) ? nominal_workspace(num_tokens, p) : 0;
}

cudaError_t snapkv_scores_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                               const AttentionParams& p, const SnapKvCudaParams& sp, float* scores, void* workspace,
                               size_t workspace_bytes, cudaStream_t) {
  if (!snap_common_valid(num_tokens, p, sp)) return cudaErrorInvalidValue;
  if (workspace_bytes < snapkv_scores_cuda_workspace_bytes(num_tokens, p, sp)) return cudaErrorInvalidValue;
  const int64_t prefix = num_tokens - sp.window;
  if (!require_device(workspace, workspace_bytes, "snapkv workspace") ||
      !require_device(scores, f32s(p.num_kv_heads * prefix), "snapkv scores"))
    return cudaErrorIllegalAddress;
  std::vector<float> keys;
  if (const cudaError_t e = selection_inputs(q_window, sp.window, kv, num_tokens, p, &keys); e != cudaSuccess) return e;
  SnapKvCudaParams any = sp;
  any.budget = num_tokens - 1;  // the scores need no budget
  auto s = snapkv_scores(layer_qk(q_window, sp.window, keys, num_tokens, p), snap_params(any));
  if (!s.ok()) return cudaErrorInvalidValue;
  write_scores(*s, prefix, scores);
  return cudaSuccess;
}

size_t snapkv_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp) {
  return snap_valid(num_tokens, p, sp) ? nominal_workspace(num_tokens, p) : 0;
}

cudaError_t snapkv_select_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                               const AttentionParams& p, const SnapKvCudaParams& sp, float* scores, int32_t* kept,
                               void* workspace, size_t workspace_bytes, cudaStream_t) {
  if (!snap_valid(num_tokens, p, sp)) return cudaErrorInvalidValue;
  if (workspace_bytes < snapkv_select_cuda_workspace_bytes(num_tokens, p, sp)) return cudaErrorInvalidValue;
  const int64_t prefix = num_tokens - sp.window;
  if (!require_device(workspace, workspace_bytes, "snapkv workspace") ||
      !require_device(scores, f32s(p.num_kv_heads * prefix), "snapkv scores") ||
      !require_device(kept, sizeof(int32_t) * p.num_kv_heads * sp.budget, "snapkv kept"))
    return cudaErrorIllegalAddress;
  std::vector<float> keys;
  if (const cudaError_t e = selection_inputs(q_window, sp.window, kv, num_tokens, p, &keys); e != cudaSuccess) return e;
  auto sel = snapkv_select(layer_qk(q_window, sp.window, keys, num_tokens, p), snap_params(sp));
  if (!sel.ok()) return cudaErrorInvalidValue;
  write_scores(sel->scores, prefix, scores);
  for (int g = 0; g < p.num_kv_heads; ++g) {
    const auto& k = sel->kept[g];
    if (static_cast<int64_t>(k.size()) != sp.budget) return cudaErrorInvalidValue;
    std::copy(k.begin(), k.end(), kept + g * sp.budget);
  }
  return cudaSuccess;
}

size_t adakv_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp) {
  return snap_valid(num_tokens, p, sp) ? nominal_workspace(num_tokens, p) : 0;
}

cudaError_t adakv_select_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                              const AttentionParams& p, const SnapKvCudaParams& sp, double alpha, float* scores,
                              int32_t* kept_ids, void* workspace, size_t workspace_bytes, cudaStream_t) {
  if (!(alpha >= 0.0 && alpha <= 1.0) || !snap_valid(num_tokens, p, sp)) return cudaErrorInvalidValue;
  if (workspace_bytes < adakv_select_cuda_workspace_bytes(num_tokens, p, sp)) return cudaErrorInvalidValue;
  const int64_t prefix = num_tokens - sp.window, slots = p.num_kv_heads * (sp.budget - sp.window);
  if (!require_device(workspace, workspace_bytes, "adakv workspace") ||
      !require_device(scores, f32s(p.num_kv_heads * prefix), "adakv scores") ||
      !require_device(kept_ids, sizeof(int32_t) * slots, "adakv kept_ids"))
    return cudaErrorIllegalAddress;
  std::vector<float> keys;
  if (const cudaError_t e = selection_inputs(q_window, sp.window, kv, num_tokens, p, &keys); e != cudaSuccess) return e;
  AdaKvParams ap;
  ap.snap = snap_params(sp);
  ap.alpha = alpha;
  auto sel = adakv_select(layer_qk(q_window, sp.window, keys, num_tokens, p), ap);
  if (!sel.ok()) return cudaErrorInvalidValue;
  write_scores(sel->scores, prefix, scores);
  int64_t out = 0;
  for (int g = 0; g < p.num_kv_heads; ++g)
    for (int32_t j : sel->kept[g])
      if (j < prefix) {  // the window is kept by every head and not listed
        if (out == slots) return cudaErrorInvalidValue;
        kept_ids[out++] = static_cast<int32_t>(g * prefix + j);
      }
  return out == slots ? cudaSuccess : cudaErrorInvalidValue;
}

size_t h2o_accumulate_cuda_workspace_bytes(int64_t num_queries, const AttentionParams& p) {
  if (!h2o_shape_ok(p) || num_queries < 1) return 0;
  return 2 * sizeof(float) * static_cast<size_t>(num_queries) * p.num_heads;
}

cudaError_t h2o_accumulate_cuda(const float* q, int64_t num_queries, int64_t first_position, const PagedKvCuda& kv,
                                const AttentionParams& p, float* acc, int64_t acc_stride, void* workspace,
                                size_t workspace_bytes, cudaStream_t) {
  if (!h2o_shape_ok(p) || num_queries < 1 || first_position < 0 || acc_stride < first_position + num_queries ||
      workspace_bytes < h2o_accumulate_cuda_workspace_bytes(num_queries, p))
    return cudaErrorInvalidValue;
  const int64_t end = first_position + num_queries;
  if (!require_device(workspace, workspace_bytes, "h2o workspace") ||
      !require_device(acc, f32s((p.num_heads - 1) * acc_stride + end), "h2o accumulator"))
    return cudaErrorIllegalAddress;
  std::vector<float> keys;
  if (const cudaError_t e = selection_inputs(q, num_queries, kv, end, p, &keys); e != cudaSuccess) return e;
  const int hd = p.head_dim, group = p.num_heads / p.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> s(static_cast<size_t>(end));
  for (int h = 0; h < p.num_heads; ++h) {
    const float* kh = keys.data() + static_cast<size_t>(h / group) * end * hd;
    float* a = acc + h * acc_stride;
    for (int64_t i = 0; i < num_queries; ++i) {  // rows in ascending order onto the running sums
      const float* qi = q + (i * p.num_heads + h) * hd;
      const int64_t visible = first_position + i + 1;  // keys 0 .. the row's own position
      float mx = k_neg_inf;
      for (int64_t j = 0; j < visible; ++j) {
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot += qi[d] * kh[j * hd + d];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < visible; ++j) a[j] += s[j] * inv;
    }
  }
  return cudaSuccess;
}

size_t h2o_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, int64_t budget, int64_t recent) {
  return h2o_select_valid(num_tokens, p, budget, recent) ? nominal_workspace(num_tokens, p) : 0;
}

cudaError_t h2o_select_cuda(const float* acc, int64_t acc_stride, int64_t num_tokens, const AttentionParams& p,
                            int64_t budget, int64_t recent, bool max_aggregation, float* scores, int32_t* kept_ids,
                            void* workspace, size_t workspace_bytes, cudaStream_t) {
  if (!h2o_select_valid(num_tokens, p, budget, recent) || acc_stride < num_tokens) return cudaErrorInvalidValue;
  if (workspace_bytes < h2o_select_cuda_workspace_bytes(num_tokens, p, budget, recent)) return cudaErrorInvalidValue;
  const int nkv = p.num_kv_heads, group = p.num_heads / nkv;
  const int64_t keep = budget - recent, candidates = num_tokens - recent;
  if (!require_device(workspace, workspace_bytes, "h2o workspace") ||
      !require_device(acc, f32s((p.num_heads - 1) * acc_stride + num_tokens), "h2o accumulator") ||
      !require_device(scores, f32s(nkv * num_tokens), "h2o scores") ||
      (keep > 0 && !require_device(kept_ids, sizeof(int32_t) * nkv * keep, "h2o kept_ids")))
    return cudaErrorIllegalAddress;
  for (int g = 0; g < nkv; ++g) {
    float* sg = scores + g * num_tokens;
    for (int64_t j = 0; j < num_tokens; ++j) {  // the group in order, as h2o_group_kernel
      float o = acc[static_cast<int64_t>(g) * group * acc_stride + j];
      for (int hl = 1; hl < group; ++hl) {
        const float v = acc[(static_cast<int64_t>(g) * group + hl) * acc_stride + j];
        o = max_aggregation ? (v > o ? v : o) : o + v;
      }
      if (!max_aggregation && group > 1) o = o * (1.0f / static_cast<float>(group));
      sg[j] = std::isnan(o) ? k_neg_inf : o;
    }
    if (keep == 0) continue;
    std::vector<int32_t> ids(static_cast<size_t>(candidates));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return sg[a] > sg[b]; });
    ids.resize(static_cast<size_t>(keep));
    std::sort(ids.begin(), ids.end());
    for (int64_t i = 0; i < keep; ++i) kept_ids[g * keep + i] = static_cast<int32_t>(g * num_tokens + ids[i]);
  }
  return cudaSuccess;
}

// Only matmul_bf16_cuda calls cuBLAS, and its twin does not: a direct call has no twin here
// (the kernel emulator computes it: ../emu/cublas_emu.cpp).
cublasStatus_t cublas_gemm_ex(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                              const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) {
  return CUBLAS_STATUS_NOT_INITIALIZED;
}

}  // namespace snap::kernels
