// Gemma 3 hyper-parameters that its GGUF files do not state, taken from transformers'
// Gemma3TextConfig (the published configuration) and checked against its modeling code
// (see gemma3_config.cpp for what was checked). Called by config_from_gguf for
// general.architecture = gemma3 and by config_from_hf_json for Gemma3ForCausalLM, after the
// Llama-family fields are read.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/model/config.h"

namespace snap {

class GgufFile;

// Sets c's Gemma 3 fields (layer pattern, local rope base, QK-norm, post-norms, GeGLU,
// embedding and attention scales, <end_of_turn> as a stop id) from g's metadata and the
// published defaults; unimplemented for variants we do not run (logit soft-capping).
Status gemma3_config_from_gguf(const GgufFile& g, ModelConfig* c);

// Whether a config.json's top level is the vision-language Gemma3ForConditionalGeneration
// (model_type gemma3), whose text model snapserve serves (images are not supported).
bool gemma3_is_vision_language(const nlohmann::json& top);

// The text model's config.json object: `top` itself (Gemma3ForCausalLM, model_type
// gemma3_text) or its text_config, with the outer eos/bos/tie fields, and every absent field
// that config_from_hf_json requires set to Gemma3TextConfig's default (the 4B-27B
// checkpoints state only the fields that differ).
Result<nlohmann::json> gemma3_text_config(const std::string& path, const nlohmann::json& top);

// The Gemma fields from that object (model_type gemma3_text) at `path`: the sliding window, its
// layer pattern (layer_types or sliding_window_pattern), rope_local_base_freq and
// query_pre_attn_scalar, with Gemma3TextConfig's defaults; unimplemented for soft-capping,
// another activation, or bidirectional attention. Stop ids come from config.json and
// generation_config.json (config_from_hf_json).
Status gemma3_config_from_hf(const std::string& path, const nlohmann::json& j, ModelConfig* c);

}  // namespace snap
