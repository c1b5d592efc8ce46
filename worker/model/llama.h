// The Llama-family forward pass (llama, mistral, qwen2; gemma3's extra pieces as config
// options, see llama.cpp) on CPU over a paged per-head KV
// cache. Callers run a prompt as chunks through forward()/forward_batch() (bounded scratch
// memory) — or, layer-wise, the whole prompt through one layer at a time so each layer can
// be compressed before the next one fills — and decode one token at a time. K/V are cached after RoPE; every
// new token goes to position cache.next_position().
//
// Tensor parallelism: when the model is one rank's shard (LoadedModel::shard), this rank
// attends with its own query heads over its own KV heads, runs its slice of the MLP, and
// the partial outputs of o_proj and down_proj are summed over the ranks in
// row_parallel(), the model's one all-reduce. KV, attention scores and KV
// selections stay on their rank. Each rank multiplies its vocabulary rows of the LM head
// and the logits are gathered to tp rank 0 (head()). Every rank must be asked for the same
// logits: on ranks other than 0 a non-null logits pointer only means "wanted" and is
// never written.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "common/status.h"
#include "kernels/matmul_multi.h"
#include "worker/kv/compressor.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/model/weights.h"

namespace snap {

class LlamaForward {
 public:
  // The model (and comm) must outlive this object. comm: the tensor-parallel group of a
  // sharded model (its group rank and size must match model.shard); may be null when the
  // model is not sharded.
  explicit LlamaForward(const LoadedModel& model, comm::Communicator* comm = nullptr);

  const ModelConfig& config() const { return model_.config; }
  const TpShard& shard() const { return model_.shard; }
  // Whether this rank receives the logits (tp rank 0).
  bool is_logits_rank() const { return model_.shard.is_logits_rank; }
  KvCacheShape kv_shape() const;
  CompressorShape compressor_shape() const;

  // Runs tokens[0..num_tokens) at positions cache.next_position().. and appends their K/V.
  // logits: [num_tokens, vocab_size] if all_logits, else [vocab_size] for the last token.
  // When compressor is set, every layer's queries are shown to it (prefill).
  // resource_exhausted when the block pool cannot hold the new tokens.
  Status forward(const int32_t* tokens, int64_t num_tokens, PagedKvCache& cache, float* logits, bool all_logits,
                 KvCompressor* compressor = nullptr);

  // One sequence's share of a batched step: its tokens continue at cache->next_position().
  struct BatchItem {
    PagedKvCache* cache = nullptr;
    const int32_t* tokens = nullptr;
    int64_t num_tokens = 0;
    KvCompressor* compressor = nullptr;  // shown this item's queries (prefill), or null
    float* logits = nullptr;             // [vocab_size] of the item's last token, or null
    bool prefill = false;                // a prompt chunk (prefill items come first)
  };
  // Several sequences in one step (continuous batching): the projections and MLP run once
  // over all their tokens; RoPE, the KV append and attention run per sequence on its own
  // cache. Batch invariance: prompt-chunk rows go through the same matmul as when alone,
  // decode rows through the row-invariant matvec, so no sequence's logits depend on what
  // else shares the step. On an error (pool exhausted) the items' caches may be partly appended: callers
  // drop those sequences.
  Status forward_batch(const std::vector<BatchItem>& items);

  // Layer-wise prefill: the whole prompt through layer 0 (in chunks), compress layer 0,
  // then layer 1, ... Peak KV memory is one layer's full KV plus the compressed rest.
  // Hidden states of all tokens are kept between layers ([num_tokens, hidden_size] f32).
  // The cache must be empty and the compressor must compress at num_tokens.
  Status prefill_layerwise(const int32_t* tokens, int64_t num_tokens, PagedKvCache& cache, float* last_logits,
                           int64_t chunk, KvCompressor& compressor);

  // Bytes of activation scratch held now (sized by the largest chunk or batch seen; the LM
  // head's buffers included), and the most held at once, layer-wise prefill's hidden
  // states of the whole prompt included.
  int64_t scratch_bytes() const;
  int64_t peak_scratch_bytes() const { return std::max(peak_scratch_bytes_, scratch_bytes()); }

 private:
  void ensure_scratch(int64_t num_tokens);
  void embed(const int32_t* tokens, int64_t n, float* x) const;
  // Rows [offset, offset + num_tokens) of a step belong to one sequence's cache.
  struct Segment {
    PagedKvCache* cache;
    KvCompressor* compressor;
    int64_t offset;
    int64_t num_tokens;
  };
  // One decoder layer in place on x [n, hidden] at positions[n], rows split into segments.
  Status run_layer(int layer, float* x, const int32_t* positions, int64_t n, const std::vector<Segment>& segments);
  // Final norm + this rank's LM head rows on x [rows, hidden] (row-invariant when
  // rowwise), then the all_gather that assembles logits [rows, vocab_size] on rank 0.
  Status head(const float* x, int64_t rows, float* logits, bool rowwise);
  // y = x·wᵀ (+bias) for n rows: rows [0, prefill_rows_) in one matmul (sgemm for a prompt
  // chunk), the rest row by row invariant (decode rows of a batch).
  void project(const float* x, const kernels::WeightView& w, const float* bias, float* y, int64_t n);
  // As project() for matrices that read the same x (q/k/v, gate/up): one OpenMP region for all
  // (kernels/matmul_multi.h), each output bitwise what project() gives it alone.
  void project_multi(const float* x, const kernels::MatmulOut* outs, int count, int64_t n);
  // A row-parallel projection (o_proj, down_proj): this rank's partial product over its
  // slice of the input features, then the all-reduce that sums the slices over the group
  // in rank order. y [n, hidden_size].
  Status row_parallel(const float* x, const Matrix& w, float* y, int64_t n);
  // The query projection + RoPE for this rank's heads into q_ [n, num_heads*head_dim].
  // With replicated KV heads and a compressor observing this layer, the whole GQA group's
  // queries go to qg_ [n, group*head_dim] (the compressor's view) and q_ takes our share.
  // Returns the queries to show compressors.
  const float* project_queries(int layer, const float* h, const int32_t* positions, int64_t n, bool observed);
  // In place on x [n, heads, head_dim]: the per-head RMSNorm `norm` (gemma3's q/k norm;
  // none when empty), then RoPE with layer l's base (local layers' own base when set).
  void rope_heads(int layer, const Matrix& norm, float* x, const int32_t* positions, int64_t n, int heads) const;

  const LoadedModel& model_;
  comm::Communicator* comm_ = nullptr;  // null or a group of one: no all-reduce
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<float> inv_freq_local_;  // [head_dim / 2] local layers' (gemma3), or empty
  kernels::AttentionParams attn_params_;
  kernels::WeightView head_w_;  // this rank's LM head rows [shard.vocab_size, hidden_size]
  // [rows, vocab_size of this shard], [rows, vocab_chunk], [tp, rows, vocab_chunk]
  std::vector<float> head_mine_, head_part_, head_all_;
  // Scratch, sized for the largest chunk seen: [num_tokens, ...]
  int64_t scratch_tokens_ = 0;
  int64_t prefill_rows_ = 0;  // rows of the current step that are a prompt chunk
  std::vector<float> x_, h_, q_, qg_, k_, v_, attn_, gate_, up_;
  std::vector<int32_t> positions_;
  int64_t peak_scratch_bytes_ = 0;
};

}  // namespace snap
