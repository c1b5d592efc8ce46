// Gemma 3 configuration from GGUF metadata or a Hugging Face config.json, with transformers'
// Gemma3TextConfig defaults. The GGUF (llama.cpp's converter) writes the Llama-family keys
// under `gemma3.` and the sliding window, but neither the local/global layer pattern nor the
// local RoPE base, which llama.cpp itself hard-codes for this architecture; a config.json
// (model_type gemma3_text) states them as layer_types (or sliding_window_pattern) and
// rope_local_base_freq. Checked against transformers' configuration_gemma3.py /
// modeling_gemma3.py (see tools/reference_gemma3.py):
//  - layer_types: "sliding_attention" unless (i + 1) % sliding_window_pattern == 0, with
//    sliding_window_pattern 6: layers 5, 11, 17 of 18 are global;
//  - rope_local_base_freq 10,000 on sliding layers (no rope scaling there); rope_theta
//    (GGUF rope.freq_base, 1e6) and any rope scaling on global layers;
//  - the attention scale query_pre_attn_scalar^-0.5. A GGUF does not state the scalar: as
//    llama.cpp does, it is head_dim, or hidden_size / heads for the 62-layer 27B. That is the
//    published value of every Gemma 3 (256 for 270M-12B, 168 for 27B);
//  - the embedding times hidden_size**0.5 cast to the model dtype (f32 here);
//  - Gemma3RMSNorm is x * (1 + w): llama.cpp's converter stores w + 1, so the GGUF norm
//    weights are used as they are (plain RMSNorm); safetensors hold w, and the loader adds
//    the 1 (weights.cpp);
//  - final_logit_softcapping and attn_logit_softcapping are None for Gemma 3.
#include "worker/model/gemma3_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "worker/model/gguf.h"
#include "worker/model/json_fields.h"

namespace snap {

namespace {

constexpr int k_gemma3_sliding_window_pattern = 6;
constexpr double k_gemma3_rope_local_base = 10000.0;
constexpr double k_gemma3_query_pre_attn_scalar = 256.0;  // Gemma3TextConfig's default
constexpr int k_gemma3_27b_layers = 62;

Result<double> opt_float(const GgufFile& g, const std::string& key, double def) {
  if (!g.find(key)) return def;
  return g.get_float(key);
}

// What every Gemma 3 text model sets, whichever file it came from.
void set_gemma3_layers(double query_pre_attn_scalar, ModelConfig* c) {
  c->qk_norm = true;
  c->post_norms = true;
  c->gelu_mlp = true;
  c->embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c->hidden_size)));
  c->attn_scale = static_cast<float>(1.0 / std::sqrt(query_pre_attn_scalar));
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
  const double scalar = c->num_layers == k_gemma3_27b_layers
                            ? static_cast<double>(c->hidden_size) / c->num_heads
                            : static_cast<double>(c->head_dim);
  set_gemma3_layers(scalar, c);
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

bool gemma3_is_vision_language(const nlohmann::json& top) {
  if (top.contains("architectures") && top["architectures"].is_array() && !top["architectures"].empty())
    return top["architectures"][0] == "Gemma3ForConditionalGeneration";
  return top.contains("model_type") && top["model_type"] == "gemma3";
}

Result<nlohmann::json> gemma3_text_config(const std::string& path, const nlohmann::json& top) {
  nlohmann::json text = top;
  if (gemma3_is_vision_language(top)) {
    if (!top.contains("text_config") || !top["text_config"].is_object())
      return invalid_argument(path + ": a Gemma3ForConditionalGeneration config needs a 'text_config' object");
    text = top["text_config"];
    // Gemma3Config's own fields speak for the whole model: the -it checkpoints list
    // <end_of_turn> in its eos_token_id, and it says whether the embeddings are tied.
    for (const char* key : {"eos_token_id", "bos_token_id", "tie_word_embeddings"}) {
      if (top.contains(key) && !top[key].is_null()) text[key] = top[key];
    }
  }
  // Gemma3TextConfig's defaults: the 4B-27B checkpoints' text_config states only a few fields.
  const nlohmann::json defaults = {
      {"vocab_size", 262208},      {"hidden_size", 2304},  {"intermediate_size", 9216},
      {"num_hidden_layers", 26},   {"num_attention_heads", 8}, {"num_key_value_heads", 4},
      {"head_dim", 256},           {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 131072},
      {"tie_word_embeddings", true}, {"bos_token_id", 2},  {"eos_token_id", 1}};
  for (const auto& [key, value] : defaults.items()) {
    if (!text.contains(key)) text[key] = value;
  }
  return text;
}

Status gemma3_config_from_hf(const std::string& path, const nlohmann::json& j, ModelConfig* c) {
  const JsonFields f(path, j);
  SNAP_ASSIGN_OR_RETURN(int64_t window, f.opt_int("sliding_window", 4096));
  if (window < 1 || window > (int64_t{1} << 30))
    return invalid_argument(path + ": sliding_window = " + std::to_string(window) + " is out of range [1, 2^30]");
  c->sliding_window = static_cast<int>(window);
  // layer_types (transformers >= 4.53) or the older sliding_window_pattern.
  if (f.has("layer_types")) {
    const nlohmann::json& types = j["layer_types"];
    if (!types.is_array() || types.size() != static_cast<size_t>(c->num_layers))
      return invalid_argument(path + ": layer_types must be a list of num_hidden_layers (" +
                              std::to_string(c->num_layers) + ") strings");
    int pattern = c->num_layers + 1;  // no full-attention layer: every layer is local
    for (int l = 0; l < c->num_layers; ++l) {
      if (types[static_cast<size_t>(l)] == "full_attention") {
        pattern = l + 1;
        break;
      }
    }
    for (int l = 0; l < c->num_layers; ++l) {
      const nlohmann::json& t = types[static_cast<size_t>(l)];
      if (t != "sliding_attention" && t != "full_attention")
        return invalid_argument(path + ": layer_types[" + std::to_string(l) + "] is " + t.dump() +
                                " (expected \"sliding_attention\" or \"full_attention\")");
      if ((t == "full_attention") != ((l + 1) % pattern == 0))
        return unimplemented(path + ": layer_types must be full_attention on layers l with (l + 1) % " +
                             std::to_string(pattern) + " == 0 and sliding_attention elsewhere (layer " +
                             std::to_string(l) + " is " + t.dump() + "); other layouts are not supported");
    }
    c->sliding_window_pattern = pattern;
  } else {
    SNAP_ASSIGN_OR_RETURN(int64_t pattern, f.opt_int("sliding_window_pattern", k_gemma3_sliding_window_pattern));
    if (pattern < 1 || pattern > c->num_layers + 1)
      return invalid_argument(path + ": sliding_window_pattern = " + std::to_string(pattern) +
                              " is out of range [1, num_hidden_layers + 1]");
    c->sliding_window_pattern = static_cast<int>(pattern);
  }
  // transformers 5 writes rope_parameters.sliding_attention instead of rope_local_base_freq.
  SNAP_ASSIGN_OR_RETURN(double local_base, f.opt_float("rope_local_base_freq", k_gemma3_rope_local_base));
  if (f.has("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("sliding_attention")) {
    const nlohmann::json& local = j["rope_parameters"]["sliding_attention"];
    if (!local.is_object())
      return invalid_argument(path + ": rope_parameters.sliding_attention must be an object");
    const JsonFields lf(path, local);
    SNAP_ASSIGN_OR_RETURN(std::string type, lf.opt_string("rope_type", "default"));
    if (type != "default")
      return unimplemented(path + ": rope_parameters.sliding_attention.rope_type '" + type +
                           "' is not supported (Gemma 3's local layers use the default RoPE)");
    SNAP_ASSIGN_OR_RETURN(local_base, lf.opt_float("rope_theta", local_base));
  }
  if (!(local_base > 0.0) || !std::isfinite(local_base))
    return invalid_argument(path + ": the local layers' RoPE base (rope_local_base_freq) must be positive");
  c->rope_local_theta = static_cast<float>(local_base);
  SNAP_ASSIGN_OR_RETURN(double scalar, f.opt_float("query_pre_attn_scalar", k_gemma3_query_pre_attn_scalar));
  if (!(scalar > 0.0) || !std::isfinite(scalar))
    return invalid_argument(path + ": query_pre_attn_scalar must be positive");
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    SNAP_ASSIGN_OR_RETURN(double cap, f.opt_float(key, 0.0));
    if (cap != 0.0) return unimplemented(path + ": " + key + " (logit soft-capping) is not supported");
  }
  // transformers reads hidden_activation; hidden_act is the older key.
  SNAP_ASSIGN_OR_RETURN(std::string act, f.opt_string("hidden_act", "gelu_pytorch_tanh"));
  SNAP_ASSIGN_OR_RETURN(act, f.opt_string("hidden_activation", act));
  if (act != "gelu_pytorch_tanh")
    return unimplemented(path + ": hidden_activation '" + act + "' is not supported (Gemma 3 uses gelu_pytorch_tanh)");
  SNAP_ASSIGN_OR_RETURN(bool bidirectional, f.opt_bool("use_bidirectional_attention", false));
  if (bidirectional)
    return unimplemented(path + ": use_bidirectional_attention (an embedding model) is not supported");
  set_gemma3_layers(scalar, c);
  return Status();
}

}  // namespace snap
