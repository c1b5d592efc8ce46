// The Llama-family forward pass (llama, mistral, qwen2) and Gemma 3's on one GPU: the device
// twin of LlamaForward (worker/model/llama.h), over the device KV block pool. Same steps in the
// same order — embed, per layer RMSNorm, q/k/v (+ qwen2 bias), RoPE, KV append, paged attention
// (causal by position, sliding window), o_proj + residual, RMSNorm, SwiGLU MLP + residual;
// final norm, LM head — with bf16 weights and KV and f32 activations. Gemma 3's options as
// LlamaForward takes them from the config: the embedding scale, per-head q/k RMSNorm before
// RoPE, local layers (their sliding window and RoPE base) between global ones, the attention
// scale, RMSNorm on the attention and MLP outputs before each residual add, and GeGLU. Prompt chunks
// (num_tokens > 1) run the projections through cuBLAS on bf16 activations; single decode
// rows through the row-invariant GEMV (f32 activations), as the CPU splits sgemm/matvec.
// Only the logits (or greedy ids) cross to the host.
//
// Tensor parallelism (DeviceWeights of one rank's shard + a DeviceExchange): this rank runs
// its query and KV heads, its MLP slice and its vocabulary rows, as LlamaForward does on the
// CPU; the partial outputs of o_proj and down_proj are summed over the group right after
// them (reduce(), the one all-reduce), and the LM head's rows are gathered to tp rank 0
// (head()). KV, window queries, scores and selections stay on the rank's GPU: every policy
// compresses the rank's own KV heads. Every rank must make the same calls in the same order
// with the same arguments; on ranks other than 0 the logits and greedy pointers are ignored.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/device/device_exchange.h"
#include "worker/device/device_kv_pool.h"
#include "worker/device/device_weights.h"
#include "worker/kv/policy.h"
#include "worker/model/config.h"

namespace snap {

// What DeviceForward runs: the Llama family and Gemma 3, with a head_dim the device attention
// takes (a multiple of 32, at most 256). Else a one-line refusal naming `device` and the reason.
Status device_supports(const ModelConfig& config, const std::string& device);

class DeviceForward {
 public:
  // weights, pool and exchange must outlive this object; the pool's stream is used (a
  // blocking stream, see device_exchange.h). weights.shard says which heads, MLP slice and
  // vocabulary rows this rank runs; a shard of tp > 1 needs `exchange` (its group), the pool
  // shaped with the shard's KV heads.
  DeviceForward(const ModelConfig& config, const DeviceWeights& weights, DeviceKvPool& pool,
                DeviceExchange* exchange = nullptr);
  ~DeviceForward();
  DeviceForward(const DeviceForward&) = delete;
  DeviceForward& operator=(const DeviceForward&) = delete;

  // Runs tokens[0..n) of sequence `seq` at positions pool.appended(seq, 0).. and appends
  // their K/V. logits (host): [n, vocab] if all_logits, else [vocab] of the last token; may
  // be null. greedy (host, may be null): argmax id of the last token, computed on the device.
  Status forward(int32_t seq, const int32_t* tokens, int64_t n, float* logits, bool all_logits, int32_t* greedy);

  // One decode row for each of num_rows different sequences (continuous batching): row b is
  // token tokens[b] of sequence seqs[b] at position pool.appended(seqs[b], 0), attending over
  // that sequence's own block tables (heads of any lengths). Batch invariance: every
  // projection and the LM head go through the row-invariant GEMV (matmul_rowwise_cuda, its
  // summation order fixed by cols alone), norms/RoPE/SwiGLU are per row, and attention runs
  // per sequence exactly as forward() runs one decode row — so row b's logits are bitwise
  // those of forward(seqs[b], &tokens[b], 1) whatever shares the step (test_device_forward).
  // A layer's appends and attention are one launch each for the whole batch (up to 16 rows per
  // append launch at 8 KV heads, 64 per attention launch): DeviceKvPool::append_rows and
  // attention_decode_rows_cuda, whose row b is bitwise attention_paged_cuda's of that row alone.
  // logits (host, may be null): [num_rows, vocab]; greedy (host, may be null): [num_rows].
  // logits_rows (may be null: every row): only rows r with logits_rows[r] != 0 are copied into
  // logits (the others are left as they are), so that a step's greedy rows, whose ids come
  // from `greedy`, cost no transfer.
  // All or nothing for the pool: refused before any work when the free blocks do not suffice.
  Status decode_batch(const int32_t* seqs, const int32_t* tokens, int64_t num_rows, float* logits, int32_t* greedy,
                      const uint8_t* logits_rows = nullptr);

  // Layer-wise prefill (the twin of LlamaForward::prefill_layerwise): the whole prompt through
  // layer 0 in chunks of `chunk` tokens (the last holding at least the policy's window), that
  // layer compressed by `policy` (compress(..., layer)), then layer 1, ... The hidden states of
  // all n tokens stay on the device between layers ([n, hidden] f32, freed at the end), so the
  // peak is the weights + one layer's full KV + the compressed rest + those states: prompts far
  // beyond the pool's full-KV capacity fit. The sequence must be empty and the policy must
  // compress the whole prompt (not full, no context_tokens). last_logits (host, may be null):
  // [vocab] of the last token. kept as compress(), every layer.
  Status prefill_layerwise(int32_t seq, const int32_t* tokens, int64_t n, int64_t chunk, const KvPolicy& policy,
                           float* last_logits, std::vector<std::vector<std::vector<int32_t>>>* kept);
  // Bytes the last layer-wise prefill held for the hidden states.
  int64_t layerwise_state_bytes() const { return layerwise_state_bytes_; }

  // SnapKV on the device, after the prompt: observe_window(W) before the prompt's last chunk
  // (which must hold at least W tokens) keeps every layer's last W queries (after RoPE);
  // compress_snapkv then selects per layer and KV head (snapkv_select_cuda: top B−W prefix
  // positions + the window) and compacts the pool, freeing the dropped blocks. The sequence
  // must be a fresh prefill (logical entry j = position j). kept (optional): per layer, per
  // KV head, the kept positions. Prompts of at most B tokens are left as they are.
  void observe_window(int window);
  const float* window_queries(int layer) const;  // device [W, num_heads, head_dim], or null
  // layer_budgets (optional, pyramidkv): layer l keeps layer_budgets[l] instead of sp.budget;
  // a layer whose budget is at least the length is left as it is.
  // layer >= 0 (here and in compress_adakv, compress_h2o, compress): that layer only.
  Status compress_snapkv(int32_t seq, const kernels::SnapKvCudaParams& sp,
                         std::vector<std::vector<std::vector<int32_t>>>* kept = nullptr,
                         const std::vector<int64_t>& layer_budgets = {}, int layer = -1);

  // AdaKV (adakv_select_cuda): after observe_window(W) as for SnapKV; heads keep different
  // counts (the layer's total is num_kv_heads·B), every head the window.
  Status compress_adakv(int32_t seq, const kernels::SnapKvCudaParams& sp, double alpha,
                        std::vector<std::vector<std::vector<int32_t>>>* kept = nullptr, int layer = -1);
  // H2O: observe_h2o(n) before the prompt's first chunk makes forward() accumulate, in every
  // layer, the attention the queries of positions < n pay each key (h2o_accumulate_cuda, a
  // device [num_heads, n] buffer per layer, allocated at its first chunk; 0 stops it and frees
  // them). compress_h2o then
  // keeps per layer and KV head the `recent` last positions plus the top budget − recent
  // older ones (h2o_select_cuda) and compacts; the sequence must hold exactly n positions.
  void observe_h2o(int64_t num_tokens);
  Status compress_h2o(int32_t seq, int64_t budget, int64_t recent, bool max_aggregation,
                      std::vector<std::vector<std::vector<int32_t>>>* kept = nullptr, int layer = -1);

  // A request's policy in one call each (what generate and the serving engine run):
  // prepare_compression before the prompt's first chunk sets up the capture the policy needs
  // (window queries: snapkv, pyramidkv, adakv; H2O scores) and returns the rows the chunk
  // ending at compress_at must hold (the window; 0 for the others). compress then runs the
  // policy's selection + compaction once the first compress_at tokens are in the pool; kept
  // (per layer, per KV head) stays empty when nothing was dropped or the policy is full.
  int prepare_compression(const KvPolicy& policy, int64_t compress_at);
  // gemma3's local layers are not the policy's: each keeps its last window positions (exact),
  // as the CPU's KvCompressor keeps them.
  Status compress(int32_t seq, const KvPolicy& policy, int64_t compress_at,
                  std::vector<std::vector<std::vector<int32_t>>>* kept, int layer = -1);

  // Attention of prompt chunks (n > 1 rows in forward() and the layer-wise prefill): a
  // tensor-core kernel (attention_prefill_tc_cuda; the default) or the CUDA-core kernel that
  // decode rows use (attention_paged_cuda, f32 FMAs). A one-row chunk goes the decode way, as
  // project() does. The tensor-core kernel is one of kernels::PrefillAttention:
  //  - mma (the default): mma.sync, everything of a row in registers, cp.async double buffer;
  //    bf16 MMAs with the f32 operands split into bf16 pairs, f32-accurate;
  //  - mma_bf16: the same with q·scale and the softmax weights in bf16 once (FlashAttention's
  //    precision, half the tensor work): logits move by more than f32 rounding, so greedy
  //    tokens can differ from the CPU's at near-ties; an opt-in for speed;
  //  - wmma: the first tensor-core kernel, f32-accurate.
  // mma, wmma and f32 meet the CPU's attention within the same tolerance; their bits differ.
  // The environment variable SNAP_DEVICE_PROMPT_ATTENTION chooses for every DeviceForward of
  // the process: tc or mma (or unset: the default), mma_bf16, wmma, f32; anything else is
  // ignored with a warning.
  enum class PromptAttention { tensor_cores, f32 };
  void set_prompt_attention(PromptAttention a) { prompt_attention_ = a; }
  PromptAttention prompt_attention() const { return prompt_attention_; }
  void set_prefill_kernel(kernels::PrefillAttention k) { prefill_kernel_ = k; }
  kernels::PrefillAttention prefill_kernel() const { return prefill_kernel_; }
  static const char* prefill_kernel_name(kernels::PrefillAttention k) {
    return k == kernels::PrefillAttention::mma_bf16 ? "mma_bf16" : k == kernels::PrefillAttention::wmma ? "wmma" : "mma";
  }
  // "f32", or "tc (mma)" etc.
  std::string prompt_attention_name() const {
    return prompt_attention_ == PromptAttention::f32 ? "f32" : std::string("tc (") + prefill_kernel_name(prefill_kernel_) + ")";
  }
  static const char* prompt_attention_name(PromptAttention a) { return a == PromptAttention::f32 ? "f32" : "tc"; }

  // The kernel of decode rows (attention_paged_cuda's decode form: ≤ 64 query rows per KV
  // head): key_threads (the default: each K element read from shared memory once per chunk for
  // all the rows of a block), pipelined (key_threads with the next chunk's K/V copied by
  // cp.async while one is computed: the same bits) or row_warps (a warp per row: same
  // tolerance, different bits). SNAP_DEVICE_DECODE_ATTENTION=pipelined|row_warps chooses for
  // every DeviceForward of the process (`key_threads` or unset: the default); anything else is
  // ignored with a warning.
  void set_decode_attention(kernels::DecodeAttention a) { decode_attention_ = a; }
  kernels::DecodeAttention decode_attention() const { return decode_attention_; }
  // decode_batch's appends and attention: all rows in one launch each (true, the default), or
  // one append and one attention launch per row as before (the same bits; bench_device_forward
  // times both).
  void set_batched_rows(bool on) { batched_rows_ = on; }
  static const char* decode_attention_name(kernels::DecodeAttention a) {
    return a == kernels::DecodeAttention::row_warps   ? "row_warps"
           : a == kernels::DecodeAttention::pipelined ? "pipelined"
                                                      : "key_threads";
  }

  // Bytes of device scratch held now (activations for the largest chunk seen + workspaces).
  int64_t scratch_bytes() const { return scratch_bytes_; }
  // Whether this rank receives the logits (tp rank 0, or the only rank).
  bool is_logits_rank() const { return w_.shard.is_logits_rank; }
  const TpShard& shard() const { return w_.shard; }

 private:
  Status ensure_scratch(int64_t n);
  Status ensure_logits(int64_t rows);
  void free_scratch();
  Status project(const DeviceMatrix& w, const float* bias, const float* x, float* y, int64_t n);
  Status project_rows(const DeviceMatrix& w, const float* bias, const float* x, float* y, int64_t n);
  // y[n, w.rows] = x[n, w.cols] · wᵀ (+ bias) through cuBLAS on bf16: x converted into xb_; a
  // block-format matrix dequantized into wb_ a slab of rows at a time, each GEMM filling its columns of y.
  Status gemm(const DeviceMatrixView& w, const float* bias, const float* x, float* y, int64_t n);
  // The same through the row-invariant GEMV (bf16 or block-format kernel).
  void gemv_rows(const DeviceMatrixView& w, const float* bias, const float* x, float* y, int64_t n);
  Status attend(int32_t seq, int layer, const float* q, const int32_t* positions, int64_t n, float* out);
  // The decode rows of decode_batch (q_ row b: sequence seqs[b]) against their own caches in one
  // launch (attention_decode_rows_cuda), into attn_out_.
  Status attend_rows(const int32_t* seqs, int layer, int64_t n);
  // attn_ws_ of at least `bytes` (grown by doubling; the growth waits for the stream).
  Status reserve_attention_workspace(size_t bytes);
  // The row-parallel sum of h_[0, n·hidden) over the tp group (nothing at tp 1).
  Status reduce(int64_t n);
  // The LM head on the normalised rows h_[rows, hidden]: this rank's vocabulary rows (the
  // row-invariant GEMV when rowwise or rows == 1, else cuBLAS), gathered into
  // logits_[rows, vocab] on the logits rank.
  Status head(int64_t rows, bool rowwise);
  Status check_shard() const;
  // The layer's q, k, v of h_, q and k after RoPE (q into q_, and qg_ when replicated); rows:
  // the decode GEMVs, q/k/v in one launch.
  Status attention_inputs(const DeviceLayer& L, int l, int64_t n, bool rows);
  // The embedding rows of tokens[n] (device ids) into out [n, hidden], times the embedding scale.
  Status embed(const int32_t* tokens, int64_t n, float* out);
  // Layer l's attention: attn_ with the layer's sliding window (gemma3: local layers only).
  kernels::AttentionParams layer_attn(int l) const {
    kernels::AttentionParams a = attn_;
    a.sliding_window = config_.layer_window(l);
    return a;
  }
  // Layer l's RoPE frequencies: gemma3's local layers have their own base.
  const float* layer_inv_freq(int l) const {
    return inv_freq_local_ != nullptr && config_.layer_is_local(l) ? inv_freq_local_ : inv_freq_;
  }
  // A gemma3 local layer: no policy compresses it; it keeps its window (exact), as the CPU's
  // KvCompressor does with CompressorShape::layer_windows.
  bool windowed(int l) const { return config_.sliding_window_pattern > 0 && config_.layer_window(l) > 0; }
  // Decode rows after attention: o_proj, the residual, RMSNorm, the fused gate/up/SwiGLU GEMV,
  // down_proj and the residual (the residual adds fused into the GEMVs at tp 1).
  Status finish_layer_rows(const DeviceLayer& L, int64_t n);
  // This rank's KV head is replicated across ranks (tp > num_kv_heads): q_proj holds its
  // whole GQA group, which scores; only the rank's own heads attend.
  bool replicated() const { return w_.shard.q_load_heads != w_.shard.num_heads; }
  // The queries selection scores with: the group's (qg_) when replicated, else q_.
  const float* score_queries() const { return qg_ != nullptr ? qg_ : q_; }
  // Layer l over the n rows of x_ at positions_ (= start..): append, capture, attention, MLP.
  Status run_layer(int32_t seq, int l, int64_t n, int64_t start);
  // compress() over the layers without a window of their own (every layer but gemma3's local ones).
  Status compress_policy(int32_t seq, const KvPolicy& policy, int64_t compress_at,
                         std::vector<std::vector<std::vector<int32_t>>>* kept, int layer);
  // device_compress.cpp: H2O accumulation of one chunk's rows [0, m) of q_ (positions start..).
  Status accumulate_h2o(int32_t seq, int layer, int64_t start, int64_t m);
  // Kept prefix ids (g·stride + j, ascending) + the positions [tail, n) of every head -> the
  // per-head lists, compacted into the pool (a fresh prefill: logical entry j = position j).
  Status compact_ids(int32_t seq, int layer, const std::vector<int32_t>& ids, int64_t stride, int64_t tail, int64_t n,
                     std::vector<std::vector<int32_t>>* kept);

  // The model as this rank sees it: num_heads, num_kv_heads and intermediate_size are the
  // shard's (the whole model's at tp 1); vocab_size is the whole vocabulary.
  const ModelConfig config_;
  const DeviceWeights& w_;
  DeviceKvPool& pool_;
  DeviceExchange* exchange_ = nullptr;  // null: one rank
  float *head_part_ = nullptr, *head_all_ = nullptr;  // tp: [cap, vocab_chunk], [tp, cap, vocab_chunk]
  float* qg_ = nullptr;  // replicated KV head: [cap, q_load_heads, head_dim], the group's queries
  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
  kernels::AttentionParams attn_;        // the rank's own query heads over its KV heads
  kernels::AttentionParams score_attn_;  // the scoring heads (q_load_heads) over them
  // Device scratch for chunks of up to cap_ tokens (the LM head's for up to logits_cap_ rows).
  int64_t cap_ = 0;
  int64_t logits_cap_ = 0, logits_bytes_ = 0;  // rows logits_ (and head_part_, head_all_) hold
  int64_t scratch_bytes_ = 0;
  float *x_ = nullptr, *h_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_out_ = nullptr;
  float *gate_ = nullptr, *up_ = nullptr, *logits_ = nullptr, *inv_freq_ = nullptr;
  float* inv_freq_local_ = nullptr;  // gemma3 local layers' RoPE frequencies (null: none)
  __nv_bfloat16* xb_ = nullptr;  // bf16 copy of a GEMM input [cap, max(hidden, q dim, ff)]
  // Block-format weights: a slab of a matrix's rows dequantized for cuBLAS (allocated at the
  // first prompt GEMM: min(largest block-format layer matrix, k_dequant_slab_elements) bf16 values).
  __nv_bfloat16* wb_ = nullptr;
  int64_t wb_elems_ = 0;
  int32_t *tokens_ = nullptr, *positions_ = nullptr, *greedy_ = nullptr;
  void* attn_ws_ = nullptr;
  size_t attn_ws_bytes_ = 0;
  PromptAttention prompt_attention_ = PromptAttention::tensor_cores;
  kernels::PrefillAttention prefill_kernel_ = kernels::PrefillAttention::mma;
  kernels::DecodeAttention decode_attention_ = kernels::DecodeAttention::key_threads;
  bool batched_rows_ = true;
  int window_ = 0;               // observed window W (0: none)
  int64_t window_rows_ = 0;      // rows the last observed chunk had (must be >= W)
  std::vector<float*> win_q_;    // [layer] device [W, num_heads, head_dim]
  int64_t h2o_tokens_ = 0;       // H2O: positions < this are accumulated (0: off)
  std::vector<float*> h2o_acc_;  // [layer] device [num_heads, h2o_tokens_]
  std::vector<int64_t> h2o_seen_;  // [layer] positions accumulated so far
  void* h2o_ws_ = nullptr;       // row statistics of one chunk
  size_t h2o_ws_bytes_ = 0;
  int64_t layerwise_state_bytes_ = 0;
};

}  // namespace snap
