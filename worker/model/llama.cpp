// Llama-family forward pass: embed → L × (RMSNorm → QKV (+bias) → RoPE → causal GQA
// attention over the KV cache → o_proj → residual → RMSNorm → SwiGLU MLP → residual)
// → final RMSNorm → LM head. Activations are f32, token-major [num_tokens, features].
#include "worker/model/llama.h"

#include <cmath>
#include <cstring>

#include "kernels/kernels.h"

namespace snap {

LlamaForward::LlamaForward(const LoadedModel& model) : model_(model) {
  inv_freq_ = kernels::rope_inv_freq(model.config.rope);
}

KvCacheShape LlamaForward::kv_shape() const {
  const ModelConfig& c = model_.config;
  return {c.num_layers, c.num_kv_heads, c.head_dim};
}

void LlamaForward::ensure_scratch(int64_t n) {
  if (n <= scratch_tokens_) return;
  const ModelConfig& c = model_.config;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  x_.resize(n * c.hidden_size);
  h_.resize(n * c.hidden_size);
  q_.resize(n * q_dim);
  k_.resize(n * kv_dim);
  v_.resize(n * kv_dim);
  attn_.resize(n * q_dim);
  gate_.resize(n * c.intermediate_size);
  up_.resize(n * c.intermediate_size);
  positions_.resize(n);
  scratch_tokens_ = n;
}

void LlamaForward::forward(const int32_t* tokens, int64_t n, KvCache& cache, float* logits, bool all_logits) {
  const ModelConfig& c = model_.config;
  const ModelWeights& w = model_.weights;
  CHECK_GT(n, 0);
  CHECK_LE(cache.length() + n, cache.capacity()) << "KV cache not reserved";
  ensure_scratch(n);

  const int64_t hidden = c.hidden_size;
  const int64_t hd = c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * hd;
  const int64_t start = cache.length();
  for (int64_t t = 0; t < n; ++t) {
    CHECK(tokens[t] >= 0 && tokens[t] < c.vocab_size) << "token id " << tokens[t] << " out of range";
    positions_[t] = static_cast<int32_t>(start + t);
    std::memcpy(&x_[t * hidden], w.embed.f32() + int64_t{tokens[t]} * hidden, hidden * sizeof(float));
  }

  kernels::AttentionParams ap;
  ap.num_heads = c.num_heads;
  ap.num_kv_heads = c.num_kv_heads;
  ap.head_dim = c.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ap.sliding_window = c.sliding_window;

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    // --- attention block
    kernels::rms_norm_cpu(x_.data(), lw.attn_norm.f32(), h_.data(), n, hidden, c.rms_norm_eps);
    auto bias = [](const Matrix& b) { return b.empty() ? nullptr : b.f32(); };
    kernels::matmul_cpu(h_.data(), lw.q_proj.view(), bias(lw.q_bias), q_.data(), n);
    kernels::matmul_cpu(h_.data(), lw.k_proj.view(), bias(lw.k_bias), k_.data(), n);
    kernels::matmul_cpu(h_.data(), lw.v_proj.view(), bias(lw.v_bias), v_.data(), n);
    kernels::rope_cpu(q_.data(), positions_.data(), n, c.num_heads, c.head_dim, inv_freq_.data());
    kernels::rope_cpu(k_.data(), positions_.data(), n, c.num_kv_heads, c.head_dim, inv_freq_.data());
    // Append K/V: token-major [n, kv_heads, hd] → cache [kv_heads, capacity, hd].
    float* kc = cache.k(l);
    float* vc = cache.v(l);
    const int64_t stride = cache.head_stride();
    for (int64_t t = 0; t < n; ++t) {
      for (int g = 0; g < c.num_kv_heads; ++g) {
        std::memcpy(kc + g * stride + (start + t) * hd, &k_[t * kv_dim + g * hd], hd * sizeof(float));
        std::memcpy(vc + g * stride + (start + t) * hd, &v_[t * kv_dim + g * hd], hd * sizeof(float));
      }
    }
    kernels::attention_cpu(q_.data(), positions_.data(), n, kc, vc, stride, start + n, ap, attn_.data());
    kernels::matmul_cpu(attn_.data(), lw.o_proj.view(), nullptr, h_.data(), n);
    for (int64_t i = 0; i < n * hidden; ++i) x_[i] += h_[i];
    // --- MLP block
    kernels::rms_norm_cpu(x_.data(), lw.ffn_norm.f32(), h_.data(), n, hidden, c.rms_norm_eps);
    kernels::matmul_cpu(h_.data(), lw.gate_proj.view(), nullptr, gate_.data(), n);
    kernels::matmul_cpu(h_.data(), lw.up_proj.view(), nullptr, up_.data(), n);
    kernels::swiglu_cpu(gate_.data(), up_.data(), gate_.data(), n * c.intermediate_size);
    kernels::matmul_cpu(gate_.data(), lw.down_proj.view(), nullptr, h_.data(), n);
    for (int64_t i = 0; i < n * hidden; ++i) x_[i] += h_[i];
  }
  cache.advance(n);

  // Only the rows whose logits are wanted go through the final norm and LM head.
  const int64_t first = all_logits ? 0 : n - 1;
  const int64_t rows = n - first;
  kernels::rms_norm_cpu(&x_[first * hidden], w.final_norm.f32(), h_.data(), rows, hidden, c.rms_norm_eps);
  kernels::matmul_cpu(h_.data(), w.output().view(), nullptr, logits, rows);
}

}  // namespace snap
