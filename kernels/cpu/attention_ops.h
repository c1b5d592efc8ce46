// Internal to kernels/cpu: the block primitives both attention kernels (contiguous and
// paged) run their online softmax with, one set per SIMD level, and the per-row state.
//   scores: s[j] = dot(q, k_j), j < n; exp_sum: s[j] = e^(s[j]−m), returns Σ;
//   accumulate: acc += Σ_j p[j]·v_j; scale: acc *= f.
#pragma once

#include <cstdint>
#include <limits>

namespace snap::kernels {

struct BlockOps {
  void (*scores)(const float* q, const float* k, int64_t n, int hd, float* s);
  float (*exp_sum)(float* s, int64_t n, float m);
  void (*accumulate)(float* acc, const float* p, const float* v, int64_t n, int hd);
  void (*scale)(float* acc, int hd, float f);
};

// The fastest set for this CPU (kernels/cpu/simd.h) that supports head_dim: AVX2 needs
// head_dim % 8 == 0, AVX-512 head_dim % 16 == 0 (every Llama-family head_dim is 64 or 128).
BlockOps attention_block_ops(int head_dim);

// Running softmax state of one (query, head) row: acc is unnormalized, output = acc / l.
struct RowState {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
};

}  // namespace snap::kernels
