// Internal: the backend constructors behind make_communicator (comm/bootstrap.h).
// Not part of comm's interface; include only from comm/*.cpp.
#pragma once

#include <chrono>
#include <memory>

#include "comm/bootstrap.h"
#include "comm/communicator.h"

namespace snap::comm::detail {

Result<std::unique_ptr<Communicator>> make_single_communicator(const World& world);
Result<std::unique_ptr<Communicator>> make_mpi_communicator(const World& world, const CommOptions& options);
// Star through rank 0 over TCP (comm/tcp.cpp); connects every rank before returning.
Result<std::unique_ptr<Communicator>> make_tcp_communicator(const World& world, const CommOptions& options);
// Defined in comm/nccl.cpp only when SNAP_HAVE_NCCL.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(const World& world, const CommOptions& options);
// Broadcast `num_bytes` from world rank 0 over MPI_COMM_WORLD (initialising MPI if needed);
// used by the NCCL backend to hand out its unique id under mpirun/srun. Waits at most
// `timeout` (0: no limit); then fails naming rank 0, and the job ends at exit (MPI_Abort).
Status mpi_broadcast_from_rank0(void* buf, int num_bytes, std::chrono::milliseconds timeout);

}  // namespace snap::comm::detail
