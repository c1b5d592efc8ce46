// default_model_path(): environment first, then the set-up script's cache.
#include "coordinator/engine/model_path.h"

#include <cstdlib>

namespace snap {

std::string default_model_path() {
  if (const char* m = std::getenv("SNAP_MODEL"); m && *m) return m;
  std::string cache;
  if (const char* c = std::getenv("SNAP_CACHE"); c && *c) {
    cache = c;
  } else {
    const char* home = std::getenv("HOME");
    cache = std::string(home ? home : ".") + "/.cache/snapserve";
  }
  return cache + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace snap
