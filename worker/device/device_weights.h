// A model's weights on one GPU: every projection and the LM head as bf16 [rows, cols] or in a
// block format (f32 accumulation in the kernels), the embedding table likewise, norms (Gemma 3's
// q/k and post-norms too) and biases f32. Built from a LoadedModel loaded with matvec_tiles =
// false (row-major blocks); tied embeddings share one table.
// The matrices the loader holds in a block format stay in it on the device (kernels_cuda.h
// BlockWeights: quants, f16 scales, mins and extra bytes as aligned arrays): Q8_0 from
// --weight-dtype q8_0 (LoadOptions::weight_dtype q8_0: 1.0625 bytes a weight instead of 2), and
// with --weight-dtype auto (LoadOptions::keep_quantized) a GGUF's own Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q4_K, Q5_K, Q6_K, Q3_K and Q2_K (0.5625 / 0.625 / 0.6875 / 0.75 / 0.5625 / 0.6875 / 0.8203 /
// 0.4297 / 0.3281 bytes a weight for all but the first); the rest (other GGUF types, a column slice off the block grid, an untied
// embedding table under q8_0) is bf16.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/kernels_cuda.h"
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
  const uint16_t* u16() const { return static_cast<const uint16_t*>(ptr); }
};

// A matrix's rows on the device, bf16 or a block format: a DeviceMatrix, or some rows of one
// (the LM head's vocabulary rows of a tied table).
struct DeviceMatrixView {
  const __nv_bfloat16* data = nullptr;  // bf16 [rows, cols]; null in a block format
  int64_t rows = 0, cols = 0;
  kernels::BlockWeights blocks;         // blocks.quants set: a block format (kernels_cuda.h)
  bool is_blocks() const { return blocks.quants != nullptr; }
  // Rows [begin, begin + n).
  DeviceMatrixView rows_from(int64_t begin, int64_t n) const {
    DeviceMatrixView v = *this;
    if (is_blocks())
      v.blocks = kernels::block_rows_from(blocks, cols, begin);
    else
      v.data += begin * cols;
    v.rows = n;
    return v;
  }
};

struct DeviceMatrix {
  DeviceArray data;    // bf16 [rows, cols], or a block format's quants
  DeviceArray scales;  // block formats: f16 bits, one a block (32 or 256 weights); empty for bf16
  DeviceArray mins;    // Q4_1, Q4_K, Q5_K: f16 bits, one a block
  DeviceArray extra;   // Q5_0, Q4_K, Q5_K, Q6_K: their extra bytes (kernels_cuda.h BlockWeights)
  kernels::BlockFormat format = kernels::BlockFormat::q8_0;  // when scales are set
  int64_t rows = 0, cols = 0;
  bool is_blocks() const { return scales.ptr != nullptr; }
  int64_t bytes() const { return data.bytes + scales.bytes + mins.bytes + extra.bytes; }
  DeviceMatrixView view() const {
    DeviceMatrixView v;
    v.rows = rows;
    v.cols = cols;
    if (is_blocks()) {
      v.blocks.format = format;
      v.blocks.quants = data.ptr;
      v.blocks.scales = scales.u16();
      v.blocks.mins = mins.ptr != nullptr ? mins.u16() : nullptr;
      v.blocks.extra = static_cast<const uint8_t*>(extra.ptr);
    } else {
      v.data = data.bf16();
    }
    return v;
  }
};

struct DeviceLayer {
  DeviceArray attn_norm, ffn_norm;     // f32 [hidden]
  DeviceMatrix q, k, v, o, gate, up, down;
  DeviceArray q_bias, k_bias, v_bias;  // f32, empty without attention_bias
  // Gemma 3 only (empty otherwise), f32: the per-head q/k RMSNorm weights [head_dim] and the
  // norms on the attention and MLP outputs [hidden] (LayerWeights: stored as 1 + w).
  DeviceArray q_norm, k_norm, post_attn_norm, post_ffn_norm;
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
  DeviceMatrixView head() const;
  int64_t bytes = 0;  // device bytes held

  // What the matrices are held in: "bf16", or the block formats present ("q8_0", "q4_1 + bf16", ...).
  std::string storage() const;
  // The most weights of any block-format layer matrix (0: none): prompt chunks dequantize block
  // matrices to bf16 for cuBLAS in slabs of rows up to this size (capped by the forward), the
  // LM head in several when it is larger (SmolLM2: a 1.7 MB slab, not its 56 MB head).
  int64_t largest_blocks_layer_elements() const;

  // The model, or the shard of it that `model` holds (LoadOptions tp_rank/tp_size; with
  // replicated KV heads, q_proj holds the whole GQA group's rows). The host's block-format
  // matrices stay in their format, the rest become bf16. One-line errors: a matrix in the CPU
  // matvec's tiles (load with matvec_tiles = false), cudaMalloc failing (with the bytes asked for).
  static Result<std::unique_ptr<DeviceWeights>> upload(const LoadedModel& model);
};

}  // namespace snap
