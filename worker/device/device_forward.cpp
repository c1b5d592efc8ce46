// DeviceForward (device_forward.h): one chunk of one sequence through the model on the pool's
// stream; every launch checked, errors as one-line Status values.
#include "worker/device/device_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/kernels_cuda.h"

namespace snap {

namespace {
Status cuda_status(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return Status::ok_status();
  return internal_error(std::string("device forward: ") + what + ": " + cudaGetErrorString(e));
}
#define DEV_TRY(what, expr) SNAP_RETURN_IF_ERROR(cuda_status(what, (expr)))
// Why cuBLAS is not there, when it could not be loaded (kernels/cuda/cublas_lazy.h).
std::string cublas_why() {
  const std::string& e = kernels::cublas_load_error();
  return e.empty() ? std::string() : " (" + e + ")";
}
// The shard's heads and MLP width in place of the model's (tp 1: the model's own).
ModelConfig shard_config(const ModelConfig& c, const TpShard& s) {
  ModelConfig local = c;
  if (s.tp_size > 1) {
    local.num_heads = s.num_heads;
    local.num_kv_heads = s.num_kv_heads;
    local.intermediate_size = s.ff_size;
  }
  return local;
}
}  // namespace

Status device_supports(const ModelConfig& c, const std::string& device) {
  if (c.head_dim < 32 || c.head_dim > 256 || c.head_dim % 32 != 0)
    return unimplemented("--device " + device + ": head_dim " + std::to_string(c.head_dim) +
                         " is not on the device yet (its attention takes multiples of 32 up to 256; use --device cpu)");
  return Status::ok_status();
}

DeviceForward::DeviceForward(const ModelConfig& config, const DeviceWeights& weights, DeviceKvPool& pool,
                             DeviceExchange* exchange)
    : config_(shard_config(config, weights.shard)), w_(weights), pool_(pool), exchange_(exchange), stream_(pool.stream()) {
  if (kernels::cublas_create(&cublas_) != CUBLAS_STATUS_SUCCESS) cublas_ = nullptr;
  attn_.num_heads = config_.num_heads;
  attn_.num_kv_heads = config_.num_kv_heads;
  attn_.head_dim = config.head_dim;
  attn_.scale = config.attn_scale > 0.0f ? config.attn_scale : 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  attn_.sliding_window = config.sliding_window;  // per layer: layer_attn
  // SnapKV, AdaKV and H2O score with every query head of the rank's KV heads' groups: its own
  // heads, or — when its KV head is replicated on several ranks (tp > KV heads) — the whole
  // group, whose q_proj rows the shard holds, so that every replica selects what one process
  // would (as LlamaForward does on the CPU).
  score_attn_ = attn_;
  score_attn_.num_heads = weights.shard.tp_size > 1 ? weights.shard.q_load_heads : config_.num_heads;
  if (const char* e = std::getenv("SNAP_DEVICE_PROMPT_ATTENTION"); e != nullptr && *e != '\0') {
    const std::string v = e;
    if (v == "f32")
      prompt_attention_ = PromptAttention::f32;
    else if (v == "mma_bf16")
      prefill_kernel_ = kernels::PrefillAttention::mma_bf16;
    else if (v == "wmma")
      prefill_kernel_ = kernels::PrefillAttention::wmma;
    else if (v != "tc" && v != "mma")
      std::fprintf(stderr,
                   "snapserve: SNAP_DEVICE_PROMPT_ATTENTION=%s is none of tc, mma, mma_bf16, wmma, f32; using tc (mma)\n",
                   e);
  }
  if (const char* e = std::getenv("SNAP_DEVICE_DECODE_ATTENTION"); e != nullptr && *e != '\0') {
    const std::string v = e;
    if (v == "row_warps")
      decode_attention_ = kernels::DecodeAttention::row_warps;
    else if (v == "pipelined")
      decode_attention_ = kernels::DecodeAttention::pipelined;
    else if (v != "key_threads")
      std::fprintf(stderr,
                   "snapserve: SNAP_DEVICE_DECODE_ATTENTION=%s is none of key_threads, pipelined, row_warps; using "
                   "key_threads\n",
                   e);
  }
}

void DeviceForward::free_scratch() {
  cudaStreamSynchronize(stream_);  // queued kernels may still use the buffers
  for (void* p : {static_cast<void*>(x_), static_cast<void*>(h_), static_cast<void*>(q_), static_cast<void*>(k_),
                  static_cast<void*>(v_), static_cast<void*>(attn_out_), static_cast<void*>(gate_),
                  static_cast<void*>(up_), static_cast<void*>(logits_), static_cast<void*>(inv_freq_),
                  static_cast<void*>(xb_), static_cast<void*>(tokens_), static_cast<void*>(positions_),
                  static_cast<void*>(greedy_), static_cast<void*>(head_part_), static_cast<void*>(head_all_),
                  static_cast<void*>(qg_), static_cast<void*>(inv_freq_local_), attn_ws_})
    cudaFree(p);
  head_part_ = head_all_ = qg_ = inv_freq_local_ = nullptr;
  x_ = h_ = q_ = k_ = v_ = attn_out_ = gate_ = up_ = logits_ = inv_freq_ = nullptr;
  xb_ = nullptr;
  cudaFree(wb_);
  wb_ = nullptr;
  wb_elems_ = 0;
  tokens_ = positions_ = greedy_ = nullptr;
  attn_ws_ = nullptr;
  attn_ws_bytes_ = 0;
  cap_ = 0;
  logits_cap_ = 0;
  logits_bytes_ = 0;
  scratch_bytes_ = 0;
}

DeviceForward::~DeviceForward() {
  free_scratch();
  for (float* p : win_q_) cudaFree(p);
  observe_h2o(0);
  if (cublas_) kernels::cublas_destroy(cublas_);
}

Status DeviceForward::ensure_scratch(int64_t n) {
  if (n <= cap_) return Status::ok_status();
  free_scratch();
  const int64_t hidden = config_.hidden_size, qd = int64_t{config_.num_heads} * config_.head_dim;
  const int64_t kvd = int64_t{config_.num_kv_heads} * config_.head_dim, ff = config_.intermediate_size;
  const int64_t widest = std::max({hidden, qd, ff});
  scratch_bytes_ = 0;
  auto alloc = [&](auto** p, int64_t bytes) -> Status {
    scratch_bytes_ += bytes;
    return cuda_status("cudaMalloc scratch", cudaMalloc(reinterpret_cast<void**>(p), static_cast<size_t>(bytes)));
  };
  SNAP_RETURN_IF_ERROR(alloc(&x_, 4 * n * hidden));
  SNAP_RETURN_IF_ERROR(alloc(&h_, 4 * n * hidden));
  SNAP_RETURN_IF_ERROR(alloc(&q_, 4 * n * qd));
  SNAP_RETURN_IF_ERROR(alloc(&k_, 4 * n * kvd));
  SNAP_RETURN_IF_ERROR(alloc(&v_, 4 * n * kvd));
  SNAP_RETURN_IF_ERROR(alloc(&attn_out_, 4 * n * qd));
  SNAP_RETURN_IF_ERROR(alloc(&gate_, 4 * n * ff));
  SNAP_RETURN_IF_ERROR(alloc(&up_, 4 * n * ff));
  SNAP_RETURN_IF_ERROR(alloc(&xb_, 2 * n * widest));
  SNAP_RETURN_IF_ERROR(alloc(&tokens_, 4 * n));
  SNAP_RETURN_IF_ERROR(alloc(&positions_, 4 * n));
  SNAP_RETURN_IF_ERROR(alloc(&greedy_, 4 * n));  // one id per row (decode_batch)
  if (replicated()) SNAP_RETURN_IF_ERROR(alloc(&qg_, 4 * n * score_attn_.num_heads * config_.head_dim));
  const std::vector<float> inv = kernels::rope_inv_freq(config_.rope);
  SNAP_RETURN_IF_ERROR(alloc(&inv_freq_, 4 * static_cast<int64_t>(inv.size())));
  DEV_TRY("inv_freq", cudaMemcpy(inv_freq_, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  if (config_.rope_local_theta > 0.0f) {  // gemma3 local layers: their own base, no scaling (as LlamaForward)
    kernels::RopeConfig local;
    local.theta = config_.rope_local_theta;
    local.head_dim = config_.head_dim;
    const std::vector<float> inv_local = kernels::rope_inv_freq(local);
    SNAP_RETURN_IF_ERROR(alloc(&inv_freq_local_, 4 * static_cast<int64_t>(inv_local.size())));
    DEV_TRY("inv_freq (local layers)",
            cudaMemcpy(inv_freq_local_, inv_local.data(), inv_local.size() * 4, cudaMemcpyHostToDevice));
  }
  cap_ = n;
  return Status::ok_status();
}

// The LM head's buffers for `rows` rows (logits_, and at tp > 1 the padded rows and their
// gather), apart from the chunk's scratch: a prompt chunk needs them for its last row only
// (unless every row's logits are asked for), and at a large vocabulary they are the biggest
// scratch there is (4 bytes × vocab per row: 512 MiB for a 512-token chunk of Gemma 3's 262,144).
Status DeviceForward::ensure_logits(int64_t rows) {
  if (rows <= logits_cap_) return Status::ok_status();
  cudaStreamSynchronize(stream_);  // queued kernels may still use the buffers
  for (float** p : {&logits_, &head_part_, &head_all_}) {
    cudaFree(*p);
    *p = nullptr;
  }
  scratch_bytes_ -= logits_bytes_;
  logits_bytes_ = 0;
  logits_cap_ = 0;
  auto alloc = [&](float** p, int64_t bytes) -> Status {
    logits_bytes_ += bytes;
    scratch_bytes_ += bytes;
    return cuda_status("cudaMalloc logits", cudaMalloc(reinterpret_cast<void**>(p), static_cast<size_t>(bytes)));
  };
  SNAP_RETURN_IF_ERROR(alloc(&logits_, 4 * rows * config_.vocab_size));
  if (exchange_ != nullptr && w_.shard.tp_size > 1) {  // the LM head's rows, padded, then gathered
    SNAP_RETURN_IF_ERROR(alloc(&head_part_, 4 * rows * w_.shard.vocab_chunk));
    SNAP_RETURN_IF_ERROR(alloc(&head_all_, 4 * rows * w_.shard.vocab_chunk * w_.shard.tp_size));
  }
  logits_cap_ = rows;
  return Status::ok_status();
}

// y[n, rows] = x[n, cols] · wᵀ (+ bias): cuBLAS on bf16 x for a chunk, the row GEMV for one row.
Status DeviceForward::project(const DeviceMatrix& w, const float* bias, const float* x, float* y, int64_t n) {
  if (n == 1) return project_rows(w, bias, x, y, 1);
  return gemm(w.view(), bias, x, y, n);
}

// Every row through the GEMV, whatever n: the decode rows of a batch (decode_batch).
Status DeviceForward::project_rows(const DeviceMatrix& w, const float* bias, const float* x, float* y, int64_t n) {
  gemv_rows(w.view(), bias, x, y, n);
  return cuda_status("matmul_rowwise_cuda", cudaGetLastError());
}

namespace {
// A decode GEMV's output for the launch that fuses several (bf16 or Q8_0 weights).
kernels::RowwiseOut rowwise_out(const DeviceMatrixView& w, const float* bias, float* y) {
  return kernels::RowwiseOut{w.data, bias, y, w.rows, w.blocks};
}

// Largest slab of block-format rows dequantized at a time for a prompt GEMM: 64 MiB of bf16 (a
// Llama-3-8B gate_proj in two slabs; each slab's GEMM is still thousands of rows tall).
constexpr int64_t k_dequant_slab_elements = int64_t{32} << 20;
}  // namespace

void DeviceForward::gemv_rows(const DeviceMatrixView& w, const float* bias, const float* x, float* y, int64_t n) {
  const kernels::RowwiseOut out = rowwise_out(w, bias, y);
  kernels::matmul_rowwise_multi_cuda(x, &out, 1, n, w.cols, stream_);
}

Status DeviceForward::gemm(const DeviceMatrixView& w, const float* bias, const float* x, float* y, int64_t n) {
  kernels::f32_to_bf16_cuda(x, xb_, n * w.cols, stream_);
  const auto check = [](cublasStatus_t st) -> Status {
    if (st != CUBLAS_STATUS_SUCCESS)
      return internal_error("device forward: cublasGemmEx status " + std::to_string(static_cast<int>(st)));
    return Status::ok_status();
  };
  if (!w.is_blocks()) {
    SNAP_RETURN_IF_ERROR(check(kernels::matmul_bf16_cuda(cublas_, xb_, w.data, bias, y, n, w.rows, w.cols, stream_)));
    return cuda_status("matmul_bf16_cuda", cudaGetLastError());
  }
  if (wb_ == nullptr) {
    const int64_t layer = w_.largest_blocks_layer_elements();  // 0: only the head is in blocks
    const int64_t elems = std::max(std::min(layer > 0 ? layer : w.rows * w.cols, k_dequant_slab_elements), w.cols);
    DEV_TRY("cudaMalloc dequantization slab", cudaMalloc(reinterpret_cast<void**>(&wb_), static_cast<size_t>(2 * elems)));
    wb_elems_ = elems;
    scratch_bytes_ += 2 * elems;
  }
  const int64_t slab = std::max<int64_t>(1, wb_elems_ / w.cols);
  for (int64_t r = 0; r < w.rows; r += slab) {  // one stream: a slab's GEMM reads wb_ before the next fills it
    const int64_t m = std::min(slab, w.rows - r);
    const DeviceMatrixView s = w.rows_from(r, m);
    kernels::dequant_blocks_to_bf16_cuda(s.blocks, m * w.cols, wb_, stream_);
    SNAP_RETURN_IF_ERROR(check(kernels::matmul_bf16_cuda(cublas_, xb_, wb_, bias != nullptr ? bias + r : nullptr, y + r,
                                                         n, m, w.cols, stream_, w.rows)));
  }
  return cuda_status("block-format GEMM", cudaGetLastError());
}

// q rows [n] of `seq` against (seq, layer)'s paged cache, into out (the split workspace grows
// as heads grow; every call on the stream, so one workspace serves them in turn).
Status DeviceForward::attend(int32_t seq, int layer, const float* q, const int32_t* positions, int64_t n, float* out) {
  SNAP_ASSIGN_OR_RETURN(kernels::PagedKvCuda view, pool_.view(seq, layer));
  const kernels::AttentionParams ap = layer_attn(layer);
  if (n > 1 && prompt_attention_ == PromptAttention::tensor_cores &&
      kernels::attention_prefill_tc_supported(ap, view)) {  // the pool's views always are
    DEV_TRY("attention_prefill_tc_cuda",
            kernels::attention_prefill_tc_cuda(q, positions, n, view, ap, out, stream_, prefill_kernel_));
    return Status::ok_status();
  }
  SNAP_RETURN_IF_ERROR(reserve_attention_workspace(kernels::attention_paged_cuda_workspace_bytes(n, ap, view.max_length)));
  DEV_TRY("attention_paged_cuda",
          kernels::attention_paged_cuda(q, positions, n, view, ap, out, attn_ws_, attn_ws_bytes_, stream_,
                                        decode_attention_));
  return Status::ok_status();
}

Status DeviceForward::reserve_attention_workspace(size_t bytes) {
  if (bytes <= attn_ws_bytes_) return Status::ok_status();
  bytes = std::max(bytes, 2 * attn_ws_bytes_);  // a decode's splits grow with its keys: double, wait rarely
  cudaStreamSynchronize(stream_);
  cudaFree(attn_ws_);
  attn_ws_ = nullptr;
  DEV_TRY("attention workspace", cudaMalloc(&attn_ws_, bytes));
  scratch_bytes_ += static_cast<int64_t>(bytes - attn_ws_bytes_);
  attn_ws_bytes_ = bytes;
  return Status::ok_status();
}

Status DeviceForward::attend_rows(const int32_t* seqs, int layer, int64_t n) {
  std::vector<kernels::PagedKvCuda> views(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) {
    SNAP_ASSIGN_OR_RETURN(views[b], pool_.view(seqs[b], layer));
  }
  const kernels::AttentionParams ap = layer_attn(layer);
  SNAP_RETURN_IF_ERROR(reserve_attention_workspace(kernels::attention_decode_rows_workspace_bytes(n, views.data(), ap)));
  DEV_TRY("attention_decode_rows_cuda",
          kernels::attention_decode_rows_cuda(q_, positions_, n, views.data(), ap, attn_out_, attn_ws_,
                                              attn_ws_bytes_, stream_, decode_attention_));
  return Status::ok_status();
}

// Layer l's q, k and v of the n rows of h_, q and k after RoPE (gemma3: after their per-head
// RMSNorm, with the local layers' RoPE base on local layers): q into q_ [n, own heads] (with a
// replicated KV head the whole group's into qg_ [n, group heads] first, the scoring's queries,
// ours copied out), k and v into k_, v_. rows (decode): the three GEMVs in one launch.
Status DeviceForward::attention_inputs(const DeviceLayer& L, int l, int64_t n, bool rows) {
  const int hd = config_.head_dim;
  float* dst = replicated() ? qg_ : q_;
  if (rows) {
    const kernels::RowwiseOut outs[3] = {rowwise_out(L.q.view(), L.q_bias.f32(), dst),
                                         rowwise_out(L.k.view(), L.k_bias.f32(), k_),
                                         rowwise_out(L.v.view(), L.v_bias.f32(), v_)};
    kernels::matmul_rowwise_multi_cuda(h_, outs, 3, n, L.q.cols, stream_);
    DEV_TRY("q/k/v rows", cudaGetLastError());
  } else {
    SNAP_RETURN_IF_ERROR(project(L.q, L.q_bias.f32(), h_, dst, n));
    SNAP_RETURN_IF_ERROR(project(L.k, L.k_bias.f32(), h_, k_, n));
    SNAP_RETURN_IF_ERROR(project(L.v, L.v_bias.f32(), h_, v_, n));
  }
  if (L.q_norm.ptr != nullptr) {  // over each head's head_dim, in place (rms_norm_cuda allows it)
    kernels::rms_norm_cuda(dst, L.q_norm.f32(), dst, n * score_attn_.num_heads, hd, config_.rms_norm_eps, stream_);
    kernels::rms_norm_cuda(k_, L.k_norm.f32(), k_, n * config_.num_kv_heads, hd, config_.rms_norm_eps, stream_);
  }
  kernels::rope_qk_cuda(dst, score_attn_.num_heads, k_, config_.num_kv_heads, positions_, n, hd, layer_inv_freq(l),
                        stream_);
  DEV_TRY("rope", cudaGetLastError());
  if (!replicated()) return Status::ok_status();
  const int64_t own = w_.shard.head_begin - w_.shard.q_load_begin;
  const int64_t qd = int64_t{config_.num_heads} * hd, qgd = int64_t{score_attn_.num_heads} * hd;
  DEV_TRY("own queries", cudaMemcpy2DAsync(q_, 4 * qd, qg_ + own * hd, 4 * qgd, 4 * qd, n, cudaMemcpyDeviceToDevice, stream_));
  return Status::ok_status();
}

// After attention (attn_out_), decode rows: o_proj into the residual stream x_, RMSNorm, gate and
// up with SwiGLU in one launch, down_proj into x_. At tp 1 the residual adds are fused into
// the GEMVs (the same bits as GEMV + residual_add_cuda); a shard sums its partials first.
// gemma3: each output is RMSNormed (post_attn_norm, post_ffn_norm) before its residual add, so
// nothing fuses there, and gate and up fuse with GeGLU instead.
Status DeviceForward::finish_layer_rows(const DeviceLayer& L, int64_t n) {
  const int64_t hidden = config_.hidden_size, ff = config_.intermediate_size;
  const bool sum_first = exchange_ != nullptr && w_.shard.tp_size > 1;
  // x_ += post_norm(in · wᵀ), summed over the group first when sharded.
  const auto into_residual = [&](const DeviceMatrix& w, const float* in, const DeviceArray& post_norm) -> Status {
    if (!sum_first && post_norm.ptr == nullptr) {
      if (w.is_blocks())
        kernels::matmul_rowwise_residual_blocks_cuda(in, w.view().blocks, nullptr, x_, n, w.rows, w.cols, stream_);
      else
        kernels::matmul_rowwise_residual_cuda(in, w.data.bf16(), nullptr, x_, n, w.rows, w.cols, stream_);
      return Status::ok_status();
    }
    SNAP_RETURN_IF_ERROR(project_rows(w, nullptr, in, h_, n));
    SNAP_RETURN_IF_ERROR(reduce(n));
    if (post_norm.ptr != nullptr) kernels::rms_norm_cuda(h_, post_norm.f32(), h_, n, hidden, config_.rms_norm_eps, stream_);
    kernels::residual_add_cuda(x_, h_, n * hidden, stream_);
    return Status::ok_status();
  };
  SNAP_RETURN_IF_ERROR(into_residual(L.o, attn_out_, L.post_attn_norm));
  kernels::rms_norm_cuda(x_, L.ffn_norm.f32(), h_, n, hidden, config_.rms_norm_eps, stream_);
  const bool same = L.gate.is_blocks() == L.up.is_blocks() && (!L.gate.is_blocks() || L.gate.format == L.up.format);
  if (!same) {  // gate and up in one launch per format, then the activation
    const kernels::RowwiseOut outs[2] = {rowwise_out(L.gate.view(), nullptr, gate_), rowwise_out(L.up.view(), nullptr, up_)};
    kernels::matmul_rowwise_multi_cuda(h_, outs, 2, n, L.gate.cols, stream_);
    if (config_.gelu_mlp)
      kernels::geglu_cuda(gate_, up_, gate_, n * ff, stream_);
    else
      kernels::swiglu_cuda(gate_, up_, gate_, n * ff, stream_);
  } else if (L.gate.is_blocks()) {  // a row's gate and up in one warp, then the activation (gemma3: GeGLU)
    const auto fused = config_.gelu_mlp ? kernels::matmul_rowwise_geglu_blocks_cuda : kernels::matmul_rowwise_swiglu_blocks_cuda;
    fused(h_, L.gate.view().blocks, L.up.view().blocks, gate_, n, ff, L.gate.cols, stream_);
  } else {
    const auto fused = config_.gelu_mlp ? kernels::matmul_rowwise_geglu_cuda : kernels::matmul_rowwise_swiglu_cuda;
    fused(h_, L.gate.data.bf16(), L.up.data.bf16(), gate_, n, ff, L.gate.cols, stream_);
  }
  SNAP_RETURN_IF_ERROR(into_residual(L.down, gate_, L.post_ffn_norm));
  DEV_TRY("layer rows", cudaGetLastError());
  return Status::ok_status();
}

Status DeviceForward::embed(const int32_t* tokens, int64_t n, float* out) {
  const int64_t hidden = config_.hidden_size;
  if (w_.embed.is_blocks())
    kernels::embedding_gather_blocks_cuda(w_.embed.view().blocks, tokens, n, hidden, config_.vocab_size, out, stream_);
  else
    kernels::embedding_gather_cuda(w_.embed.data.bf16(), tokens, n, hidden, config_.vocab_size, out, stream_);
  if (config_.embed_scale != 1.0f) kernels::scale_cuda(out, config_.embed_scale, n * hidden, stream_);
  return cuda_status("embedding", cudaGetLastError());
}

Status DeviceForward::check_shard() const {
  const TpShard& s = w_.shard;
  if (s.tp_size == 1) return Status::ok_status();
  if (exchange_ == nullptr || exchange_->size() != s.tp_size || exchange_->rank() != s.tp_rank)
    return internal_error("device forward: the shard of tp rank " + std::to_string(s.tp_rank) + " of " +
                          std::to_string(s.tp_size) + " needs an exchange over that group");
  if (pool_.shape().num_kv_heads != s.num_kv_heads)
    return internal_error("device forward: the pool holds " + std::to_string(pool_.shape().num_kv_heads) +
                          " KV heads, the shard " + std::to_string(s.num_kv_heads));
  return Status::ok_status();
}

Status DeviceForward::reduce(int64_t n) {
  if (exchange_ == nullptr || w_.shard.tp_size == 1) return Status::ok_status();
  return exchange_->all_reduce(h_, n * config_.hidden_size);
}

Status DeviceForward::head(int64_t rows, bool rowwise) {
  SNAP_RETURN_IF_ERROR(ensure_logits(rows));
  const DeviceMatrixView hw = w_.head();
  const TpShard& s = w_.shard;
  const bool gather = exchange_ != nullptr && s.tp_size > 1;
  // This rank's rows [rows, shard vocab] straight into logits_ at tp 1, else into head_part_
  // with the row pitch of vocab_chunk (the last rank's slice may be shorter: its tail is
  // padding, never read).
  float* part = gather ? head_part_ : logits_;
  const int64_t pitch = gather ? s.vocab_chunk : hw.rows;
  float* y = part;
  if (gather && hw.rows != pitch) y = logits_;  // computed dense, then copied at the pitch
  if (rowwise || rows == 1) {
    gemv_rows(hw, nullptr, h_, y, rows);
    DEV_TRY("lm head", cudaGetLastError());
  } else {
    SNAP_RETURN_IF_ERROR(gemm(hw, nullptr, h_, y, rows));
  }
  if (!gather) return Status::ok_status();
  if (y != part)
    DEV_TRY("lm head rows", cudaMemcpy2DAsync(part, 4 * pitch, y, 4 * hw.rows, 4 * hw.rows, rows, cudaMemcpyDeviceToDevice, stream_));
  SNAP_RETURN_IF_ERROR(exchange_->all_gather(part, head_all_, rows * pitch));
  if (!s.is_logits_rank) return Status::ok_status();
  // [tp, rows, chunk] -> [rows, vocab]: rank r's slice holds ids [r·chunk, r·chunk + its rows).
  const int64_t vocab = config_.vocab_size;
  for (int r = 0; r < s.tp_size; ++r) {
    const int64_t begin = r * pitch, width = std::min(pitch, vocab - begin);
    if (width <= 0) continue;
    DEV_TRY("logits", cudaMemcpy2DAsync(logits_ + begin, 4 * vocab, head_all_ + r * rows * pitch, 4 * pitch, 4 * width,
                                        rows, cudaMemcpyDeviceToDevice, stream_));
  }
  return Status::ok_status();
}

Status DeviceForward::decode_batch(const int32_t* seqs, const int32_t* tokens, int64_t num_rows, float* logits,
                                   int32_t* greedy, const uint8_t* logits_rows) {
  if (num_rows <= 0) return invalid_argument("device forward: no decode rows");
  SNAP_RETURN_IF_ERROR(check_shard());
  const int nkv = config_.num_kv_heads, bs = pool_.shape().block_size;
  int64_t new_blocks = 0;  // blocks this step takes: a head whose last block is full needs one
  std::vector<int32_t> pos(static_cast<size_t>(num_rows));
  for (int64_t b = 0; b < num_rows; ++b) {
    if (tokens[b] < 0 || tokens[b] >= config_.vocab_size)
      return invalid_argument("device forward: token id " + std::to_string(tokens[b]) + " not in [0, " +
                              std::to_string(config_.vocab_size) + ")");
    for (int64_t a = 0; a < b; ++a)
      if (seqs[a] == seqs[b])
        return invalid_argument("device forward: sequence " + std::to_string(seqs[b]) + " twice in one decode batch");
    if (!pool_.is_open(seqs[b])) return invalid_argument("device forward: sequence " + std::to_string(seqs[b]) + " is not open");
    pos[b] = static_cast<int32_t>(pool_.appended(seqs[b], 0));
    for (int l = 0; l < config_.num_layers; ++l)
      for (int g = 0; g < nkv; ++g) new_blocks += pool_.length(seqs[b], l, g) % bs == 0 ? 1 : 0;
  }
  if (new_blocks > pool_.free_blocks())
    return resource_exhausted("device forward: a decode step of " + std::to_string(num_rows) + " sequences needs " +
                              std::to_string(new_blocks) + " new KV blocks, " + std::to_string(pool_.free_blocks()) +
                              " are free");
  SNAP_RETURN_IF_ERROR(ensure_scratch(num_rows));
  if (cublas_ == nullptr) return internal_error("device forward: cublasCreate failed" + cublas_why());
  const int64_t n = num_rows, hidden = config_.hidden_size, vocab = config_.vocab_size;
  DEV_TRY("tokens", cudaMemcpyAsync(tokens_, tokens, 4 * n, cudaMemcpyHostToDevice, stream_));
  DEV_TRY("positions", cudaMemcpyAsync(positions_, pos.data(), 4 * n, cudaMemcpyHostToDevice, stream_));
  SNAP_RETURN_IF_ERROR(embed(tokens_, n, x_));
  for (int l = 0; l < config_.num_layers; ++l) {
    const DeviceLayer& L = w_.layers[l];
    kernels::rms_norm_cuda(x_, L.attn_norm.f32(), h_, n, hidden, config_.rms_norm_eps, stream_);
    SNAP_RETURN_IF_ERROR(attention_inputs(L, l, n, true));
    // Each row into its own sequence's cache, then every row attends there: one launch each.
    if (batched_rows_) {
      SNAP_RETURN_IF_ERROR(pool_.append_rows(seqs, n, l, k_, v_, positions_));
      SNAP_RETURN_IF_ERROR(attend_rows(seqs, l, n));
    } else {
      const int64_t qd = int64_t{config_.num_heads} * config_.head_dim, kvd = int64_t{nkv} * config_.head_dim;
      for (int64_t b = 0; b < n; ++b) {
        SNAP_RETURN_IF_ERROR(pool_.append(seqs[b], l, k_ + b * kvd, v_ + b * kvd, positions_ + b, 1));
        SNAP_RETURN_IF_ERROR(attend(seqs[b], l, q_ + b * qd, positions_ + b, 1, attn_out_ + b * qd));
      }
    }
    SNAP_RETURN_IF_ERROR(finish_layer_rows(L, n));
  }
  kernels::rms_norm_cuda(x_, w_.final_norm.f32(), h_, n, hidden, config_.rms_norm_eps, stream_);
  SNAP_RETURN_IF_ERROR(head(n, true));
  if (!is_logits_rank()) return cuda_status("decode batch", cudaStreamSynchronize(stream_));
  if (greedy) {
    kernels::argmax_cuda(logits_, n, vocab, greedy_, stream_);
    DEV_TRY("greedy", cudaMemcpyAsync(greedy, greedy_, 4 * n, cudaMemcpyDeviceToHost, stream_));
  }
  if (logits && !logits_rows) {
    DEV_TRY("logits", cudaMemcpyAsync(logits, logits_, 4 * n * vocab, cudaMemcpyDeviceToHost, stream_));
  } else if (logits) {
    for (int64_t r = 0; r < n;) {  // each run of wanted rows in one copy
      if (!logits_rows[r]) {
        ++r;
        continue;
      }
      int64_t end = r + 1;
      while (end < n && logits_rows[end]) ++end;
      DEV_TRY("logits", cudaMemcpyAsync(logits + r * vocab, logits_ + r * vocab, 4 * (end - r) * vocab,
                                        cudaMemcpyDeviceToHost, stream_));
      r = end;
    }
  }
  DEV_TRY("decode batch", cudaStreamSynchronize(stream_));
  return Status::ok_status();
}

// Layer l over the n rows of x_ (positions_ = start..start+n-1 of `seq`): its K/V appended to
// the pool, the policy's capture (window queries, H2O scores) taken, x_ updated in place.
Status DeviceForward::run_layer(int32_t seq, int l, int64_t n, int64_t start) {
  const int64_t hidden = config_.hidden_size, ff = config_.intermediate_size;
  const int hd = config_.head_dim;
  const DeviceLayer& L = w_.layers[l];
  kernels::rms_norm_cuda(x_, L.attn_norm.f32(), h_, n, hidden, config_.rms_norm_eps, stream_);
  const bool rows = n == 1;  // a lone row takes the decode GEMVs, as decode_batch does
  SNAP_RETURN_IF_ERROR(attention_inputs(L, l, n, rows));
  if (window_ > 0 && n >= window_ && win_q_[l] != nullptr) {  // this chunk's last W queries (scoring heads)
    const int64_t qd = int64_t{score_attn_.num_heads} * hd;
    DEV_TRY("window queries", cudaMemcpyAsync(win_q_[l], score_queries() + (n - window_) * qd,
                                              sizeof(float) * window_ * qd, cudaMemcpyDeviceToDevice, stream_));
  }
  SNAP_RETURN_IF_ERROR(pool_.append(seq, l, k_, v_, positions_, n));
  if (start < h2o_tokens_ && !windowed(l))  // a windowed layer keeps its window, whatever the scores
    SNAP_RETURN_IF_ERROR(accumulate_h2o(seq, l, start, std::min(n, h2o_tokens_ - start)));
  SNAP_RETURN_IF_ERROR(attend(seq, l, q_, positions_, n, attn_out_));
  if (rows) return finish_layer_rows(L, n);
  SNAP_RETURN_IF_ERROR(project(L.o, nullptr, attn_out_, h_, n));
  SNAP_RETURN_IF_ERROR(reduce(n));
  if (L.post_attn_norm.ptr != nullptr)
    kernels::rms_norm_cuda(h_, L.post_attn_norm.f32(), h_, n, hidden, config_.rms_norm_eps, stream_);
  kernels::residual_add_cuda(x_, h_, n * hidden, stream_);
  kernels::rms_norm_cuda(x_, L.ffn_norm.f32(), h_, n, hidden, config_.rms_norm_eps, stream_);
  SNAP_RETURN_IF_ERROR(project(L.gate, nullptr, h_, gate_, n));
  SNAP_RETURN_IF_ERROR(project(L.up, nullptr, h_, up_, n));
  if (config_.gelu_mlp)
    kernels::geglu_cuda(gate_, up_, gate_, n * ff, stream_);
  else
    kernels::swiglu_cuda(gate_, up_, gate_, n * ff, stream_);
  SNAP_RETURN_IF_ERROR(project(L.down, nullptr, gate_, h_, n));
  SNAP_RETURN_IF_ERROR(reduce(n));
  if (L.post_ffn_norm.ptr != nullptr)
    kernels::rms_norm_cuda(h_, L.post_ffn_norm.f32(), h_, n, hidden, config_.rms_norm_eps, stream_);
  kernels::residual_add_cuda(x_, h_, n * hidden, stream_);
  DEV_TRY("layer", cudaGetLastError());
  return Status::ok_status();
}

Status DeviceForward::forward(int32_t seq, const int32_t* tokens, int64_t n, float* logits, bool all_logits,
                              int32_t* greedy) {
  if (n <= 0) return invalid_argument("device forward: no tokens");
  SNAP_RETURN_IF_ERROR(check_shard());
  if (!pool_.is_open(seq)) return invalid_argument("device forward: sequence " + std::to_string(seq) + " is not open");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      return invalid_argument("device forward: token id " + std::to_string(tokens[i]) + " not in [0, " +
                              std::to_string(config_.vocab_size) + ")");
  SNAP_RETURN_IF_ERROR(ensure_scratch(n));
  if (cublas_ == nullptr) return internal_error("device forward: cublasCreate failed" + cublas_why());
  const int64_t hidden = config_.hidden_size, vocab = config_.vocab_size;
  const int64_t start = pool_.appended(seq, 0);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(start + i);
  DEV_TRY("tokens", cudaMemcpyAsync(tokens_, tokens, 4 * n, cudaMemcpyHostToDevice, stream_));
  DEV_TRY("positions", cudaMemcpyAsync(positions_, pos.data(), 4 * n, cudaMemcpyHostToDevice, stream_));
  SNAP_RETURN_IF_ERROR(embed(tokens_, n, x_));

  for (int l = 0; l < config_.num_layers; ++l) SNAP_RETURN_IF_ERROR(run_layer(seq, l, n, start));

  window_rows_ = n;
  // Final norm and the LM head: every row, or only the last (then as a single row, GEMV).
  const int64_t rows = all_logits ? n : 1;
  const float* last = x_ + (n - rows) * hidden;
  kernels::rms_norm_cuda(last, w_.final_norm.f32(), h_, rows, hidden, config_.rms_norm_eps, stream_);
  SNAP_RETURN_IF_ERROR(head(rows, false));
  if (!is_logits_rank()) return cuda_status("forward", cudaStreamSynchronize(stream_));
  if (greedy) {
    kernels::argmax_cuda(logits_ + (rows - 1) * vocab, 1, vocab, greedy_, stream_);
    DEV_TRY("greedy", cudaMemcpyAsync(greedy, greedy_, 4, cudaMemcpyDeviceToHost, stream_));
  }
  if (logits) DEV_TRY("logits", cudaMemcpyAsync(logits, logits_, 4 * rows * vocab, cudaMemcpyDeviceToHost, stream_));
  DEV_TRY("forward", cudaStreamSynchronize(stream_));
  return Status::ok_status();
}

// --- layer-wise prefill ------------------------------------------------------------------------
Status DeviceForward::prefill_layerwise(int32_t seq, const int32_t* tokens, int64_t n, int64_t chunk,
                                        const KvPolicy& policy, float* last_logits,
                                        std::vector<std::vector<std::vector<int32_t>>>* kept) {
  if (n <= 0 || chunk <= 0) return invalid_argument("device forward: layer-wise prefill needs tokens and a chunk size");
  SNAP_RETURN_IF_ERROR(check_shard());
  if (!pool_.is_open(seq) || pool_.appended(seq, 0) != 0)
    return invalid_argument("device forward: a layer-wise prefill starts on an open, empty sequence");
  if (policy.kind == KvPolicyKind::full || policy.context_tokens > 0)
    return invalid_argument("device forward: layer-wise prefill compresses the whole prompt with a compressing kv policy");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      return invalid_argument("device forward: token id " + std::to_string(tokens[i]) + " not in [0, " +
                              std::to_string(config_.vocab_size) + ")");
  if (cublas_ == nullptr) return internal_error("device forward: cublasCreate failed" + cublas_why());
  const int window = prepare_compression(policy, n);
  // Chunks as chunked prefill cuts them: the last holds at least the window.
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (start, length)
  const int64_t last = std::min(n, std::max<int64_t>(window, std::min(chunk, n)));
  for (int64_t s = 0; s < n - last;) {
    const int64_t len = std::min(chunk, n - last - s);
    chunks.emplace_back(s, len);
    s += len;
  }
  chunks.emplace_back(n - last, last);
  int64_t widest = 0;
  for (const auto& c : chunks) widest = std::max(widest, c.second);
  SNAP_RETURN_IF_ERROR(ensure_scratch(widest));
  const int64_t hidden = config_.hidden_size, vocab = config_.vocab_size;
  // The hidden states of every prompt token between layers: [n, hidden] f32.
  float* states = nullptr;
  layerwise_state_bytes_ = 4 * n * hidden;
  DEV_TRY("layer-wise hidden states", cudaMalloc(&states, static_cast<size_t>(layerwise_state_bytes_)));
  struct Free {
    cudaStream_t stream;
    float* p;
    ~Free() {
      cudaStreamSynchronize(stream);
      cudaFree(p);
    }
  } free_states{stream_, states};
  std::vector<int32_t> pos(static_cast<size_t>(widest));
  auto upload_chunk = [&](int64_t s, int64_t len, bool with_tokens) -> Status {
    cudaStreamSynchronize(stream_);  // the host vectors below are reused chunk after chunk
    for (int64_t i = 0; i < len; ++i) pos[i] = static_cast<int32_t>(s + i);
    DEV_TRY("positions", cudaMemcpyAsync(positions_, pos.data(), 4 * len, cudaMemcpyHostToDevice, stream_));
    if (with_tokens) DEV_TRY("tokens", cudaMemcpyAsync(tokens_, tokens + s, 4 * len, cudaMemcpyHostToDevice, stream_));
    return Status::ok_status();
  };
  for (const auto& [s, len] : chunks) {
    SNAP_RETURN_IF_ERROR(upload_chunk(s, len, true));
    SNAP_RETURN_IF_ERROR(embed(tokens_, len, states + s * hidden));
  }
  if (kept) kept->assign(static_cast<size_t>(config_.num_layers), {});
  for (int l = 0; l < config_.num_layers; ++l) {
    for (const auto& [s, len] : chunks) {
      SNAP_RETURN_IF_ERROR(upload_chunk(s, len, false));
      DEV_TRY("hidden states in", cudaMemcpyAsync(x_, states + s * hidden, 4 * len * hidden, cudaMemcpyDeviceToDevice, stream_));
      SNAP_RETURN_IF_ERROR(run_layer(seq, l, len, s));
      DEV_TRY("hidden states out", cudaMemcpyAsync(states + s * hidden, x_, 4 * len * hidden, cudaMemcpyDeviceToDevice, stream_));
    }
    window_rows_ = last;
    std::vector<std::vector<std::vector<int32_t>>> layer_kept;
    SNAP_RETURN_IF_ERROR(compress(seq, policy, n, &layer_kept, l));  // before the next layer fills
    if (kept && l < static_cast<int>(layer_kept.size())) (*kept)[l] = std::move(layer_kept[l]);
  }
  kernels::rms_norm_cuda(states + (n - 1) * hidden, w_.final_norm.f32(), h_, 1, hidden, config_.rms_norm_eps, stream_);
  SNAP_RETURN_IF_ERROR(head(1, true));
  if (last_logits && is_logits_rank()) DEV_TRY("logits", cudaMemcpyAsync(last_logits, logits_, 4 * vocab, cudaMemcpyDeviceToHost, stream_));
  DEV_TRY("layer-wise prefill", cudaStreamSynchronize(stream_));
  return Status::ok_status();
}

}  // namespace snap
