// A model's weights on one GPU: every projection and the LM head as bf16 [rows, cols]
// (f32 accumulation in the kernels), the embedding table bf16, norms (Gemma 3's q/k and
// post-norms too) and biases f32. Built
// from a LoadedModel whose matrices are f32/f16/bf16 (load with keep_quantized = false, so a
// GGUF's Q8_0/Q4_0/Q4_1 tensors arrive dequantized); tied embeddings share one table.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "worker/model/weights.h"

namespace snap {

// One device allocation, freed on destruction.
struct DeviceArray {
  void* ptr = nullptr;
  int64_t bytes = 0;
  DeviceArray() = default;
  DeviceArray(DeviceArray&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; o.bytes = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray();
  const __nv_bfloat16* bf16() const { return static_cast<const __nv_bfloat16*>(ptr); }
  const float* f32() const { return static_cast<const float*>(ptr); }
};

struct DeviceMatrix {
  DeviceArray data;  // bf16 [rows, cols]
  int64_t rows = 0, cols = 0;
};

struct DeviceLayer {
  DeviceArray attn_norm, ffn_norm;     // f32 [hidden]
  DeviceMatrix q, k, v, o, gate, up, down;
  DeviceArray q_bias, k_bias, v_bias;  // f32, empty without attention_bias
  // Gemma 3 only (empty otherwise), f32: the per-head q/k RMSNorm weights [head_dim] and the
  // norms on the attention and MLP outputs [hidden] (LayerWeights: stored as 1 + w).
  DeviceArray q_norm, k_norm, post_attn_norm, post_ffn_norm;
};

// The LM head rows one rank multiplies: a view into lm_head or (tied) the embedding table.
struct DeviceHeadView {
  const __nv_bfloat16* data = nullptr;  // [rows, cols]
  int64_t rows = 0, cols = 0;
};

struct DeviceWeights {
  // What these weights are of the model: the whole (tp 1) or one tensor-parallel rank's shard
  // (worker/model/shard.h: its query/KV heads, MLP slice and vocabulary rows); the embedding
  // is whole on every rank.
  TpShard shard;
  DeviceMatrix embed;  // [vocab, hidden]
  std::vector<DeviceLayer> layers;
  DeviceArray final_norm;
  DeviceMatrix lm_head;  // empty when tied: use embed
  const DeviceMatrix& output() const { return lm_head.rows == 0 ? embed : lm_head; }
  // This rank's LM head rows [shard.vocab_size, hidden]: lm_head (already the shard's rows),
  // or the tied embedding's rows from shard.vocab_begin.
  DeviceHeadView head() const;
  int64_t bytes = 0;  // device bytes held

  // The model, or the shard of it that `model` holds (LoadOptions tp_rank/tp_size; with
  // replicated KV heads, q_proj holds the whole GQA group's rows). One-line errors: a
  // quantized matrix, or cudaMalloc failing (with the bytes asked for).
  static Result<std::unique_ptr<DeviceWeights>> upload(const LoadedModel& model);
};

}  // namespace snap
