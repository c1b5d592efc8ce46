// TpShard: which slice of a model one tensor-parallel rank holds (Megatron layout).
// Attention is split by heads: q/k/v projections column-parallel (whole heads), o_proj
// row-parallel; the MLP is split by intermediate features: gate/up column-parallel,
// down_proj row-parallel. After each row-parallel projection the partial sums are
// all-reduced (LlamaForward::row_parallel). When tp > num_kv_heads every KV head is
// replicated on tp / num_kv_heads consecutive ranks, each holding a share of its query
// heads. The LM head is split by vocabulary rows and its logits gathered to rank 0; the
// embedding is replicated (see make_tp_shard).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "worker/model/config.h"

namespace snap {

struct TpShard {
  int tp_rank = 0;
  int tp_size = 1;
  // Query heads this rank attends with: global heads [head_begin, head_begin + num_heads).
  int head_begin = 0;
  int num_heads = 0;
  // KV heads this rank caches: global KV heads [kv_head_begin, kv_head_begin + num_kv_heads).
  int kv_head_begin = 0;
  int num_kv_heads = 0;
  int kv_replicas = 1;  // ranks holding each of these KV heads (tp / num_kv_heads when replicated)
  // Query heads whose q_proj rows are loaded: the rank's own heads, or — when KV heads are
  // replicated — every query head of its KV head's group, because KV selection aggregates
  // the observation window's attention over the whole GQA group (see LlamaForward).
  int q_load_begin = 0;
  int q_load_heads = 0;
  // Intermediate (MLP) features [ff_begin, ff_begin + ff_size).
  int64_t ff_begin = 0;
  int64_t ff_size = 0;
  // LM head rows (vocabulary ids) [vocab_begin, vocab_begin + vocab_size); every rank's
  // slice is vocab_chunk = ceil(vocab / tp) rows but the last rank's may be shorter.
  int64_t vocab_begin = 0;
  int64_t vocab_size = 0;
  int64_t vocab_chunk = 0;
  bool is_logits_rank = true;  // tp rank 0 receives the whole logits rows and samples

  bool is_sharded() const { return tp_size > 1; }
  // "tp 1/3: q heads 3-5, kv heads 1-1, ff 512-1023"
  std::string describe() const;
};

// The shard of tp rank `tp_rank` of `tp_size` for model `c`. invalid_argument naming the
// dimension when tp_size does not divide the query heads or the MLP width, or when
// tp_size and num_kv_heads do not divide one another.
//
// The embedding is replicated: every rank needs the full hidden state of each token to
// start the layer, and a lookup costs no compute, so replicating it trades vocab × hidden
// × 4 bytes per rank (113 MB for SmolLM2-135M; 2.1 GB for Llama-3-8B in f32, 1 GB in
// bf16) for zero traffic — a vocab-parallel embedding would add one all-reduce of
// hidden_size per token.
// The LM head is vocab-parallel: each rank multiplies its 1/tp of the vocabulary rows and
// rank 0 gathers the logits (one all_gather of vocab_chunk floats per logits row: 98 KB
// per rank per token for SmolLM2 at tp 2). Keeping the whole head on rank 0 instead would
// save that traffic but make rank 0 read the whole head every decode step while the
// others wait. Measured on a SmolLM2-shaped f32 model at tp 2 (bench/run_tp.sh, 2048-token
// prompt), decode ran 1.42x faster than one process with the whole head on rank 0 and
// 1.82x with the split head; for Llama-3-8B on GPUs at tp 8 the whole head on one rank
// would make a memory-bound step ~1.5x longer (docs/tensor_parallel.md).
Result<TpShard> make_tp_shard(const ModelConfig& c, int tp_rank, int tp_size);

}  // namespace snap
