// Model hyper-parameters for Llama-family decoders (llama, mistral, qwen2) and Gemma 3,
// read from a Hugging Face config.json or from GGUF metadata. Missing or
// out-of-range fields are a one-line Status naming the file and the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"

namespace snap {

class GgufFile;

enum class Arch : uint8_t { llama, mistral, qwen2, gemma3 };
const char* arch_name(Arch a);

struct ModelConfig {
  Arch arch = Arch::llama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // explicit `head_dim` if given, else hidden_size / num_heads
  float rms_norm_eps = 1e-5f;
  kernels::RopeConfig rope;
  int64_t max_position = 0;  // max_position_embeddings / context_length
  int sliding_window = 0;    // 0: none (mistral may set it)
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (qwen2)
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;  // generation stops at any of these
  std::string name;                    // human-readable, for logs and /v1/models

  // Gemma 3 (worker/model/gemma3_config.cpp); the defaults are the Llama family's.
  // > 0: layer l is global (full attention, rope.theta) iff (l + 1) % pattern == 0, the
  // others local (sliding_window, rope_local_theta). 0: every layer uses sliding_window.
  int sliding_window_pattern = 0;
  float rope_local_theta = 0.0f;  // local layers' RoPE base (no scaling); 0: rope.theta
  bool qk_norm = false;           // RMSNorm over head_dim on each q and k head, before RoPE
  bool post_norms = false;        // RMSNorm on the attention and MLP outputs before each residual add
  bool gelu_mlp = false;          // GeGLU (gelu tanh) instead of SwiGLU
  float embed_scale = 1.0f;       // embeddings times this (gemma3: sqrt(hidden_size) in f32)
  float attn_scale = 0.0f;        // attention logit scale; 0: 1/sqrt(head_dim)

  // Whether layer l attends through a sliding window, and that window (0: none).
  bool layer_is_local(int layer) const {
    return sliding_window > 0 && (sliding_window_pattern == 0 || (layer + 1) % sliding_window_pattern != 0);
  }
  int layer_window(int layer) const { return layer_is_local(layer) ? sliding_window : 0; }

  // Checks internal consistency (divisibility, positivity); `source` names the file.
  Status validate(const std::string& source) const;
};

// From a Hugging Face config.json (path to the file); a generation_config.json beside it
// adds its eos_token_id to the stop ids.
Result<ModelConfig> config_from_hf_json(const std::string& path);
// From GGUF metadata (`<arch>.block_count`, `<arch>.attention.head_count`, ...).
Result<ModelConfig> config_from_gguf(const GgufFile& file);

}  // namespace snap
