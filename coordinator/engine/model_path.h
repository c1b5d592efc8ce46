// Where the default model lives: $SNAP_MODEL, else $SNAP_CACHE (default ~/.cache/snapserve)
// /SmolLM2-135M-Instruct.Q4_1.gguf, which scripts/setup.sh downloads.
#pragma once

#include <string>

namespace snap {

std::string default_model_path();

}  // namespace snap
