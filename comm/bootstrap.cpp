// World from the launcher's environment or flags, and the Communicator factory
// (see comm/bootstrap.h). The TCP rendezvous lives in comm/rendezvous.cpp.
#include "comm/bootstrap.h"

#include <charconv>
#include <cstdlib>

#include "comm/backends.h"

namespace snap::comm {

namespace {

const char* const k_env_names[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMIX_RANK",            "SLURM_PROCID",         "SLURM_STEP_ID",
    "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",         "SLURM_LOCALID",
    "LWS_LEADER_ADDRESS",   "LWS_GROUP_SIZE",       "LWS_WORKER_INDEX",
    "SNAP_RENDEZVOUS_PORT",
};

const std::string* find(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

// An integer variable; `fallback` when absent.
Result<int> env_int(const Environment& env, const char* name, int fallback) {
  const std::string* v = find(env, name);
  if (v == nullptr) return fallback;
  int out = 0;
  const char* end = v->data() + v->size();
  auto [ptr, ec] = std::from_chars(v->data(), end, out);
  if (v->empty() || ec != std::errc() || ptr != end) {
    return invalid_argument("comm/bootstrap: " + std::string(name) + "='" + *v + "' is not an integer");
  }
  return out;
}

Result<int> rendezvous_port(const Environment& env, const WorldFlags& flags) {
  if (flags.port != 0) return flags.port;
  SNAP_ASSIGN_OR_RETURN(int port, env_int(env, "SNAP_RENDEZVOUS_PORT", k_default_rendezvous_port));
  if (port < 1 || port > 65535) {
    return invalid_argument("comm/bootstrap: SNAP_RENDEZVOUS_PORT=" + std::to_string(port) + " is not a TCP port");
  }
  return port;
}

Result<LaunchInfo> make_info(Launcher launcher, int rank, int size, int local_rank, const WorldFlags& flags,
                             std::string leader_host, int port) {
  Result<World> world = World::make(rank, size, flags.tp_size, local_rank);
  if (!world.ok()) {
    return invalid_argument("comm/bootstrap: launcher " + std::string(launcher_name(launcher)) + ": " +
                            world.status().message());
  }
  LaunchInfo info;
  info.world = world.value();
  info.launcher = launcher;
  info.leader_host = std::move(leader_host);
  info.port = port;
  return info;
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::single: return "single";
    case Launcher::flags: return "flags";
    case Launcher::mpirun: return "mpirun";
    case Launcher::slurm: return "slurm";
    case Launcher::lws: return "lws";
  }
  return "?";
}

Environment process_environment() {
  Environment env;
  for (const char* name : k_env_names) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return env;
}

Result<LaunchInfo> launch_from_environment(const Environment& env, const WorldFlags& flags) {
  if ((flags.rank >= 0) != (flags.world_size >= 0)) {
    return invalid_argument("comm/bootstrap: --rank and --world-size must be given together");
  }
  if (flags.rank >= 0) {
    SNAP_ASSIGN_OR_RETURN(int port, rendezvous_port(env, flags));
    std::string leader = flags.leader_host;
    if (leader.empty() && flags.world_size > 1) {
      const std::string* lws = find(env, "LWS_LEADER_ADDRESS");
      leader = lws != nullptr ? *lws : "";
    }
    if (leader.empty() && flags.world_size > 1) {
      return invalid_argument("comm/bootstrap: --rank/--world-size need --leader (the rank-0 host) for the rendezvous");
    }
    return make_info(Launcher::flags, flags.rank, flags.world_size, 0, flags, leader, port);
  }
  if (find(env, "OMPI_COMM_WORLD_RANK") != nullptr) {
    SNAP_ASSIGN_OR_RETURN(int rank, env_int(env, "OMPI_COMM_WORLD_RANK", -1));
    SNAP_ASSIGN_OR_RETURN(int size, env_int(env, "OMPI_COMM_WORLD_SIZE", -1));
    SNAP_ASSIGN_OR_RETURN(int local, env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0));
    if (size < 0) return invalid_argument("comm/bootstrap: OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    return make_info(Launcher::mpirun, rank, size, local, flags, flags.leader_host, flags.port);
  }
  // srun: PMIX_RANK (--mpi=pmix) or a job step's SLURM_PROCID. A batch script also has
  // SLURM_PROCID=0 and SLURM_NTASKS of the allocation, but no step id: not a launch.
  const bool pmix = find(env, "PMIX_RANK") != nullptr;
  if (pmix || (find(env, "SLURM_PROCID") != nullptr && find(env, "SLURM_STEP_ID") != nullptr)) {
    SNAP_ASSIGN_OR_RETURN(int rank, env_int(env, pmix ? "PMIX_RANK" : "SLURM_PROCID", -1));
    SNAP_ASSIGN_OR_RETURN(int ntasks, env_int(env, "SLURM_NTASKS", -1));
    SNAP_ASSIGN_OR_RETURN(int size, env_int(env, "SLURM_STEP_NUM_TASKS", ntasks));
    SNAP_ASSIGN_OR_RETURN(int local, env_int(env, "SLURM_LOCALID", 0));
    if (size < 0) {
      return invalid_argument("comm/bootstrap: srun rank is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is");
    }
    return make_info(Launcher::slurm, rank, size, local, flags, flags.leader_host, flags.port);
  }
  if (find(env, "LWS_GROUP_SIZE") != nullptr) {
    SNAP_ASSIGN_OR_RETURN(int size, env_int(env, "LWS_GROUP_SIZE", -1));
    SNAP_ASSIGN_OR_RETURN(int rank, env_int(env, "LWS_WORKER_INDEX", -1));
    if (rank < 0) return invalid_argument("comm/bootstrap: LWS_GROUP_SIZE is set but LWS_WORKER_INDEX is not");
    std::string leader = flags.leader_host;
    if (leader.empty()) {
      const std::string* lws = find(env, "LWS_LEADER_ADDRESS");
      if (lws == nullptr || lws->empty()) {
        return invalid_argument("comm/bootstrap: LWS_GROUP_SIZE is set but LWS_LEADER_ADDRESS is not");
      }
      leader = *lws;
    }
    SNAP_ASSIGN_OR_RETURN(int port, rendezvous_port(env, flags));
    return make_info(Launcher::lws, rank, size, 0, flags, leader, port);
  }
  return make_info(Launcher::single, 0, 1, 0, flags, "", 0);
}

Result<World> world_from_environment(const WorldFlags& flags) {
  SNAP_ASSIGN_OR_RETURN(LaunchInfo info, launch_from_environment(process_environment(), flags));
  return info.world;
}

const char* comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::single: return "single";
    case CommKind::mpi: return "mpi";
    case CommKind::nccl: return "nccl";
    case CommKind::tcp: return "tcp";
  }
  return "?";
}

Result<CommKind> parse_comm_kind(std::string_view name) {
  if (name == "single") return CommKind::single;
  if (name == "mpi") return CommKind::mpi;
  if (name == "nccl") return CommKind::nccl;
  if (name == "tcp") return CommKind::tcp;
  return invalid_argument("comm: unknown communicator '" + std::string(name) + "'; expected single, mpi, nccl or tcp");
}

bool nccl_compiled() {
#ifdef SNAP_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

namespace {
Result<std::unique_ptr<Communicator>> make_backend(CommKind kind, const World& world, const CommOptions& options) {
  switch (kind) {
    case CommKind::single: return detail::make_single_communicator(world);
    case CommKind::mpi: return detail::make_mpi_communicator(world, options);
    case CommKind::tcp: return detail::make_tcp_communicator(world, options);
    case CommKind::nccl:
#ifdef SNAP_HAVE_NCCL
      return detail::make_nccl_communicator(world, options);
#else
      return unimplemented("comm: this build has no NCCL backend (CUDA or NCCL was not found at configure time)");
#endif
  }
  return invalid_argument("comm: bad communicator kind");
}
}  // namespace

Result<std::unique_ptr<Communicator>> make_communicator(CommKind kind, const World& world,
                                                        const CommOptions& options) {
  SNAP_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, make_backend(kind, world, options));
  comm->set_collective_timeout(options.collective_timeout);  // armed later (arm_collective_timeout)
  comm->set_load_timeout(options.load_timeout);              // armed by agree_on_load
  return comm;
}

}  // namespace snap::comm
