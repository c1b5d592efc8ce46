// Full (uncompressed) KV cache for one sequence: per layer, per KV head, a contiguous
// [capacity, head_dim] block of keys (after RoPE) and values. Capacity is sized from the
// actual request (prompt + max new tokens), not the model's maximum context, and grows on
// demand. The paged per-head cache of the SnapKV work replaces this layout.
#pragma once

#include <cstdint>
#include <vector>

namespace snap {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

class KvCache {
 public:
  explicit KvCache(KvCacheShape shape) : shape_(shape), k_(shape.num_layers), v_(shape.num_layers) {}

  const KvCacheShape& shape() const { return shape_; }
  int64_t length() const { return length_; }      // tokens stored (= next position)
  int64_t capacity() const { return capacity_; }
  // Grows every layer to hold `capacity` tokens, keeping the stored ones.
  void reserve(int64_t capacity);
  void clear() { length_ = 0; }
  void advance(int64_t num_tokens);

  // Layer l, KV head g, token j at k(l) + g * head_stride() + j * head_dim.
  float* k(int layer) { return k_[layer].data(); }
  float* v(int layer) { return v_[layer].data(); }
  int64_t head_stride() const { return capacity_ * shape_.head_dim; }

  // Bytes holding the stored tokens (what a tight allocation needs) and bytes allocated.
  int64_t used_bytes() const;
  int64_t allocated_bytes() const;

 private:
  KvCacheShape shape_;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::vector<std::vector<float>> k_, v_;  // per layer [num_kv_heads, capacity, head_dim]
};

}  // namespace snap
