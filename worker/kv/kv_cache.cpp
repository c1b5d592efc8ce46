// Full KV cache storage: growth keeps each head's stored tokens in place.
#include "worker/kv/kv_cache.h"

#include <algorithm>

#include "common/check.h"

namespace snap {

void KvCache::reserve(int64_t capacity) {
  if (capacity <= capacity_) return;
  const int64_t hd = shape_.head_dim;
  for (int l = 0; l < shape_.num_layers; ++l) {
    for (auto* store : {&k_[l], &v_[l]}) {
      std::vector<float> grown(static_cast<size_t>(shape_.num_kv_heads * capacity * hd));
      for (int g = 0; g < shape_.num_kv_heads; ++g) {
        std::copy_n(store->data() + g * capacity_ * hd, length_ * hd, grown.data() + g * capacity * hd);
      }
      store->swap(grown);
    }
  }
  capacity_ = capacity;
}

void KvCache::advance(int64_t num_tokens) {
  CHECK_LE(length_ + num_tokens, capacity_);
  length_ += num_tokens;
}

int64_t KvCache::used_bytes() const {
  return 2LL * shape_.num_layers * shape_.num_kv_heads * length_ * shape_.head_dim * 4;
}

int64_t KvCache::allocated_bytes() const {
  return 2LL * shape_.num_layers * shape_.num_kv_heads * capacity_ * shape_.head_dim * 4;
}

}  // namespace snap
