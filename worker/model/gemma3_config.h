// Gemma 3 hyper-parameters that its GGUF files do not state, taken from transformers'
// Gemma3TextConfig (the published configuration) and checked against its modeling code
// (see gemma3_config.cpp for what was checked). Called by config_from_gguf for
// general.architecture = gemma3 after the Llama-family fields are read.
#pragma once

#include "common/status.h"
#include "worker/model/config.h"

namespace snap {

class GgufFile;

// Sets c's Gemma 3 fields (layer pattern, local rope base, QK-norm, post-norms, GeGLU,
// embedding and attention scales, <end_of_turn> as a stop id) from g's metadata and the
// published defaults; unimplemented for variants we do not run (logit soft-capping).
Status gemma3_config_from_gguf(const GgufFile& g, ModelConfig* c);

}  // namespace snap
