// World construction and formatting (see comm/world.h).
#include "comm/world.h"

namespace snap::comm {

Result<World> World::make(int rank, int size, int tp_size, int local_rank) {
  if (size < 1) return invalid_argument("comm/world: world size " + std::to_string(size) + " must be >= 1");
  if (rank < 0 || rank >= size) {
    return invalid_argument("comm/world: rank " + std::to_string(rank) + " is outside [0, " +
                            std::to_string(size) + ")");
  }
  if (tp_size == 0) tp_size = size;
  if (tp_size < 1 || size % tp_size != 0) {
    return invalid_argument("comm/world: tp size " + std::to_string(tp_size) + " does not divide world size " +
                            std::to_string(size));
  }
  if (local_rank < 0) return invalid_argument("comm/world: local rank " + std::to_string(local_rank) + " is negative");
  return World(rank, size, tp_size, local_rank);
}

std::string World::to_string() const {
  return "rank " + std::to_string(rank_) + "/" + std::to_string(size_) + " tp " + std::to_string(tp_rank()) + "/" +
         std::to_string(tp_size_) + " local " + std::to_string(local_rank_);
}

}  // namespace snap::comm
