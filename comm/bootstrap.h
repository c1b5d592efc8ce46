// Start-up of a multi-process run: who am I (World from the launcher's environment or
// explicit flags), the TCP rendezvous that hands every rank a blob from rank 0 (the NCCL
// unique id) for launchers without MPI, and the factory for a Communicator backend.
// Launchers recognised, in this order: explicit flags; mpirun (OMPI_COMM_WORLD_*);
// Slurm srun (PMIX_RANK or SLURM_STEP_ID + SLURM_PROCID, SLURM_STEP_NUM_TASKS); Kubernetes
// LeaderWorkerSet (LWS_*, one rank per pod); otherwise a single process.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "comm/world.h"
#include "common/status.h"

namespace snap::comm {

enum class Launcher : uint8_t { single, flags, mpirun, slurm, lws };
const char* launcher_name(Launcher launcher);

inline constexpr int k_default_rendezvous_port = 29517;

// Explicit values from the command line; -1 / 0 / empty mean "not given".
struct WorldFlags {
  int rank = -1;
  int world_size = -1;
  int tp_size = 0;          // 0: the whole world is one tensor-parallel group
  std::string leader_host;  // rendezvous leader; overrides LWS_LEADER_ADDRESS
  int port = 0;             // rendezvous port; overrides SNAP_RENDEZVOUS_PORT
};

struct LaunchInfo {
  World world;
  Launcher launcher = Launcher::single;
  std::string leader_host;  // empty under mpirun/srun: MPI carries the bootstrap
  int port = 0;
};

using Environment = std::map<std::string, std::string>;

// The variables launch_from_environment reads, taken from this process's environment.
Environment process_environment();

// Pure function of `env` and `flags` (testable without touching the process). A
// malformed or inconsistent variable is an invalid_argument naming it.
Result<LaunchInfo> launch_from_environment(const Environment& env, const WorldFlags& flags = {});
Result<World> world_from_environment(const WorldFlags& flags = {});

// Rank 0 listens on `port` (all interfaces), the others connect to leader_host:port,
// retrying until `timeout`. Once all world_size ranks have joined, rank 0 sends `blob`
// (at most 1 MiB; ignored on other ranks) to every rank, then all ranks pass a barrier;
// every rank returns the blob. Never blocks past `timeout` (measured from the call);
// failures are one line, e.g. "rendezvous with 10.0.0.1:29517 timed out after 30 s:
// 1 of 4 ranks joined".
Result<std::vector<uint8_t>> tcp_rendezvous(const std::string& leader_host, int port, int rank, int world_size,
                                            std::span<const uint8_t> blob, std::chrono::milliseconds timeout);

// tcp: host buffers over persistent TCP connections through rank 0 (comm/tcp.cpp), for
// launchers without MPI; the whole world must be one tensor-parallel group.
enum class CommKind : uint8_t { single, mpi, nccl, tcp };
const char* comm_kind_name(CommKind kind);
Result<CommKind> parse_comm_kind(std::string_view name);  // "single" | "mpi" | "nccl" | "tcp"
// True when this build contains the NCCL backend (CUDA and NCCL were found).
bool nccl_compiled();

struct CommOptions {
  // NCCL: where to exchange the unique id. Empty leader_host: MPI broadcast (mpirun/srun);
  // otherwise the TCP rendezvous at leader_host:port.
  // tcp: rank 0 listens on `port`, the others connect to leader_host:port; every rank must
  // have joined within rendezvous_timeout (a rank that joined waits up to 1 s more for
  // rank 0 to say why it gave up). Collectives themselves have no timeout.
  std::string leader_host;
  int port = k_default_rendezvous_port;
  std::chrono::milliseconds rendezvous_timeout{30000};
  // NCCL: CUDA device of this rank; -1 picks world.local_rank() modulo the device count.
  int device = -1;
  // How long all_reduce_sum, all_gather and barrier may wait for the other ranks once the
  // communicator is armed (Communicator::set_collective_timeout; --collective-timeout; 0: no
  // limit). Every backend enforces it (MPI through point-to-point transfers it polls, see
  // comm/mpi.cpp).
  std::chrono::milliseconds collective_timeout{120000};
  // How long agree_on_load waits for the ranks still loading their shards, and a worker for
  // rank 0's first plan (Communicator::arm_load_timeout, BroadcastBound::load; --load-timeout;
  // 0: no limit). 30 minutes, as torch.distributed's default process-group timeout.
  std::chrono::milliseconds load_timeout{1800000};
  // MPI: all-reduces of at most this many bytes gather every buffer to every rank (one
  // round, lowest latency); larger ones use the two-round reduce-scatter/all-gather
  // (bandwidth-optimal). Both give the same bits.
  int64_t mpi_small_all_reduce_bytes = 64 * 1024;
};

// The Communicator for `world`'s tensor-parallel group. mpi initialises MPI if needed and
// checks that World agrees with MPI_COMM_WORLD.
Result<std::unique_ptr<Communicator>> make_communicator(CommKind kind, const World& world,
                                                        const CommOptions& options = {});

}  // namespace snap::comm
