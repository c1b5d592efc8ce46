// start_tensor_parallel: launcher detection → World, --tp check, threads, communicator
// (MPI under mpirun/srun, TCP through the leader under LeaderWorkerSet or flags).
#include "coordinator/engine/tp_launch.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/host_port.h"

namespace snap {

Result<TpLaunch> start_tensor_parallel(const std::string& subcommand, const TpFlags& flags) {
  comm::WorldFlags wf;
  wf.rank = flags.rank;
  wf.world_size = flags.world_size;
  if (!flags.leader.empty()) {
    Result<HostPort> leader = parse_host_port(flags.leader);
    if (!leader.ok()) return invalid_argument("--leader " + flags.leader + ": " + leader.status().message());
    wf.leader_host = leader->host;
    wf.port = leader->port;  // 0: the default rendezvous port
  }
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
    opts.collective_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.collective_timeout_s * 1000));
    opts.load_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.load_timeout_s * 1000));
    opts.leader_host = out.launch.leader_host;
    if (out.launch.port > 0) opts.port = out.launch.port;
    SNAP_ASSIGN_OR_RETURN(out.comm,
                          comm::make_communicator(mpi ? comm::CommKind::mpi : comm::CommKind::tcp, out.launch.world, opts));
  }
  return out;
}

Result<std::unique_ptr<comm::Communicator>> open_device_exchange(const comm::LaunchInfo& launch,
                                                                  const comm::Communicator& control, int device_ordinal,
                                                                  const std::string& tp_comm, bool nccl_usable,
                                                                  double collective_timeout_s) {
  const comm::World& world = launch.world;
  if (world.size() <= 1 || tp_comm == "host" || (tp_comm == "auto" && !nccl_usable))
    return std::unique_ptr<comm::Communicator>();
  if (!nccl_usable) return invalid_argument("--tp-comm nccl: this build's device path has no NCCL");
  comm::CommOptions opts;
  opts.leader_host = launch.leader_host;  // empty under mpirun/srun: MPI carries the id
  opts.port = (launch.port > 0 ? launch.port : comm::k_default_rendezvous_port) + 1;
  opts.device = device_ordinal;
  opts.collective_timeout = std::chrono::milliseconds(static_cast<int64_t>(collective_timeout_s * 1000));
  auto made = comm::make_communicator(comm::CommKind::nccl, world, opts);
  if (!made.ok()) {
    return unavailable("rank " + std::to_string(world.rank()) + ": " + made.status().message() +
                       " (--tp-comm host stages through " + control.backend_name() + " instead)");
  }
  return std::move(made).value();
}

Result<RankDevice> open_rank_device(const std::string& device_flag, const comm::LaunchInfo& launch,
                                    const comm::Communicator* control, const DeviceTpFlags& flags,
                                    double collective_timeout_s) {
  const comm::World& world = launch.world;
  const auto on_rank = [&](const Status& st) {
    return world.size() > 1 ? Status(st.code(), "rank " + std::to_string(world.rank()) + ": " + st.message()) : st;
  };
  SNAP_ASSIGN_OR_RETURN(DeviceSpec spec, parse_device(device_flag));
  RankDevice d;
  d.spec = spec;
  if (flags.exchange_dtype != "f32" && flags.exchange_dtype != "bf16")
    return invalid_argument("--tp-exchange-dtype '" + flags.exchange_dtype + "': expected f32 or bf16");
  d.exchange_dtype = flags.exchange_dtype == "bf16" ? DType::bf16 : DType::f32;
  if (spec.kind != DeviceKind::cuda) {
    if (d.exchange_dtype != DType::f32)
      return invalid_argument("--tp-exchange-dtype bf16 is for --device cuda (the CPU's all-reduces are f32)");
    return d;
  }
  if (device_flag == "cuda" && world.size() > 1) {
    auto local = device_for_local_rank(world.local_rank());
    if (!local.ok()) return on_rank(local.status());
    d.spec = *local;
  }
  if (Status st = check_device(d.spec); !st.ok()) return on_rank(st);
  if (world.size() > 1 && control != nullptr) {
    SNAP_ASSIGN_OR_RETURN(d.exchange, open_device_exchange(launch, *control, d.spec.ordinal, flags.comm,
                                                           device_nccl_usable(), collective_timeout_s));
  }
  return d;
}

}  // namespace snap
