// NCCL backend (device buffers; compiled only when CUDA and NCCL are found). One rank per
// GPU; the group must be the whole world (tp_size == size). Rank 0's ncclUniqueId reaches
// the others by MPI broadcast (mpirun/srun) or the TCP rendezvous (LeaderWorkerSet).
// Collectives run on the legacy default stream, so they are ordered after the caller's
// kernels on it, and return once the result is in the buffer (stream synchronised).
//
// all_reduce_sum keeps the documented rank order (comm/communicator.h): ncclAllGather of
// every buffer into a [P × count] scratch, then one kernel sums in rank order — the same
// bits as the MPI backend. ncclAllReduce would move 2(P-1)/P·n bytes per rank instead of
// (P-1)·n, but its order depends on NCCL's algorithm (ring/tree) and channel count.
// abort_job: ncclCommAbort, then the process exits; under mpirun that ends the job, under
// LeaderWorkerSet the group is recreated (RecreateGroupOnPodRestart).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/backends.h"
#include "comm/nccl_sum.h"

namespace snap::comm {

namespace {

Status cuda_failure(const char* call, cudaError_t e) {
  return internal_error(std::string("comm/nccl: ") + call + " failed: " + cudaGetErrorString(e));
}

Status nccl_failure(const char* call, ncclResult_t r, ncclComm_t comm) {
  std::string text = std::string("comm/nccl: ") + call + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  return internal_error(text);
}

#define SNAP_CUDA_CALL(call, ...)                                    \
  do {                                                               \
    const cudaError_t snap_cuda_rc_ = call(__VA_ARGS__);             \
    if (snap_cuda_rc_ != cudaSuccess) return cuda_failure(#call, snap_cuda_rc_); \
  } while (0)

#define SNAP_NCCL_CALL(call, ...)                                            \
  do {                                                                       \
    const ncclResult_t snap_nccl_rc_ = call(__VA_ARGS__);                    \
    if (snap_nccl_rc_ != ncclSuccess) return nccl_failure(#call, snap_nccl_rc_, comm_); \
  } while (0)

detail::NcclSumType sum_type(DType t) {
  switch (t) {
    case DType::bf16: return detail::NcclSumType::bf16;
    case DType::f16: return detail::NcclSumType::f16;
    default: return detail::NcclSumType::f32;
  }
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    default: return ncclFloat32;
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(World world, int device, ncclComm_t comm) : Communicator(world), device_(device), comm_(comm) {}
  ~NcclCommunicator() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (host_staging_ != nullptr) cudaFree(host_staging_);
    ncclCommDestroy(comm_);
  }
  const char* backend_name() const override { return "nccl"; }

  [[noreturn]] void abort_job(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "snapserve: rank %d aborting the job: %s\n", world().rank(), message.c_str());
    std::fflush(stderr);
    ncclCommAbort(comm_);
    std::_Exit(exit_code);
  }

 protected:
  Status do_all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    const int p = group_size();
    if (count == 0 || p == 1) return Status();
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    SNAP_RETURN_IF_ERROR(reserve_scratch(bytes * p));
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    SNAP_NCCL_CALL(ncclAllGather, buf, scratch_, bytes, ncclUint8, comm_, cudaStreamLegacy);
    SNAP_CUDA_CALL(detail::nccl_sum_blocks_rank_order, scratch_, p, count, sum_type(dtype), buf, cudaStreamLegacy);
    SNAP_CUDA_CALL(cudaStreamSynchronize, cudaStreamLegacy);
    return Status();
  }

  Status do_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (count == 0) return Status();
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    SNAP_NCCL_CALL(ncclAllGather, send, recv, count, nccl_type(dtype), comm_, cudaStreamLegacy);
    SNAP_CUDA_CALL(cudaStreamSynchronize, cudaStreamLegacy);
    return Status();
  }

  Status do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
    if (count == 0) return Status();
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    SNAP_NCCL_CALL(ncclBroadcast, buf, buf, count, nccl_type(dtype), root, comm_, cudaStreamLegacy);
    SNAP_CUDA_CALL(cudaStreamSynchronize, cudaStreamLegacy);
    return Status();
  }

  // Host bytes (step plans): staged through a device buffer, since NCCL moves device memory.
  Status do_broadcast_bytes(void* buf, int64_t num_bytes, int root) override {
    if (num_bytes == 0) return Status();
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    if (host_staging_bytes_ < static_cast<size_t>(num_bytes)) {
      if (host_staging_ != nullptr) cudaFree(host_staging_);
      host_staging_ = nullptr;
      SNAP_CUDA_CALL(cudaMalloc, &host_staging_, num_bytes);
      host_staging_bytes_ = num_bytes;
    }
    if (group_rank() == root) SNAP_CUDA_CALL(cudaMemcpy, host_staging_, buf, num_bytes, cudaMemcpyHostToDevice);
    SNAP_NCCL_CALL(ncclBroadcast, host_staging_, host_staging_, num_bytes, ncclUint8, root, comm_, cudaStreamLegacy);
    SNAP_CUDA_CALL(cudaMemcpy, buf, host_staging_, num_bytes, cudaMemcpyDeviceToHost);
    return Status();
  }

  // NCCL has no barrier: an all-reduce of one float is one.
  Status do_barrier() override {
    SNAP_RETURN_IF_ERROR(reserve_scratch(sizeof(float) * group_size()));
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    SNAP_NCCL_CALL(ncclAllReduce, scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, cudaStreamLegacy);
    SNAP_CUDA_CALL(cudaStreamSynchronize, cudaStreamLegacy);
    return Status();
  }

 private:
  Status reserve_scratch(size_t bytes) {
    if (scratch_bytes_ >= bytes) return Status();
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    SNAP_CUDA_CALL(cudaMalloc, &scratch_, bytes);
    scratch_bytes_ = bytes;
    return Status();
  }

  const int device_;
  ncclComm_t comm_;
  void* scratch_ = nullptr;  // [P × count] gathered all-reduce inputs
  size_t scratch_bytes_ = 0;
  void* host_staging_ = nullptr;  // device copy of a host broadcast_bytes buffer
  size_t host_staging_bytes_ = 0;
};

}  // namespace

namespace detail {

Result<std::unique_ptr<Communicator>> make_nccl_communicator(const World& world, const CommOptions& options) {
  if (world.tp_size() != world.size()) {
    return unimplemented("comm/nccl: tp size " + std::to_string(world.tp_size()) + " below world size " +
                         std::to_string(world.size()) + " (several groups) is not supported");
  }
  int num_devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&num_devices);
  if (e != cudaSuccess || num_devices == 0) {
    return unimplemented(std::string("comm/nccl: no CUDA device (") +
                         (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
  }
  const int device = options.device >= 0 ? options.device : world.local_rank() % num_devices;
  if (device >= num_devices) {
    return invalid_argument("comm/nccl: device " + std::to_string(device) + " but only " +
                            std::to_string(num_devices) + " CUDA devices");
  }
  if (cudaError_t se = cudaSetDevice(device); se != cudaSuccess) return cuda_failure("cudaSetDevice", se);

  ncclUniqueId id{};
  if (world.rank() == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return nccl_failure("ncclGetUniqueId", r, nullptr);
  }
  if (world.size() > 1) {
    if (options.leader_host.empty()) {
      SNAP_RETURN_IF_ERROR(mpi_broadcast_from_rank0(&id, sizeof id));
    } else {
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      SNAP_ASSIGN_OR_RETURN(std::vector<uint8_t> got,
                            tcp_rendezvous(options.leader_host, options.port, world.rank(), world.size(),
                                           std::span<const uint8_t>(bytes, sizeof id), options.rendezvous_timeout));
      if (got.size() != sizeof id) {
        return data_loss("comm/nccl: rendezvous delivered " + std::to_string(got.size()) + " bytes, expected a " +
                         std::to_string(sizeof id) + "-byte ncclUniqueId");
      }
      std::memcpy(&id, got.data(), sizeof id);
    }
  }
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, world.size(), id, world.rank()); r != ncclSuccess) {
    return nccl_failure("ncclCommInitRank", r, nullptr);
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(world, device, comm));
}

}  // namespace detail
}  // namespace snap::comm
