// Owned model weights in the Hugging Face layout (row-major [out, in]), loaded from GGUF
// or safetensors. Projection matrices and the LM head keep a GGUF tensor's q8_0/q4_0/q4_1/q5_0/q5_1/q2_k-q6_k
// blocks as they are (LoadOptions::keep_quantized), or are quantized to q8_0 at load from
// any format (LoadOptions::weight_dtype q8_0); everything else is dequantized.
// GGUF llama/mistral Q and K projections are stored permuted for interleaved RoPE; the
// loader undoes that (on whole rows, so also on block rows) so the forward pass always
// uses the HF rotate_half layout and both formats give identical logits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/kernels.h"
#include "worker/model/config.h"
#include "worker/model/shard.h"

namespace snap {

// A dense owned matrix [rows, cols] (a vector is rows=1), 64-byte aligned. In a block
// format (common/dtype.h) each row is cols/32 consecutive blocks, or, after pack_tiles4(),
// the same bytes in the decode matvec's 4-row tiles (kernels/weight_tiles.h).
class Matrix {
 public:
  Matrix() = default;
  Matrix(DType dtype, int64_t rows, int64_t cols);
  DType dtype() const { return dtype_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool empty() const { return rows_ * cols_ == 0; }
  int64_t nbytes() const { return rows_ * dtype_row_bytes(dtype_, cols_); }
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  float* f32() {
    CHECK(dtype_ == DType::f32) << "f32() on a " << dtype_name(dtype_) << " matrix";
    return static_cast<float*>(data_.get());
  }
  const float* f32() const {
    CHECK(dtype_ == DType::f32) << "f32() on a " << dtype_name(dtype_) << " matrix";
    return static_cast<const float*>(data_.get());
  }
  kernels::WeightLayout layout() const { return layout_; }
  kernels::WeightView view() const { return {dtype_, data_.get(), rows_, cols_, layout_}; }
  // Rearranges a q8_0/q4_0/q4_1 matrix into WeightLayout::tiles4, in place (no-op if it is).
  void pack_tiles4();

 private:
  struct Free { void operator()(void* p) const; };
  kernels::WeightLayout layout_ = kernels::WeightLayout::rows;
  DType dtype_ = DType::f32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  std::unique_ptr<void, Free> data_;
};

// Shapes are those of one tensor-parallel shard (TpShard; the whole model when tp = 1):
// q heads = shard.q_load_heads, kv heads = shard.num_kv_heads, o_proj's columns are the
// shard's own heads (shard.num_heads), ff = shard.ff_size.
struct LayerWeights {
  Matrix attn_norm;             // [1, hidden_size] f32
  Matrix q_proj;                // [q heads*head_dim, hidden_size]
  Matrix k_proj;                // [kv heads*head_dim, hidden_size]
  Matrix v_proj;                // [kv heads*head_dim, hidden_size]
  Matrix q_bias, k_bias, v_bias;  // [1, ...] f32, empty unless attention_bias
  Matrix o_proj;                // [hidden_size, num_heads*head_dim]
  Matrix ffn_norm;              // [1, hidden_size] f32
  Matrix gate_proj;             // [ff, hidden_size]
  Matrix up_proj;               // [ff, hidden_size]
  Matrix down_proj;             // [hidden_size, ff]
  // Gemma 3 only (empty otherwise): per-head q/k RMSNorm weights and the norms on the
  // attention and MLP outputs; GGUF stores them as 1 + w (Gemma3RMSNorm's x * (1 + w)).
  Matrix q_norm, k_norm;        // [1, head_dim] f32
  Matrix post_attn_norm;        // [1, hidden_size] f32
  Matrix post_ffn_norm;         // [1, hidden_size] f32
};

struct ModelWeights {
  // [vocab_size, hidden_size]: f32, or the GGUF's blocks in a format the matmul reads when kept
  // (LoadOptions::keep_quantized); looked-up rows are dequantized.
  Matrix embed;
  std::vector<LayerWeights> layers;
  Matrix final_norm;  // [1, hidden_size] f32
  // [shard.vocab_size, hidden_size] (this rank's vocabulary rows); when tied, empty (use
  // embed's rows from shard.vocab_begin), except on a tensor-parallel shard of part of the
  // vocabulary whose table is kept in blocks: then a copy of its rows in that format.
  Matrix lm_head;
  // The LM head matrix: lm_head, or the whole embed table when tied (then a shard uses its
  // rows from shard.vocab_begin; see LlamaForward). For SmolLM2-135M at tp 1: the q8_0
  // table, 30 MB, 4x fewer bytes read per decoded token than an f32 table.
  const Matrix& output() const { return lm_head.empty() ? embed : lm_head; }
  int64_t nbytes() const;
};

struct LoadOptions {
  // f32/f16/bf16: storage of the projections the file does not keep in blocks (norms and an
  // untied embedding table stay f32). q8_0: every projection and the LM head (a tied table
  // too) whose slice is whole blocks of 32 is stored as q8_0, quantized at load as ggml does
  // (worker/model/dequant.h; a GGUF q8_0 tensor is copied as it is), whatever the file holds;
  // keep_quantized is then ignored.
  DType weight_dtype = DType::f32;
  // Projection matrices, the LM head and the embedding table whose GGUF type is a block format
  // (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k .. q6_k) stay in that format (the CPU's and the device's
  // matmuls decode them on the fly); false dequantizes them to weight_dtype.
  bool keep_quantized = true;
  // Tensor-parallel rank and size: only that rank's shard is read from the file (the
  // rest of the file is never touched, beyond its header). A row-parallel shard whose
  // columns do not start and end on a block boundary is dequantized instead of kept.
  int tp_rank = 0;
  int tp_size = 1;
  // Weights stored other than as f32 (f16, bf16, q8_0 quantized at load) are read through f32
  // scratch, this many floats per loading thread at a time (whole rows, at least one): 16 MiB
  // by default, whatever the tensor's size.
  int64_t scratch_floats = int64_t{4} << 20;
  // Kept q8_0/q4_0/q4_1 projections and LM head are rearranged into the decode matvec's 4-row
  // tiles (kernels/weight_tiles.h) where the CPU matvec reads them (kernels::
  // weight_tiles4_wanted(): q8x3act on AVX-512 VNNI or AVX2; decided by the matvec mode set before
  // loading). Every CPU path reads either layout; false keeps the file's row-major blocks
  // (the device upload and the tests that compare bytes with the file).
  bool matvec_tiles = true;
};

struct LoadedModel {
  std::string path;
  std::string format;  // "gguf" or "safetensors"
  ModelConfig config;  // the whole model's
  TpShard shard;       // what `weights` holds of it
  ModelWeights weights;
};

// The --weight-dtype names: auto (GGUF q8_0/q4_0/q4_1/q5_0/q5_1/q2_k-q6_k projections kept in their blocks,
// the rest f32), f32, f16, bf16 (every projection dequantized to it), q8_0 (every projection and
// the LM head quantized to q8_0 at load). Sets weight_dtype and keep_quantized; an unknown
// name is invalid_argument.
Status apply_weight_dtype(const std::string& name, LoadOptions* opts);

// path: a .gguf file, or a Hugging Face directory (config.json + safetensors).
Result<LoadedModel> load_model(const std::string& path, const LoadOptions& opts = {});

}  // namespace snap
