// make_tp_shard: validation of a tensor-parallel size against a model, and the slice of
// heads and MLP features one rank holds.
#include "worker/model/shard.h"

#include <algorithm>
#include <sstream>

namespace snap {

std::string TpShard::describe() const {
  std::ostringstream os;
  os << "tp " << tp_rank << "/" << tp_size << ": q heads " << head_begin << "-" << head_begin + num_heads - 1
     << ", kv heads " << kv_head_begin << "-" << kv_head_begin + num_kv_heads - 1;
  if (kv_replicas > 1) os << " (replicated x" << kv_replicas << ")";
  os << ", ff " << ff_begin << "-" << ff_begin + ff_size - 1;
  os << ", vocab " << vocab_begin << "-" << vocab_begin + vocab_size - 1;
  return os.str();
}

Result<TpShard> make_tp_shard(const ModelConfig& c, int tp_rank, int tp_size) {
  if (tp_size < 1) return invalid_argument("tensor-parallel size must be >= 1, got " + std::to_string(tp_size));
  if (tp_rank < 0 || tp_rank >= tp_size) {
    return invalid_argument("tp rank " + std::to_string(tp_rank) + " outside [0, " + std::to_string(tp_size) + ")");
  }
  const std::string tp = "--tp " + std::to_string(tp_size);
  if (c.num_heads % tp_size != 0) {
    return invalid_argument(tp + " does not divide the model's " + std::to_string(c.num_heads) +
                            " query heads (attention is split by whole heads)");
  }
  if (c.num_kv_heads % tp_size != 0 && tp_size % c.num_kv_heads != 0) {
    return invalid_argument(tp + " and the model's " + std::to_string(c.num_kv_heads) +
                            " KV heads must divide one another (KV heads are split, or replicated when tp > KV heads)");
  }
  if (c.intermediate_size % tp_size != 0) {
    return invalid_argument(tp + " does not divide the model's MLP width (intermediate_size " +
                            std::to_string(c.intermediate_size) + ")");
  }
  TpShard s;
  s.tp_rank = tp_rank;
  s.tp_size = tp_size;
  s.num_heads = c.num_heads / tp_size;
  s.head_begin = tp_rank * s.num_heads;
  if (tp_size <= c.num_kv_heads) {
    s.num_kv_heads = c.num_kv_heads / tp_size;
    s.kv_head_begin = tp_rank * s.num_kv_heads;
    s.q_load_begin = s.head_begin;
    s.q_load_heads = s.num_heads;
  } else {
    // Each KV head on kv_replicas consecutive ranks; its group of query heads is split
    // among them, so rank r's heads all belong to KV head r / kv_replicas.
    s.kv_replicas = tp_size / c.num_kv_heads;
    s.num_kv_heads = 1;
    s.kv_head_begin = tp_rank / s.kv_replicas;
    const int group = c.num_heads / c.num_kv_heads;
    s.q_load_begin = s.kv_head_begin * group;
    s.q_load_heads = group;
  }
  s.ff_size = c.intermediate_size / tp_size;
  s.ff_begin = tp_rank * s.ff_size;
  s.vocab_chunk = (c.vocab_size + tp_size - 1) / tp_size;
  s.vocab_begin = std::min<int64_t>(c.vocab_size, tp_rank * s.vocab_chunk);
  s.vocab_size = std::min<int64_t>(c.vocab_size, s.vocab_begin + s.vocab_chunk) - s.vocab_begin;
  s.is_logits_rank = tp_rank == 0;
  return s;
}

}  // namespace snap
