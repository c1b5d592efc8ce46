// Backend-neutral CPU op signatures. Each op has a plain reference (`<op>_ref`,
// f32/f64 accumulation, obviously correct) and a fast path (`<op>_cpu`, SIMD chosen
// at run time + OpenMP) with the same arguments; tests compare the two. kernels/
// knows nothing about models: shapes and pointers only.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace snap::kernels {

// --- matmul -----------------------------------------------------------------
// A weight matrix as stored by HF/GGUF: row-major [rows = out_features, cols = in_features].
// Block formats may instead be laid out in the decode matvec's 4-row tiles
// (WeightLayout::tiles4, kernels/weight_tiles.h): the same bytes per row, rearranged.
enum class WeightLayout : uint8_t { rows, tiles4 };
struct WeightView {
  DType dtype = DType::f32;
  const void* data = nullptr;  // [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
  WeightLayout layout = WeightLayout::rows;
};

// y[num_tokens, w.rows] = x[num_tokens, w.cols] · wᵀ (+ bias[w.rows] if non-null).
// Accumulates in f32 (ref: f64). x and y are dense, row-major.
void matmul_ref(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
void matmul_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);
// Like matmul_cpu, but each row's result is bitwise independent of num_tokens (always the
// SIMD matvec, whose per-token accumulation order does not depend on its neighbours).
// Continuous batching runs decode rows through it so that a sequence's tokens do not depend
// on what else shares its step.
void matmul_rowwise_cpu(const float* x, const WeightView& w, const float* bias, float* y, int64_t num_tokens);

// --- rms_norm ---------------------------------------------------------------
// y[t, :] = x[t, :] / sqrt(mean(x[t, :]²) + eps) * weight[:]. y may alias x.
void rms_norm_ref(const float* x, const float* weight, float* y, int64_t num_tokens, int64_t hidden_size, float eps);
void rms_norm_cpu(const float* x, const float* weight, float* y, int64_t num_tokens, int64_t hidden_size, float eps);

// --- rope -------------------------------------------------------------------
enum class RopeScaling : uint8_t { none, linear, llama3 };
struct RopeConfig {
  float theta = 10000.0f;
  int head_dim = 64;  // rotary dimension (= head_dim for every supported model)
  RopeScaling scaling = RopeScaling::none;
  float factor = 1.0f;               // linear and llama3
  float low_freq_factor = 1.0f;      // llama3
  float high_freq_factor = 4.0f;     // llama3
  int original_max_position = 8192;  // llama3
};
// inv_freq[i] = theta^(-2i/head_dim), i < head_dim/2, then scaled per config (HF semantics).
std::vector<float> rope_inv_freq(const RopeConfig& cfg);
// In-place rotation of x[num_tokens, num_heads, head_dim] in the HF "rotate_half"
// (NeoX) layout: pairs (i, i + head_dim/2) rotated by positions[t] * inv_freq[i].
void rope_ref(float* x, const int32_t* positions, int64_t num_tokens, int num_heads, int head_dim, const float* inv_freq);
void rope_cpu(float* x, const int32_t* positions, int64_t num_tokens, int num_heads, int head_dim, const float* inv_freq);

// --- swiglu -----------------------------------------------------------------
// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g). out may alias gate.
void swiglu_ref(const float* gate, const float* up, float* out, int64_t n);
void swiglu_cpu(const float* gate, const float* up, float* out, int64_t n);

// --- attention --------------------------------------------------------------
struct AttentionParams {
  int num_heads = 0;
  int num_kv_heads = 0;  // query head h reads KV head h / (num_heads / num_kv_heads)
  int head_dim = 0;
  float scale = 0.0f;      // usually 1/sqrt(head_dim)
  int sliding_window = 0;  // 0: none; else key j visible iff q_pos - j < sliding_window
};
// Causal GQA attention over a contiguous KV cache, never materializing N×N.
//   q:   [num_tokens, num_heads, head_dim]
//   k,v: KV head g, key j at k + g*kv_head_stride + j*head_dim, j < kv_len (key j has position j)
//   q_positions[num_tokens]: query positions; key j is visible iff j <= q_pos (and the window)
//   out: [num_tokens, num_heads, head_dim]
void attention_ref(const float* q, const int32_t* q_positions, int64_t num_tokens, const float* k, const float* v,
                   int64_t kv_head_stride, int64_t kv_len, const AttentionParams& p, float* out);
void attention_cpu(const float* q, const int32_t* q_positions, int64_t num_tokens, const float* k, const float* v,
                   int64_t kv_head_stride, int64_t kv_len, const AttentionParams& p, float* out);

// --- sampling ---------------------------------------------------------------
struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id wins ties)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off; keep tokens with p >= min_p * p_max
  uint64_t seed = 0;
};
// Deterministic generator (splitmix64 seeding, xoshiro256**), same stream on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next_u64();
  float next_unit();  // uniform in [0, 1)

 private:
  uint64_t s_[4];
};
// Filters applied in order: temperature, top_k, top_p, min_p; then one draw.
int32_t sample_ref(const float* logits, int64_t vocab_size, const SamplingParams& p, Rng& rng);
int32_t sample_cpu(const float* logits, int64_t vocab_size, const SamplingParams& p, Rng& rng);

// --- runtime facts ------------------------------------------------------------
// "avx512", "avx2" or "scalar": the SIMD level the fast paths dispatched to.
const char* simd_level_name();

}  // namespace snap::kernels
