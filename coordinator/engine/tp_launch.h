// The start of a tensor-parallel subcommand (`generate`, `serve`): this process's place in
// the launcher's world (mpirun, srun or one process), the check that `--tp` matches it, the
// OpenMP thread count per rank, and the MPI communicator of the group (none alone).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/world.h"
#include "common/status.h"

namespace snap {

struct TpLaunch {
  comm::World world;
  std::unique_ptr<comm::Communicator> comm;  // null for one process
  int threads = 1;                           // OpenMP threads of this rank
};

// tp: the --tp flag (0: the launcher's process count); threads: --threads (0: the cores
// divided by the ranks, at least 1). Sets OpenMP's thread count on the calling thread.
// invalid_argument when --tp differs from the process count, naming the command to run.
Result<TpLaunch> start_tensor_parallel(const std::string& subcommand, int tp, int threads);

}  // namespace snap
