// start_tensor_parallel: launcher detection → World, --tp check, threads, communicator
// (MPI under mpirun/srun, TCP through the leader under LeaderWorkerSet or flags).
#include "coordinator/engine/tp_launch.h"

#include <omp.h>

#include <algorithm>
#include <thread>

namespace snap {

namespace {

// "HOST", "HOST:PORT", "[IPV6]" or "[IPV6]:PORT" into the flags' host and port.
Status parse_leader(const std::string& leader, comm::WorldFlags* wf) {
  std::string host = leader, port;
  if (!leader.empty() && leader.front() == '[') {
    const size_t close = leader.find(']');
    if (close == std::string::npos) return invalid_argument("--leader " + leader + ": missing ']'");
    host = leader.substr(1, close - 1);
    if (close + 1 < leader.size()) {
      if (leader[close + 1] != ':') return invalid_argument("--leader " + leader + ": expected ':' after ']'");
      port = leader.substr(close + 2);
    }
  } else if (std::count(leader.begin(), leader.end(), ':') == 1) {
    host = leader.substr(0, leader.find(':'));
    port = leader.substr(leader.find(':') + 1);
  }
  if (host.empty()) return invalid_argument("--leader " + leader + ": no host");
  wf->leader_host = host;
  if (port.empty()) return {};
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    return invalid_argument("--leader " + leader + ": the port must be a number in [1, 65535]");
  }
  wf->port = std::stoi(port);
  return {};
}

}  // namespace

Result<TpLaunch> start_tensor_parallel(const std::string& subcommand, const TpFlags& flags) {
  comm::WorldFlags wf;
  wf.rank = flags.rank;
  wf.world_size = flags.world_size;
  if (!flags.leader.empty()) SNAP_RETURN_IF_ERROR(parse_leader(flags.leader, &wf));
  TpLaunch out;
  SNAP_ASSIGN_OR_RETURN(out.launch, comm::launch_from_environment(comm::process_environment(), wf));
  const int size = out.launch.world.size();
  if (flags.tp > 0 && flags.tp != size) {
    const std::string n = std::to_string(flags.tp);
    return invalid_argument("--tp " + n + " but the launcher started " + std::to_string(size) +
                            " process(es); run `mpirun -np " + n + " snapserve " + subcommand + " --tp " + n + " ...`");
  }
  out.threads = flags.threads > 0 ? flags.threads
                                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / size);
  omp_set_num_threads(out.threads);
  if (size > 1) {
    // MPI carries the group under mpirun and srun; elsewhere TCP through the leader.
    const bool mpi = out.launch.launcher == comm::Launcher::mpirun || out.launch.launcher == comm::Launcher::slurm;
    comm::CommOptions opts;
    opts.leader_host = out.launch.leader_host;
    if (out.launch.port > 0) opts.port = out.launch.port;
    SNAP_ASSIGN_OR_RETURN(out.comm,
                          comm::make_communicator(mpi ? comm::CommKind::mpi : comm::CommKind::tcp, out.launch.world, opts));
  }
  return out;
}

}  // namespace snap
