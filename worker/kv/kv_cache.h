// The shape every KV cache of a model shares: layers × KV heads × head_dim. The storage is
// the paged per-head cache (worker/kv/paged_kv_cache.h).
#pragma once

namespace snap {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

}  // namespace snap
