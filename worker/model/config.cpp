// ModelConfig from a Hugging Face config.json or from GGUF metadata, and its checks.
// Defaults follow the transformers config classes (LlamaConfig, MistralConfig,
// Qwen2Config, Gemma3TextConfig) for optional fields; required fields missing are not_found naming the
// field. GGUF llama3 rope scaling lives in a `rope_freqs.weight` tensor, not metadata:
// we recover the llama3 parameters from it and refuse files it does not match.
#include "worker/model/config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "worker/model/gemma3_config.h"
#include "worker/model/gguf.h"
#include "worker/model/json_fields.h"

namespace snap {
namespace {

using json = nlohmann::json;

// Generous upper bounds so that a corrupt config cannot make int arithmetic overflow
// or ask for absurd allocations before any tensor is checked.
constexpr int64_t k_max_dim = int64_t{1} << 20;      // hidden, intermediate, head_dim
constexpr int64_t k_max_vocab = int64_t{1} << 24;
constexpr int64_t k_max_layers = 4096;
constexpr int64_t k_max_heads = 4096;

Status range(const std::string& source, const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return invalid_argument(source + ": " + field + " = " + std::to_string(v) + " is out of range [" +
                            std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return Status();
}

// HF semantics (transformers _compute_llama3_parameters) for the llama3 per-frequency
// divisor: used to check a GGUF `rope_freqs.weight` against candidate parameters.
std::vector<double> llama3_rope_factors(const kernels::RopeConfig& r) {
  const double pi = 3.14159265358979323846;
  const double low_wavelen = r.original_max_position / r.low_freq_factor;
  const double high_wavelen = r.original_max_position / r.high_freq_factor;
  std::vector<double> out;
  for (int i = 0; i < r.head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(static_cast<double>(r.theta), 2.0 * i / r.head_dim);
    const double wavelen = 2 * pi / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0);
    } else if (wavelen > low_wavelen) {
      out.push_back(r.factor);
    } else {
      const double smooth = (r.original_max_position / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      out.push_back(1.0 / ((1 - smooth) / r.factor + smooth));
    }
  }
  return out;
}

Result<Arch> arch_from_hf(const std::string& path, const json& j) {
  std::string name;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    name = j["architectures"][0].get<std::string>();
    if (name == "LlamaForCausalLM") return Arch::llama;
    if (name == "MistralForCausalLM") return Arch::mistral;
    if (name == "Qwen2ForCausalLM") return Arch::qwen2;
    if (name == "Gemma3ForCausalLM") return Arch::gemma3;
    if (name == "Gemma3ForConditionalGeneration") return Arch::gemma3;  // its text model (gemma3_config.h)
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    name = j["model_type"].get<std::string>();
    if (name == "llama") return Arch::llama;
    if (name == "mistral") return Arch::mistral;
    if (name == "qwen2") return Arch::qwen2;
    if (name == "gemma3_text" || name == "gemma3") return Arch::gemma3;
  } else {
    return not_found(path + ": missing field 'architectures' (or 'model_type')");
  }
  return unimplemented(path + ": unsupported architecture '" + name +
                       "' (supported: llama, mistral, qwen2, gemma3_text, gemma3)");
}

// One RoPE object: rope_scaling (rope_type or type, its factors), or transformers 5's
// rope_parameters, which also holds rope_theta. `field` names it in errors.
Status parse_rope_object(const std::string& path, const JsonFields& f, const json& rs, const std::string& field,
                         kernels::RopeConfig* rope) {
  if (!rs.is_object()) return invalid_argument(path + ": field '" + field + "' must be an object or null");
  std::string type;
  if (rs.contains("rope_type") && rs["rope_type"].is_string()) {
    type = rs["rope_type"].get<std::string>();
  } else if (rs.contains("type") && rs["type"].is_string()) {
    type = rs["type"].get<std::string>();
  } else {
    return invalid_argument(path + ": " + field + " has no 'rope_type' or 'type'");
  }
  auto num = [&](const char* key) -> Result<double> {
    if (!rs.contains(key) || rs[key].is_null())
      return not_found(path + ": missing field '" + field + "." + std::string(key) + "'");
    return f.as_float(field + "." + key, rs[key]);
  };
  if (rs.contains("rope_theta") && !rs["rope_theta"].is_null()) {
    SNAP_ASSIGN_OR_RETURN(double theta, num("rope_theta"));
    rope->theta = static_cast<float>(theta);
  }
  if (type == "default") return Status();
  if (type == "linear") {
    SNAP_ASSIGN_OR_RETURN(double factor, num("factor"));
    rope->scaling = kernels::RopeScaling::linear;
    rope->factor = static_cast<float>(factor);
    return Status();
  }
  if (type == "llama3") {
    SNAP_ASSIGN_OR_RETURN(double factor, num("factor"));
    SNAP_ASSIGN_OR_RETURN(double low, num("low_freq_factor"));
    SNAP_ASSIGN_OR_RETURN(double high, num("high_freq_factor"));
    SNAP_ASSIGN_OR_RETURN(double orig, num("original_max_position_embeddings"));
    rope->scaling = kernels::RopeScaling::llama3;
    rope->factor = static_cast<float>(factor);
    rope->low_freq_factor = static_cast<float>(low);
    rope->high_freq_factor = static_cast<float>(high);
    rope->original_max_position = static_cast<int>(orig);
    return Status();
  }
  return unimplemented(path + ": unsupported " + field + " type '" + type + "' (supported: default, linear, llama3)");
}

// rope_theta and rope_scaling (transformers 4), or rope_parameters (transformers 5 writes
// these instead; Gemma 3 keeps one per layer type, and its full_attention one is the
// global layers' RoPE: gemma3_config_from_hf reads sliding_attention's).
Status parse_rope(const std::string& path, const JsonFields& f, const json& j, double default_theta,
                  kernels::RopeConfig* rope) {
  rope->theta = static_cast<float>(default_theta);
  if (f.has("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (rp.is_object() && rp.contains("full_attention"))
      return parse_rope_object(path, f, rp["full_attention"], "rope_parameters.full_attention", rope);
    return parse_rope_object(path, f, rp, "rope_parameters", rope);
  }
  SNAP_ASSIGN_OR_RETURN(double theta, f.opt_float("rope_theta", default_theta));
  rope->theta = static_cast<float>(theta);
  if (!f.has("rope_scaling")) return Status();
  return parse_rope_object(path, f, j["rope_scaling"], "rope_scaling", rope);
}

Result<std::vector<int32_t>> token_ids(const std::string& path, const JsonFields& f, const json& v,
                                       const char* key) {
  std::vector<int32_t> out;
  if (v.is_null()) return out;
  if (v.is_array()) {
    for (const json& e : v) {
      SNAP_ASSIGN_OR_RETURN(int64_t id, f.as_int(key, e));
      SNAP_RETURN_IF_ERROR(range(path, key, id, 0, k_max_vocab));
      out.push_back(static_cast<int32_t>(id));
    }
    return out;
  }
  SNAP_ASSIGN_OR_RETURN(int64_t id, f.as_int(key, v));
  SNAP_RETURN_IF_ERROR(range(path, key, id, 0, k_max_vocab));
  out.push_back(static_cast<int32_t>(id));
  return out;
}

// generation_config.json's eos_token_id (what transformers' generate() stops at) joins
// config.json's: instruction-tuned checkpoints list their end-of-turn ids there (Gemma 3's
// <end_of_turn>, Llama 3's <|eot_id|>). No file, or no such field, adds nothing.
Status add_generation_eos(const std::filesystem::path& file, std::vector<int32_t>* eos) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return Status();
  const std::string path = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss(path + ": not a JSON object");
  if (!j.contains("eos_token_id")) return Status();
  const JsonFields f(path, j);
  SNAP_ASSIGN_OR_RETURN(std::vector<int32_t> ids, token_ids(path, f, j["eos_token_id"], "eos_token_id"));
  for (int32_t id : ids) {
    if (std::find(eos->begin(), eos->end(), id) == eos->end()) eos->push_back(id);
  }
  return Status();
}

// ---------------------------------------------------------------------------
// GGUF helpers

Result<int64_t> gguf_opt_int(const GgufFile& g, const std::string& key, int64_t def) {
  if (!g.find(key)) return def;
  return g.get_int(key);
}
Result<double> gguf_opt_float(const GgufFile& g, const std::string& key, double def) {
  if (!g.find(key)) return def;
  return g.get_float(key);
}
Result<int64_t> gguf_req_int(const GgufFile& g, const std::string& key) {
  if (!g.find(key)) return not_found(g.path() + ": missing metadata '" + key + "'");
  return g.get_int(key);
}

// Recovers llama3 parameters from `rope_freqs.weight` (per-frequency divisors written by
// llama.cpp's converter). The file keeps only the divisors, so we try the published
// Llama 3.x values (low 1, high 4, original context from metadata or 8192) with the
// factor read off the lowest frequency, and accept them only if they reproduce the tensor.
Status rope_from_gguf_freqs(const GgufFile& g, const GgufTensor& t, kernels::RopeConfig* rope) {
  const std::string where = g.path() + ": tensor 'rope_freqs.weight'";
  if (t.type != GgmlType::f32) return unimplemented(where + " is not F32");
  if (t.num_elements != rope->head_dim / 2)
    return data_loss(where + " has " + std::to_string(t.num_elements) + " elements, expected head_dim/2 = " +
                     std::to_string(rope->head_dim / 2));
  std::vector<float> f(static_cast<size_t>(t.num_elements));
  std::memcpy(f.data(), t.data, f.size() * sizeof(float));
  bool all_one = true;
  for (float v : f) all_one = all_one && v == 1.0f;
  if (all_one) return Status();
  const std::string arch = g.get_string("general.architecture").ok()
                               ? g.get_string("general.architecture").value() : "llama";
  SNAP_ASSIGN_OR_RETURN(int64_t orig, gguf_opt_int(g, arch + ".rope.scaling.original_context_length", 8192));
  kernels::RopeConfig cand = *rope;
  cand.scaling = kernels::RopeScaling::llama3;
  cand.factor = f.back();
  cand.low_freq_factor = 1.0f;
  cand.high_freq_factor = 4.0f;
  cand.original_max_position = static_cast<int>(orig);
  const std::vector<double> want = llama3_rope_factors(cand);
  for (size_t i = 0; i < f.size(); ++i) {
    if (!(std::fabs(want[i] - f[i]) <= 1e-4 * std::fabs(want[i]))) {
      std::ostringstream os;
      os << where << " does not match llama3 rope scaling with factor " << cand.factor
         << ", low_freq_factor 1, high_freq_factor 4, original context " << orig << " (index " << i
         << ": " << f[i] << " vs " << want[i] << "); unsupported";
      return unimplemented(os.str());
    }
  }
  *rope = cand;
  return Status();
}

}  // namespace

// ---------------------------------------------------------------------------

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::llama: return "llama";
    case Arch::mistral: return "mistral";
    case Arch::qwen2: return "qwen2";
    case Arch::gemma3: return "gemma3";
  }
  return "?";
}

Status ModelConfig::validate(const std::string& source) const {
  SNAP_RETURN_IF_ERROR(range(source, "vocab_size", vocab_size, 1, k_max_vocab));
  SNAP_RETURN_IF_ERROR(range(source, "hidden_size", hidden_size, 1, k_max_dim));
  SNAP_RETURN_IF_ERROR(range(source, "intermediate_size", intermediate_size, 1, k_max_dim));
  SNAP_RETURN_IF_ERROR(range(source, "num_layers", num_layers, 1, k_max_layers));
  SNAP_RETURN_IF_ERROR(range(source, "num_heads", num_heads, 1, k_max_heads));
  SNAP_RETURN_IF_ERROR(range(source, "num_kv_heads", num_kv_heads, 1, num_heads));
  SNAP_RETURN_IF_ERROR(range(source, "head_dim", head_dim, 2, k_max_dim / 4));
  SNAP_RETURN_IF_ERROR(range(source, "num_heads*head_dim", int64_t{num_heads} * head_dim, 1, k_max_dim));
  SNAP_RETURN_IF_ERROR(range(source, "max_position", max_position, 1, int64_t{1} << 30));
  SNAP_RETURN_IF_ERROR(range(source, "sliding_window", sliding_window, 0, int64_t{1} << 30));
  SNAP_RETURN_IF_ERROR(range(source, "sliding_window_pattern", sliding_window_pattern, 0, k_max_layers + 1));
  if (!(rope_local_theta >= 0.0f) || !std::isfinite(rope_local_theta))
    return invalid_argument(source + ": rope_local_theta must be positive (or 0: none)");
  if (!(embed_scale > 0.0f) || !std::isfinite(embed_scale) || !(attn_scale >= 0.0f) || !std::isfinite(attn_scale))
    return invalid_argument(source + ": embed_scale must be positive and attn_scale non-negative");
  if (num_heads % num_kv_heads != 0)
    return invalid_argument(source + ": num_heads " + std::to_string(num_heads) +
                            " is not a multiple of num_kv_heads " + std::to_string(num_kv_heads));
  if (head_dim % 2 != 0)
    return invalid_argument(source + ": head_dim " + std::to_string(head_dim) + " is odd (RoPE needs pairs)");
  if (rope.head_dim != head_dim)
    return invalid_argument(source + ": rope head_dim " + std::to_string(rope.head_dim) +
                            " differs from head_dim " + std::to_string(head_dim));
  if (!(rms_norm_eps > 0.0f) || !std::isfinite(rms_norm_eps))
    return invalid_argument(source + ": rms_norm_eps must be positive");
  if (!(rope.theta > 0.0f) || !std::isfinite(rope.theta))
    return invalid_argument(source + ": rope_theta must be positive");
  if (rope.scaling != kernels::RopeScaling::none && !(rope.factor > 0.0f && std::isfinite(rope.factor)))
    return invalid_argument(source + ": rope scaling factor must be positive");
  if (rope.scaling == kernels::RopeScaling::llama3 &&
      !(rope.low_freq_factor > 0.0f && rope.high_freq_factor > rope.low_freq_factor &&
        rope.original_max_position > 0))
    return invalid_argument(source + ": llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor "
                                     "and original_max_position_embeddings > 0");
  if (bos_token_id >= vocab_size)
    return invalid_argument(source + ": bos_token_id " + std::to_string(bos_token_id) + " >= vocab_size " +
                            std::to_string(vocab_size));
  for (int32_t id : eos_token_ids) {
    if (id < 0 || id >= vocab_size)
      return invalid_argument(source + ": eos_token_id " + std::to_string(id) + " is outside [0, vocab_size)");
  }
  return Status();
}

Result<ModelConfig> config_from_hf_json(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found(file + ": cannot open (no config.json?)");
  std::stringstream ss;
  ss << in.rdbuf();
  const json top = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (top.is_discarded()) return data_loss(file + ": not valid JSON");
  if (!top.is_object()) return data_loss(file + ": not a JSON object");
  ModelConfig c;
  SNAP_ASSIGN_OR_RETURN(c.arch, arch_from_hf(file, top));
  // Gemma 3: the text model's fields with Gemma3TextConfig's defaults filled in, from
  // text_config for the vision-language checkpoints (errors then name "FILE text_config").
  std::string path = file;
  json text;
  if (c.arch == Arch::gemma3) {
    SNAP_ASSIGN_OR_RETURN(text, gemma3_text_config(file, top));
    if (gemma3_is_vision_language(top)) path = file + " text_config";
  }
  const json& j = c.arch == Arch::gemma3 ? text : top;
  const JsonFields f(path, j);
  SNAP_ASSIGN_OR_RETURN(c.vocab_size, f.req_int("vocab_size"));
  SNAP_ASSIGN_OR_RETURN(c.hidden_size, f.req_int("hidden_size"));
  SNAP_ASSIGN_OR_RETURN(c.intermediate_size, f.req_int("intermediate_size"));
  SNAP_ASSIGN_OR_RETURN(int64_t layers, f.req_int("num_hidden_layers"));
  SNAP_ASSIGN_OR_RETURN(int64_t heads, f.req_int("num_attention_heads"));
  SNAP_ASSIGN_OR_RETURN(int64_t kv_heads, f.opt_int("num_key_value_heads", heads));
  SNAP_RETURN_IF_ERROR(range(path, "num_hidden_layers", layers, 1, k_max_layers));
  SNAP_RETURN_IF_ERROR(range(path, "num_attention_heads", heads, 1, k_max_heads));
  SNAP_RETURN_IF_ERROR(range(path, "num_key_value_heads", kv_heads, 1, k_max_heads));
  c.num_layers = static_cast<int>(layers);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv_heads);
  // Gemma 3's other defaults (head_dim, max_position_embeddings, tie_word_embeddings) are
  // filled in by gemma3_text_config; its RoPE base stays here (rope_parameters may omit it).
  const bool gemma = c.arch == Arch::gemma3;
  if (f.has("head_dim")) {
    SNAP_ASSIGN_OR_RETURN(int64_t hd, f.req_int("head_dim"));
    SNAP_RETURN_IF_ERROR(range(path, "head_dim", hd, 2, k_max_dim));
    c.head_dim = static_cast<int>(hd);
  } else {
    if (c.hidden_size % heads != 0)
      return invalid_argument(path + ": hidden_size " + std::to_string(c.hidden_size) +
                              " is not a multiple of num_attention_heads " + std::to_string(heads) +
                              " and no head_dim is given");
    c.head_dim = static_cast<int>(c.hidden_size / heads);
  }
  SNAP_ASSIGN_OR_RETURN(double eps, f.opt_float("rms_norm_eps", 1e-6));
  c.rms_norm_eps = static_cast<float>(eps);
  SNAP_RETURN_IF_ERROR(parse_rope(path, f, j, gemma ? 1e6 : 10000.0, &c.rope));
  c.rope.head_dim = c.head_dim;
  const int64_t default_max_pos = c.arch == Arch::llama ? 2048 : 32768;
  SNAP_ASSIGN_OR_RETURN(c.max_position, f.opt_int("max_position_embeddings", default_max_pos));

  if (c.arch == Arch::mistral) {
    SNAP_ASSIGN_OR_RETURN(int64_t sw, f.opt_int("sliding_window", 0));
    SNAP_RETURN_IF_ERROR(range(path, "sliding_window", sw, 0, int64_t{1} << 30));
    c.sliding_window = static_cast<int>(sw);
  } else if (c.arch == Arch::qwen2) {
    SNAP_ASSIGN_OR_RETURN(bool use_sw, f.opt_bool("use_sliding_window", false));
    if (use_sw) {
      SNAP_ASSIGN_OR_RETURN(int64_t sw, f.opt_int("sliding_window", 0));
      SNAP_RETURN_IF_ERROR(range(path, "sliding_window", sw, 0, int64_t{1} << 30));
      c.sliding_window = static_cast<int>(sw);
    }
  }
  SNAP_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.opt_bool("tie_word_embeddings", false));
  if (c.arch == Arch::qwen2) {
    c.attention_bias = true;
  } else if (c.arch == Arch::llama) {
    SNAP_ASSIGN_OR_RETURN(c.attention_bias, f.opt_bool("attention_bias", false));
  }
  if (f.has("bos_token_id")) {
    SNAP_ASSIGN_OR_RETURN(int64_t bos, f.req_int("bos_token_id"));
    SNAP_RETURN_IF_ERROR(range(path, "bos_token_id", bos, -1, k_max_vocab));
    c.bos_token_id = static_cast<int32_t>(bos);
  }
  if (j.contains("eos_token_id")) {
    SNAP_ASSIGN_OR_RETURN(c.eos_token_ids, token_ids(path, f, j["eos_token_id"], "eos_token_id"));
  }
  const std::filesystem::path dir = std::filesystem::path(file).parent_path();
  SNAP_RETURN_IF_ERROR(add_generation_eos(dir / "generation_config.json", &c.eos_token_ids));
  if (gemma) SNAP_RETURN_IF_ERROR(gemma3_config_from_hf(path, j, &c));
  c.name = dir.filename().string();
  if (c.name.empty() || c.name == ".") c.name = arch_name(c.arch);
  SNAP_RETURN_IF_ERROR(c.validate(path));
  return c;
}

Result<ModelConfig> config_from_gguf(const GgufFile& g) {
  const std::string& path = g.path();
  if (!g.find("general.architecture")) return not_found(path + ": missing metadata 'general.architecture'");
  SNAP_ASSIGN_OR_RETURN(std::string arch, g.get_string("general.architecture"));
  ModelConfig c;
  if (arch == "llama") {
    c.arch = Arch::llama;  // llama.cpp stores Mistral models as llama too
  } else if (arch == "qwen2") {
    c.arch = Arch::qwen2;
  } else if (arch == "gemma3") {
    c.arch = Arch::gemma3;
  } else {
    return unimplemented(path + ": unsupported architecture '" + arch +
                         "' (supported: llama, mistral, qwen2, gemma3)");
  }
  const std::string p = arch + ".";
  SNAP_ASSIGN_OR_RETURN(int64_t layers, gguf_req_int(g, p + "block_count"));
  SNAP_ASSIGN_OR_RETURN(c.hidden_size, gguf_req_int(g, p + "embedding_length"));
  SNAP_ASSIGN_OR_RETURN(c.intermediate_size, gguf_req_int(g, p + "feed_forward_length"));
  SNAP_ASSIGN_OR_RETURN(int64_t heads, gguf_req_int(g, p + "attention.head_count"));
  SNAP_ASSIGN_OR_RETURN(int64_t kv_heads, gguf_opt_int(g, p + "attention.head_count_kv", heads));
  SNAP_RETURN_IF_ERROR(range(path, "block_count", layers, 1, k_max_layers));
  SNAP_RETURN_IF_ERROR(range(path, "attention.head_count", heads, 1, k_max_heads));
  SNAP_RETURN_IF_ERROR(range(path, "attention.head_count_kv", kv_heads, 1, k_max_heads));
  SNAP_RETURN_IF_ERROR(range(path, "embedding_length", c.hidden_size, 1, k_max_dim));
  c.num_layers = static_cast<int>(layers);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv_heads);
  if (g.find(p + "attention.key_length")) {
    SNAP_ASSIGN_OR_RETURN(int64_t hd, g.get_int(p + "attention.key_length"));
    SNAP_RETURN_IF_ERROR(range(path, "attention.key_length", hd, 2, k_max_dim));
    c.head_dim = static_cast<int>(hd);
  } else {
    if (c.hidden_size % heads != 0)
      return invalid_argument(path + ": embedding_length is not a multiple of attention.head_count");
    c.head_dim = static_cast<int>(c.hidden_size / heads);
  }
  if (g.find(p + "rope.dimension_count")) {
    SNAP_ASSIGN_OR_RETURN(int64_t rd, g.get_int(p + "rope.dimension_count"));
    if (rd != c.head_dim)
      return unimplemented(path + ": rope.dimension_count " + std::to_string(rd) + " != head_dim " +
                           std::to_string(c.head_dim) + " (partial rotary embeddings are not supported)");
  }
  SNAP_ASSIGN_OR_RETURN(double eps, gguf_opt_float(g, p + "attention.layer_norm_rms_epsilon", 1e-6));
  c.rms_norm_eps = static_cast<float>(eps);
  SNAP_ASSIGN_OR_RETURN(double theta, gguf_opt_float(g, p + "rope.freq_base", 10000.0));
  c.rope.theta = static_cast<float>(theta);
  c.rope.head_dim = c.head_dim;
  if (g.find(p + "rope.scaling.type")) {
    SNAP_ASSIGN_OR_RETURN(std::string type, g.get_string(p + "rope.scaling.type"));
    if (type == "linear") {
      SNAP_ASSIGN_OR_RETURN(double factor, gguf_opt_float(g, p + "rope.scaling.factor", 1.0));
      c.rope.scaling = kernels::RopeScaling::linear;
      c.rope.factor = static_cast<float>(factor);
    } else if (type != "none") {
      return unimplemented(path + ": unsupported rope.scaling.type '" + type + "' (supported: none, linear)");
    }
  } else if (g.find(p + "rope.scale_linear")) {  // older files
    SNAP_ASSIGN_OR_RETURN(double factor, g.get_float(p + "rope.scale_linear"));
    if (factor != 1.0) {
      c.rope.scaling = kernels::RopeScaling::linear;
      c.rope.factor = static_cast<float>(factor);
    }
  }
  if (const GgufTensor* t = g.find_tensor("rope_freqs.weight")) {
    if (c.rope.scaling != kernels::RopeScaling::none)
      return unimplemented(path + ": both rope.scaling.type and rope_freqs.weight are set");
    SNAP_RETURN_IF_ERROR(rope_from_gguf_freqs(g, *t, &c.rope));
  }
  SNAP_ASSIGN_OR_RETURN(c.max_position, gguf_req_int(g, p + "context_length"));
  SNAP_ASSIGN_OR_RETURN(int64_t sw, gguf_opt_int(g, p + "attention.sliding_window", 0));
  SNAP_RETURN_IF_ERROR(range(path, "attention.sliding_window", sw, 0, int64_t{1} << 30));
  c.sliding_window = static_cast<int>(sw);

  if (g.find(p + "vocab_size")) {
    SNAP_ASSIGN_OR_RETURN(c.vocab_size, g.get_int(p + "vocab_size"));
  } else if (const GgufValue* toks = g.find("tokenizer.ggml.tokens");
             toks && toks->type == GgufType::array) {
    c.vocab_size = static_cast<int64_t>(toks->arr.size());
  } else if (const GgufTensor* emb = g.find_tensor("token_embd.weight"); emb && emb->dims.size() == 2) {
    c.vocab_size = emb->dims[1];
  } else {
    return not_found(path + ": cannot tell vocab size (no " + p + "vocab_size, tokenizer.ggml.tokens or token_embd.weight)");
  }
  c.tie_word_embeddings = g.find_tensor("output.weight") == nullptr;
  c.attention_bias = c.arch == Arch::qwen2 || g.find_tensor("blk.0.attn_q.bias") != nullptr;
  SNAP_ASSIGN_OR_RETURN(int64_t bos, gguf_opt_int(g, "tokenizer.ggml.bos_token_id", -1));
  SNAP_RETURN_IF_ERROR(range(path, "tokenizer.ggml.bos_token_id", bos, -1, k_max_vocab));
  c.bos_token_id = static_cast<int32_t>(bos);
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!g.find(key)) continue;
    SNAP_ASSIGN_OR_RETURN(int64_t id, g.get_int(key));
    SNAP_RETURN_IF_ERROR(range(path, key, id, 0, k_max_vocab));
    const int32_t id32 = static_cast<int32_t>(id);
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id32) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(id32);
  }
  if (g.find("general.name") && g.get_string("general.name").ok()) {
    c.name = g.get_string("general.name").value();
  } else {
    c.name = std::filesystem::path(path).stem().string();
  }
  if (c.arch == Arch::gemma3) SNAP_RETURN_IF_ERROR(gemma3_config_from_gguf(g, &c));
  SNAP_RETURN_IF_ERROR(c.validate(path));
  return c;
}

}  // namespace snap
