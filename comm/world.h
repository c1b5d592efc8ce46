// World: the immutable parallel layout of one process (rank, size, tensor-parallel
// rank and size, node-local rank). Built once at start-up (comm/bootstrap.h) and passed
// by value to whoever needs it; never a global. Ranks are grouped into tensor-parallel
// groups of tp_size consecutive ranks: tp_rank = rank % tp_size, tp_group = rank / tp_size.
#pragma once

#include <string>

#include "common/status.h"

namespace snap::comm {

class World {
 public:
  // One process: rank 0 of 1, tp 0 of 1.
  World() = default;

  // Validates 0 <= rank < size, 1 <= tp_size, size % tp_size == 0, 0 <= local_rank.
  // tp_size 0 means "the whole world" (tp_size = size).
  static Result<World> make(int rank, int size, int tp_size = 0, int local_rank = 0);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int tp_rank() const { return rank_ % tp_size_; }
  int tp_size() const { return tp_size_; }
  int tp_group() const { return rank_ / tp_size_; }
  int num_tp_groups() const { return size_ / tp_size_; }
  // Rank on this node (picks the GPU); 0 when the launcher does not say.
  int local_rank() const { return local_rank_; }

  // Rank 0 of the world: tokenizes, schedules, samples, talks HTTP.
  bool is_leader() const { return rank_ == 0; }
  // Rank 0 of its tensor-parallel group: returns that group's logits.
  bool is_tp_leader() const { return tp_rank() == 0; }
  bool is_single() const { return size_ == 1; }

  // "rank 1/4 tp 1/4 local 1"
  std::string to_string() const;

  bool operator==(const World&) const = default;

 private:
  World(int rank, int size, int tp_size, int local_rank)
      : rank_(rank), size_(size), tp_size_(tp_size), local_rank_(local_rank) {}

  int rank_ = 0;
  int size_ = 1;
  int tp_size_ = 1;
  int local_rank_ = 0;
};

}  // namespace snap::comm
