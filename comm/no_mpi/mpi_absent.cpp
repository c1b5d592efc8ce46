// The MPI entry points of comm/backends.h for a build without MPI: the standalone CUDA
// project (kernels/cuda/CMakeLists.txt) for a bare GPU machine, which has no MPI. The single,
// TCP and NCCL backends work there (NCCL's id then goes through the TCP rendezvous: give a
// leader); asking for MPI is a one-line error. Not compiled into the full build (comm/mpi.cpp).
#include "comm/backends.h"

namespace snap::comm::detail {

Result<std::unique_ptr<Communicator>> make_mpi_communicator(const World&, const CommOptions&) {
  return unimplemented("comm: this build has no MPI (the standalone CUDA build); use the tcp backend");
}

Status mpi_broadcast_from_rank0(void*, int, std::chrono::milliseconds) {
  return unimplemented("comm/nccl: this build has no MPI to hand out the NCCL id; give a leader (TCP rendezvous)");
}

}  // namespace snap::comm::detail
