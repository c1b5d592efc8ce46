// Gemma 3 configuration from GGUF metadata plus transformers' Gemma3TextConfig defaults.
// The GGUF (llama.cpp's converter) writes the Llama-family keys under `gemma3.` and the
// sliding window, but neither the local/global layer pattern nor the local RoPE base, which
// llama.cpp itself hard-codes for this architecture. Checked against transformers'
// configuration_gemma3.py / modeling_gemma3.py (see tools/reference_gemma3.py):
//  - layer_types: "sliding_attention" unless (i + 1) % sliding_window_pattern == 0, with
//    sliding_window_pattern 6: layers 5, 11, 17 of 18 are global;
//  - rope_local_base_freq 10,000 on sliding layers (no rope scaling there); rope_theta
//    (GGUF rope.freq_base, 1e6) and any rope scaling on global layers;
//  - query_pre_attn_scalar 256: attention scale 256^-0.5 (= 1/sqrt(head_dim) for 270M);
//  - the embedding times hidden_size**0.5 cast to the model dtype (f32 here);
//  - Gemma3RMSNorm is x * (1 + w): llama.cpp's converter stores w + 1, so the GGUF norm
//    weights are used as they are (plain RMSNorm);
//  - final_logit_softcapping and attn_logit_softcapping are None for Gemma 3.
#include "worker/model/gemma3_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "worker/model/gguf.h"

namespace snap {

namespace {

constexpr int k_gemma3_sliding_window_pattern = 6;
constexpr double k_gemma3_rope_local_base = 10000.0;
constexpr double k_gemma3_query_pre_attn_scalar = 256.0;

Result<double> opt_float(const GgufFile& g, const std::string& key, double def) {
  if (!g.find(key)) return def;
  return g.get_float(key);
}

}  // namespace

Status gemma3_config_from_gguf(const GgufFile& g, ModelConfig* c) {
  const std::string& path = g.path();
  const std::string p = "gemma3.";
  if (c->sliding_window <= 0)
    return invalid_argument(path + ": gemma3 needs metadata '" + p + "attention.sliding_window' > 0");
  c->sliding_window_pattern = k_gemma3_sliding_window_pattern;
  if (const GgufValue* v = g.find(p + "attention.sliding_window_pattern")) {
    if (v->type == GgufType::array)
      return unimplemented(path + ": per-layer '" + p + "attention.sliding_window_pattern' is not supported");
    SNAP_ASSIGN_OR_RETURN(int64_t pattern, g.get_int(p + "attention.sliding_window_pattern"));
    if (pattern < 1 || pattern > c->num_layers + 1)
      return invalid_argument(path + ": " + p + "attention.sliding_window_pattern = " + std::to_string(pattern) +
                              " is out of range [1, block_count + 1]");
    c->sliding_window_pattern = static_cast<int>(pattern);
  }
  SNAP_ASSIGN_OR_RETURN(double local_base, opt_float(g, p + "rope.freq_base_swa", k_gemma3_rope_local_base));
  if (!(local_base > 0.0) || !std::isfinite(local_base))
    return invalid_argument(path + ": " + p + "rope.freq_base_swa must be positive");
  c->rope_local_theta = static_cast<float>(local_base);
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    SNAP_ASSIGN_OR_RETURN(double cap, opt_float(g, p + key, 0.0));
    if (cap != 0.0) return unimplemented(path + ": " + p + key + " (logit soft-capping) is not supported");
  }
  c->qk_norm = true;
  c->post_norms = true;
  c->gelu_mlp = true;
  c->embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c->hidden_size)));
  c->attn_scale = static_cast<float>(1.0 / std::sqrt(k_gemma3_query_pre_attn_scalar));
  // Gemma's chat turns end with <end_of_turn>, not <eos>: generation stops at either.
  if (const GgufValue* toks = g.find("tokenizer.ggml.tokens"); toks && toks->type == GgufType::array) {
    for (size_t i = 0; i < toks->arr.size(); ++i) {
      if (toks->arr[i].s != "<end_of_turn>") continue;
      const auto id = static_cast<int32_t>(i);
      if (std::find(c->eos_token_ids.begin(), c->eos_token_ids.end(), id) == c->eos_token_ids.end())
        c->eos_token_ids.push_back(id);
      break;
    }
  }
  return Status();
}

}  // namespace snap
