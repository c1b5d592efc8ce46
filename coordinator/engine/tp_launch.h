// The start of a tensor-parallel subcommand (`generate`, `serve`): this process's place in
// the launcher's world — mpirun or srun (MPI), a Kubernetes LeaderWorkerSet or explicit
// --rank/--world-size/--leader flags (TCP through the leader), or one process — the check
// that `--tp` matches it, the OpenMP thread count per rank, and the group's communicator.
#pragma once

#include <memory>
#include <string>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/world.h"
#include "common/status.h"
#include "coordinator/engine/device_spec.h"

namespace snap {

// The flags every tensor-parallel subcommand takes.
struct TpFlags {
  int tp = 0;       // --tp: 0 = the launcher's process count
  int threads = 0;  // --threads per rank: 0 = the cores divided by the ranks (at least 1)
  // Launchers without MPI: --rank R --world-size N --leader HOST[:PORT] (all or none).
  int rank = -1;
  int world_size = -1;
  std::string leader;
  // --collective-timeout: seconds a collective inside a step may wait for the other ranks
  // once all have loaded (TCP, MPI and NCCL; 0: no limit).
  double collective_timeout_s = 120;
  // --load-timeout: seconds the ranks wait for each other to load their shards (and the
  // workers for rank 0's first plan) before the group fails naming the slow rank (0: no limit).
  double load_timeout_s = 1800;
};

// The device-only tensor-parallel flags of generate, serve and batch (--device cuda, --tp > 1).
struct DeviceTpFlags {
  std::string comm = "auto";            // --tp-comm: auto | nccl | host
  std::string exchange_dtype = "f32";   // --tp-exchange-dtype: f32 | bf16
};

struct TpLaunch {
  comm::LaunchInfo launch;                   // world, launcher, rendezvous address
  std::unique_ptr<comm::Communicator> comm;  // null for one process
  int threads = 1;                           // OpenMP threads of this rank
  const comm::World& world() const { return launch.world; }
};

// Sets OpenMP's thread count on the calling thread. invalid_argument when --tp differs
// from the process count (naming the command to run) or the flags are inconsistent.
Result<TpLaunch> start_tensor_parallel(const std::string& subcommand, const TpFlags& flags);

// --device cuda with tp > 1 (generate and serve): the device forward's exchange for --tp-comm
// `tp_comm` (auto | nccl | host). NCCL on device buffers when asked, or by default where
// `nccl_usable` (the device layer can use it: device_spec.h's device_nccl_usable); else null:
// the forward stages through the launcher's communicator. Its rendezvous is the launcher's
// port + 1 (the unique id over MPI under mpirun/srun). `control` is the launcher's group
// communicator. One-line errors name this rank.
Result<std::unique_ptr<comm::Communicator>> open_device_exchange(const comm::LaunchInfo& launch,
                                                                  const comm::Communicator& control, int device_ordinal,
                                                                  const std::string& tp_comm, bool nccl_usable,
                                                                  double collective_timeout_s);

// --device for the engine-based subcommands (serve, batch) on this rank: the device (with
// tp > 1, `cuda` is the local rank's GPU), checked before any model is read, and the forward's
// exchange (open_device_exchange; null: staged through `control`). Errors are one line,
// prefixed "rank R: " in a group.
struct RankDevice {
  DeviceSpec spec;
  std::unique_ptr<comm::Communicator> exchange;
  DType exchange_dtype = DType::f32;  // the all-reduce's wire type (flags.exchange_dtype)
};
Result<RankDevice> open_rank_device(const std::string& device_flag, const comm::LaunchInfo& launch,
                                    const comm::Communicator* control, const DeviceTpFlags& flags,
                                    double collective_timeout_s);

}  // namespace snap
