// Llama-family forward pass: embed → L × (RMSNorm → QKV (+bias) → RoPE → append K/V to the
// paged cache → causal GQA attention over it → o_proj → residual → RMSNorm → SwiGLU MLP →
// residual) → final RMSNorm → LM head. Activations are f32, token-major [num_tokens, features].
// Gemma 3 adds, as config options that are off for the Llama family: the embedding scale,
// per-head q/k RMSNorm before RoPE, a per-layer window and RoPE base (local/global layers),
// RMSNorm on the attention and MLP outputs before the residual adds, and GeGLU.
#include "worker/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/attention_paged.h"
#include "kernels/cpu/geglu.h"
#include "kernels/kernels.h"
#include "kernels/weight_tiles.h"
#include "worker/model/dequant.h"

namespace snap {

LlamaForward::LlamaForward(const LoadedModel& model, comm::Communicator* comm) : model_(model), comm_(comm) {
  const ModelConfig& c = model.config;
  const TpShard& s = model.shard;
  CHECK(s.num_heads > 0 && s.num_kv_heads > 0) << "model without a shard plan (load it with load_model)";
  if (s.is_sharded()) {
    CHECK(comm != nullptr) << "a tensor-parallel shard needs a communicator";
    CHECK_EQ(comm->group_size(), s.tp_size);
    CHECK_EQ(comm->group_rank(), s.tp_rank);
  }
  inv_freq_ = kernels::rope_inv_freq(c.rope);
  if (c.rope_local_theta > 0.0f) {  // gemma3 local layers: their own base, no scaling
    kernels::RopeConfig local;
    local.theta = c.rope_local_theta;
    local.head_dim = c.head_dim;
    inv_freq_local_ = kernels::rope_inv_freq(local);
  }
  attn_params_.num_heads = s.num_heads;
  attn_params_.num_kv_heads = s.num_kv_heads;
  attn_params_.head_dim = c.head_dim;
  attn_params_.scale = c.attn_scale > 0.0f ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  attn_params_.sliding_window = c.sliding_window;  // per layer in run_layer (layer_window)
  // The LM head: lm_head already holds this rank's rows; a tied f32 embed is whole.
  const Matrix& out = model.weights.output();
  head_w_ = out.view();
  if (out.rows() != s.vocab_size) {
    CHECK_EQ(out.rows(), c.vocab_size);
    CHECK(out.layout() == kernels::WeightLayout::rows) << "a vocabulary slice of a tiles4 LM head";
    head_w_.data = static_cast<const uint8_t*>(head_w_.data) + s.vocab_begin * dtype_row_bytes(out.dtype(), out.cols());
    head_w_.rows = s.vocab_size;
  }
}

KvCacheShape LlamaForward::kv_shape() const {
  const ModelConfig& c = model_.config;
  return {c.num_layers, model_.shard.num_kv_heads, c.head_dim};
}

// With replicated KV heads the compressor sees the whole GQA group's queries, so every
// replica selects what a single process would (project_queries).
CompressorShape LlamaForward::compressor_shape() const {
  const ModelConfig& c = model_.config;
  CompressorShape shape{c.num_layers, model_.shard.q_load_heads, model_.shard.num_kv_heads, c.head_dim, {}};
  // gemma3: local layers keep their window, the policy compresses the global ones.
  if (c.sliding_window_pattern > 0) {
    for (int l = 0; l < c.num_layers; ++l) shape.layer_windows.push_back(c.layer_window(l));
  }
  return shape;
}

int64_t LlamaForward::scratch_bytes() const {
  int64_t floats = 0;
  for (const std::vector<float>* v : {&x_, &h_, &q_, &qg_, &k_, &v_, &attn_, &gate_, &up_, &head_mine_, &head_part_, &head_all_})
    floats += static_cast<int64_t>(v->capacity());
  return floats * 4 + static_cast<int64_t>(positions_.capacity()) * 4;
}

void LlamaForward::ensure_scratch(int64_t n) {
  if (n <= scratch_tokens_) return;
  const ModelConfig& c = model_.config;
  const TpShard& s = model_.shard;
  const int64_t q_dim = int64_t{s.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{s.num_kv_heads} * c.head_dim;
  x_.resize(n * c.hidden_size);
  h_.resize(n * c.hidden_size);
  q_.resize(n * q_dim);
  if (s.q_load_heads != s.num_heads) qg_.resize(n * s.q_load_heads * c.head_dim);
  k_.resize(n * kv_dim);
  v_.resize(n * kv_dim);
  attn_.resize(n * q_dim);
  gate_.resize(n * s.ff_size);
  up_.resize(n * s.ff_size);
  positions_.resize(n);
  scratch_tokens_ = n;
}

void LlamaForward::embed(const int32_t* tokens, int64_t n, float* x) const {
  const ModelConfig& c = model_.config;
  const Matrix& table = model_.weights.embed;
  const int64_t row_bytes = dtype_row_bytes(table.dtype(), c.hidden_size);
  std::vector<uint8_t> unpacked;  // a row of a table in the matvec's tiles (tied LM head)
  for (int64_t t = 0; t < n; ++t) {
    CHECK(tokens[t] >= 0 && tokens[t] < c.vocab_size) << "token id " << tokens[t] << " out of range";
    const auto* row = static_cast<const uint8_t*>(table.data()) + int64_t{tokens[t]} * row_bytes;
    if (table.layout() == kernels::WeightLayout::tiles4) {
      unpacked.resize(static_cast<size_t>(row_bytes));
      kernels::weight_tiles4_unpack_rows(table.view(), tokens[t], 1, unpacked.data());
      row = unpacked.data();
    }
    // A row in blocks is dequantized exactly as the loader would have (worker/model/dequant).
    float* out = x + t * c.hidden_size;
    if (table.dtype() == DType::f32) {
      std::memcpy(out, row, c.hidden_size * sizeof(float));
    } else {
      const Status st = dequantize(ggml_type_of(table.dtype()), row, out, c.hidden_size);
      CHECK(st.ok()) << st.to_string();
    }
    if (c.embed_scale != 1.0f) {
      for (int64_t i = 0; i < c.hidden_size; ++i) out[i] *= c.embed_scale;
    }
  }
}

void LlamaForward::rope_heads(int l, const Matrix& norm, float* x, const int32_t* positions, int64_t n,
                              int heads) const {
  const ModelConfig& c = model_.config;
  if (!norm.empty()) kernels::rms_norm_cpu(x, norm.f32(), x, n * heads, c.head_dim, c.rms_norm_eps);
  const bool local = !inv_freq_local_.empty() && c.layer_is_local(l);
  kernels::rope_cpu(x, positions, n, heads, c.head_dim, local ? inv_freq_local_.data() : inv_freq_.data());
}

const float* LlamaForward::project_queries(int l, const float* h, const int32_t* positions, int64_t n,
                                           bool observed) {
  const ModelConfig& c = model_.config;
  const TpShard& s = model_.shard;
  const LayerWeights& lw = model_.weights.layers[l];
  const float* bias = lw.q_bias.empty() ? nullptr : lw.q_bias.f32();
  if (s.q_load_heads == s.num_heads) {
    project(h, lw.q_proj.view(), bias, q_.data(), n);
    rope_heads(l, lw.q_norm, q_.data(), positions, n, s.num_heads);
    return q_.data();
  }
  // Replicated KV head: q_proj holds the group's heads; ours start at head `own` of it.
  const int64_t own = s.head_begin - s.q_load_begin;
  const int64_t q_dim = int64_t{s.num_heads} * c.head_dim;
  if (observed) {
    const int64_t qg_dim = int64_t{s.q_load_heads} * c.head_dim;
    project(h, lw.q_proj.view(), bias, qg_.data(), n);
    rope_heads(l, lw.q_norm, qg_.data(), positions, n, s.q_load_heads);
    for (int64_t t = 0; t < n; ++t) std::memcpy(&q_[t * q_dim], &qg_[t * qg_dim + own * c.head_dim], q_dim * sizeof(float));
    return qg_.data();
  }
  kernels::WeightView mine = lw.q_proj.view();
  CHECK(mine.layout == kernels::WeightLayout::rows || (own * c.head_dim % 4 == 0 && q_dim % 4 == 0))
      << "a row slice of a tiles4 q_proj must be whole tiles (head_dim " << c.head_dim << ")";
  mine.data = static_cast<const uint8_t*>(mine.data) + own * c.head_dim * dtype_row_bytes(mine.dtype, mine.cols);
  mine.rows = q_dim;
  project(h, mine, bias ? bias + own * c.head_dim : nullptr, q_.data(), n);
  rope_heads(l, lw.q_norm, q_.data(), positions, n, s.num_heads);
  return q_.data();
}

Status LlamaForward::run_layer(int l, float* x, const int32_t* positions, int64_t n,
                               const std::vector<Segment>& segments) {
  const ModelConfig& c = model_.config;
  const TpShard& sh = model_.shard;
  const LayerWeights& lw = model_.weights.layers[l];
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{sh.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{sh.num_kv_heads} * c.head_dim;
  auto bias = [](const Matrix& b) { return b.empty() ? nullptr : b.f32(); };
  bool observed = false;
  for (const Segment& s : segments) {
    observed = observed || (s.compressor && s.compressor->observes(l) && !s.compressor->layer_done(l));
  }
  // --- attention block: projections over every row of the step
  kernels::rms_norm_cpu(x, lw.attn_norm.f32(), h_.data(), n, hidden, c.rms_norm_eps);
  const float* q_obs = q_.data();
  if (sh.q_load_heads == sh.num_heads) {  // q, k, v in one region (a replicated KV head: below)
    const kernels::MatmulOut qkv[3] = {{lw.q_proj.view(), bias(lw.q_bias), q_.data()},
                                       {lw.k_proj.view(), bias(lw.k_bias), k_.data()},
                                       {lw.v_proj.view(), bias(lw.v_bias), v_.data()}};
    project_multi(h_.data(), qkv, 3, n);
    rope_heads(l, lw.q_norm, q_.data(), positions, n, sh.num_heads);
  } else {
    q_obs = project_queries(l, h_.data(), positions, n, observed);
    const kernels::MatmulOut kv[2] = {{lw.k_proj.view(), bias(lw.k_bias), k_.data()},
                                      {lw.v_proj.view(), bias(lw.v_bias), v_.data()}};
    project_multi(h_.data(), kv, 2, n);
  }
  const int64_t q_obs_dim = q_obs == q_.data() ? q_dim : int64_t{sh.q_load_heads} * c.head_dim;
  rope_heads(l, lw.k_norm, k_.data(), positions, n, sh.num_kv_heads);
  kernels::AttentionParams attn_params = attn_params_;
  attn_params.sliding_window = c.layer_window(l);
  // KV and attention: each sequence on its own cache.
  for (const Segment& s : segments) {
    const int32_t* pos = positions + s.offset;
    SNAP_RETURN_IF_ERROR(
        s.cache->append_layer(l, pos, k_.data() + s.offset * kv_dim, v_.data() + s.offset * kv_dim, s.num_tokens));
    if (s.compressor) {
      SNAP_RETURN_IF_ERROR(s.compressor->observe(l, q_obs + s.offset * q_obs_dim, pos, s.num_tokens, *s.cache));
    }
    kernels::attention_paged_cpu(q_.data() + s.offset * q_dim, pos, s.num_tokens, s.cache->layer_view(l),
                                 attn_params, attn_.data() + s.offset * q_dim);
  }
  SNAP_RETURN_IF_ERROR(row_parallel(attn_.data(), lw.o_proj, h_.data(), n));
  if (c.post_norms) kernels::rms_norm_cpu(h_.data(), lw.post_attn_norm.f32(), h_.data(), n, hidden, c.rms_norm_eps);
  for (int64_t i = 0; i < n * hidden; ++i) x[i] += h_[i];
  // --- MLP block
  kernels::rms_norm_cpu(x, lw.ffn_norm.f32(), h_.data(), n, hidden, c.rms_norm_eps);
  const kernels::MatmulOut gate_up[2] = {{lw.gate_proj.view(), nullptr, gate_.data()},
                                         {lw.up_proj.view(), nullptr, up_.data()}};
  project_multi(h_.data(), gate_up, 2, n);
  if (c.gelu_mlp) {
    kernels::geglu_cpu(gate_.data(), up_.data(), gate_.data(), n * sh.ff_size);
  } else {
    kernels::swiglu_cpu(gate_.data(), up_.data(), gate_.data(), n * sh.ff_size);
  }
  SNAP_RETURN_IF_ERROR(row_parallel(gate_.data(), lw.down_proj, h_.data(), n));
  if (c.post_norms) kernels::rms_norm_cpu(h_.data(), lw.post_ffn_norm.f32(), h_.data(), n, hidden, c.rms_norm_eps);
  for (int64_t i = 0; i < n * hidden; ++i) x[i] += h_[i];
  return {};
}

Status LlamaForward::head(const float* x, int64_t rows, float* logits, bool rowwise) {
  if (logits == nullptr) return {};
  const ModelConfig& c = model_.config;
  const TpShard& s = model_.shard;
  kernels::rms_norm_cpu(x, model_.weights.final_norm.f32(), h_.data(), rows, c.hidden_size, c.rms_norm_eps);
  auto matmul = [&](float* y) {
    if (rowwise) {
      kernels::matmul_rowwise_cpu(h_.data(), head_w_, nullptr, y, rows);
    } else {
      kernels::matmul_cpu(h_.data(), head_w_, nullptr, y, rows);
    }
  };
  if (!s.is_sharded()) {
    matmul(logits);
    return {};
  }
  // Vocab-parallel: our rows into [rows, vocab_chunk] (the last rank's short slice padded),
  // gathered on every rank; rank 0 lays the slices out as [rows, vocab_size].
  const int64_t chunk = s.vocab_chunk;
  head_part_.resize(static_cast<size_t>(rows * chunk));
  head_all_.resize(static_cast<size_t>(s.tp_size * rows * chunk));
  if (s.vocab_size == chunk) {
    matmul(head_part_.data());
  } else {
    head_mine_.resize(static_cast<size_t>(rows * s.vocab_size));
    if (s.vocab_size > 0) matmul(head_mine_.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(&head_mine_[r * s.vocab_size], s.vocab_size, &head_part_[r * chunk]);
      std::fill(&head_part_[r * chunk + s.vocab_size], &head_part_[(r + 1) * chunk], 0.0f);
    }
  }
  SNAP_RETURN_IF_ERROR(comm_->all_gather(head_part_.data(), head_all_.data(), rows * chunk, DType::f32));
  if (!s.is_logits_rank) return {};
  for (int p = 0; p < s.tp_size; ++p) {
    const int64_t begin = std::min<int64_t>(c.vocab_size, p * chunk);
    const int64_t len = std::min<int64_t>(c.vocab_size, begin + chunk) - begin;
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(&head_all_[(p * rows + r) * chunk], len, logits + r * c.vocab_size + begin);
    }
  }
  return {};
}

void LlamaForward::project(const float* x, const kernels::WeightView& w, const float* bias, float* y, int64_t n) {
  const int64_t p = std::min(prefill_rows_, n);
  if (p > 0) kernels::matmul_cpu(x, w, bias, y, p);
  if (n > p) kernels::matmul_rowwise_cpu(x + p * w.cols, w, bias, y + p * w.rows, n - p);
}

void LlamaForward::project_multi(const float* x, const kernels::MatmulOut* outs, int count, int64_t n) {
  const int64_t p = std::min(prefill_rows_, n);
  if (p > 0) kernels::matmul_multi_cpu(x, outs, count, p, false);
  if (n == p) return;
  kernels::MatmulOut rest[kernels::k_matmul_multi_max];
  for (int i = 0; i < count; ++i) rest[i] = {outs[i].w, outs[i].bias, outs[i].y + p * outs[i].w.rows};
  kernels::matmul_multi_cpu(x + p * outs[0].w.cols, rest, count, n - p, true);
}

// The one all-reduce of the model (after o_proj and after down_proj). Without a group
// (one process) the partial product is already the whole one.
Status LlamaForward::row_parallel(const float* x, const Matrix& w, float* y, int64_t n) {
  project(x, w.view(), nullptr, y, n);
  if (comm_ == nullptr || comm_->group_size() == 1) return {};
  return comm_->all_reduce_sum(y, n * model_.config.hidden_size, DType::f32);
}

Status LlamaForward::forward(const int32_t* tokens, int64_t n, PagedKvCache& cache, float* logits, bool all_logits,
                             KvCompressor* compressor) {
  CHECK_GT(n, 0);
  ensure_scratch(n);
  const int32_t start = cache.next_position();
  for (int64_t t = 0; t < n; ++t) positions_[t] = static_cast<int32_t>(start + t);
  embed(tokens, n, x_.data());
  prefill_rows_ = n;  // one sequence: a single matmul over its rows (matvec below 8 rows)
  const std::vector<Segment> segments = {{&cache, compressor, 0, n}};
  for (int l = 0; l < model_.config.num_layers; ++l) {
    SNAP_RETURN_IF_ERROR(run_layer(l, x_.data(), positions_.data(), n, segments));
  }
  // Only the rows whose logits are wanted go through the final norm and LM head.
  const int64_t first = all_logits ? 0 : n - 1;
  return head(&x_[first * model_.config.hidden_size], n - first, logits, !all_logits);
}

Status LlamaForward::forward_batch(const std::vector<BatchItem>& items) {
  const ModelConfig& c = model_.config;
  int64_t total = 0;
  for (const BatchItem& it : items) {
    CHECK_GT(it.num_tokens, 0);
    total += it.num_tokens;
  }
  if (total == 0) return {};
  ensure_scratch(std::max<int64_t>(total, static_cast<int64_t>(items.size())));
  std::vector<Segment> segments;
  segments.reserve(items.size());
  int64_t offset = 0;
  prefill_rows_ = 0;
  bool seen_decode = false;
  for (const BatchItem& it : items) {
    CHECK(!(it.prefill && seen_decode)) << "prefill items must come first in a batch";
    seen_decode = seen_decode || !it.prefill;
    if (it.prefill) prefill_rows_ += it.num_tokens;
    const int32_t start = it.cache->next_position();
    for (int64_t t = 0; t < it.num_tokens; ++t) positions_[offset + t] = static_cast<int32_t>(start + t);
    embed(it.tokens, it.num_tokens, &x_[offset * c.hidden_size]);
    segments.push_back({it.cache, it.compressor, offset, it.num_tokens});
    offset += it.num_tokens;
  }
  for (int l = 0; l < c.num_layers; ++l) SNAP_RETURN_IF_ERROR(run_layer(l, x_.data(), positions_.data(), total, segments));
  // Last row of every item that wants logits, through the head together.
  std::vector<float> rows;
  std::vector<float*> outs;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].logits) continue;
    const float* last = &x_[(segments[i].offset + segments[i].num_tokens - 1) * c.hidden_size];
    rows.insert(rows.end(), last, last + c.hidden_size);
    outs.push_back(items[i].logits);
  }
  if (outs.empty()) return {};
  std::vector<float> logits(is_logits_rank() ? outs.size() * c.vocab_size : 1);
  SNAP_RETURN_IF_ERROR(head(rows.data(), static_cast<int64_t>(outs.size()), logits.data(), true));
  if (!is_logits_rank()) return {};
  for (size_t i = 0; i < outs.size(); ++i) std::copy_n(&logits[i * c.vocab_size], c.vocab_size, outs[i]);
  return {};
}

Status LlamaForward::prefill_layerwise(const int32_t* tokens, int64_t n, PagedKvCache& cache, float* last_logits,
                                       int64_t chunk, KvCompressor& compressor) {
  CHECK_GT(chunk, 0);
  CHECK_EQ(cache.next_position(), 0);
  CHECK_EQ(compressor.compress_at(), n);
  const ModelConfig& c = model_.config;
  std::vector<float> x(static_cast<size_t>(n * c.hidden_size));  // all tokens' hidden states
  std::vector<int32_t> positions(n);
  for (int64_t t = 0; t < n; ++t) positions[t] = static_cast<int32_t>(t);
  embed(tokens, n, x.data());
  ensure_scratch(std::min(chunk, n));
  peak_scratch_bytes_ = std::max(peak_scratch_bytes_, scratch_bytes() + static_cast<int64_t>(x.capacity()) * 4 +
                                                          static_cast<int64_t>(positions.capacity()) * 4);
  for (int l = 0; l < c.num_layers; ++l) {
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      const std::vector<Segment> segments = {{&cache, &compressor, 0, len}};
      prefill_rows_ = len;
      SNAP_RETURN_IF_ERROR(run_layer(l, &x[start * c.hidden_size], &positions[start], len, segments));
    }
    SNAP_RETURN_IF_ERROR(compressor.compress_layer(l, cache));
  }
  return head(&x[(n - 1) * c.hidden_size], 1, last_logits, true);
}

}  // namespace snap
