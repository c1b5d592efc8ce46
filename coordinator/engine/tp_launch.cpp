// start_tensor_parallel: launcher detection → World, --tp check, threads, communicator.
#include "coordinator/engine/tp_launch.h"

#include <omp.h>

#include <algorithm>
#include <thread>

#include "comm/bootstrap.h"

namespace snap {

Result<TpLaunch> start_tensor_parallel(const std::string& subcommand, int tp, int threads) {
  TpLaunch out;
  SNAP_ASSIGN_OR_RETURN(out.world, comm::world_from_environment());
  const int size = out.world.size();
  if (tp > 0 && tp != size) {
    const std::string n = std::to_string(tp);
    return invalid_argument("--tp " + n + " but the launcher started " + std::to_string(size) +
                            " process(es); run `mpirun -np " + n + " snapserve " + subcommand + " --tp " + n + " ...`");
  }
  out.threads = threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / size);
  omp_set_num_threads(out.threads);
  if (size > 1) {
    SNAP_ASSIGN_OR_RETURN(out.comm, comm::make_communicator(comm::CommKind::mpi, out.world));
  }
  return out;
}

}  // namespace snap
