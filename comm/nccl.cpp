// NCCL backend (device buffers; compiled only when CUDA and NCCL are found). One rank per
// GPU; the group must be the whole world (tp_size == size). Rank 0's ncclUniqueId reaches
// the others by MPI broadcast (mpirun/srun) or the TCP rendezvous (LeaderWorkerSet).
// Collectives run on the legacy default stream, so they are ordered after the caller's
// kernels on any blocking stream, and return once the result is in the buffer.
//
// all_reduce_sum keeps the documented rank order (comm/communicator.h) with a ring's traffic:
// a reduce-scatter in fixed order — rank r owns chunk r (rank_chunks), every rank sends each
// owner its copy of that chunk (grouped ncclSend/ncclRecv), the owner sums the P copies in
// rank order (nccl_sum_blocks_rank_order) — then an all-gather of the finished chunks, again
// by send/recv so that chunks may differ in length. Each rank sends 2(P−1)/P·n bytes, as a
// ring all-reduce does (before: an all-gather of every buffer, (P−1)·n, 3.5x more at P = 8),
// and gets the same bits as the MPI backend. ncclAllReduce is not used: its order depends on
// NCCL's algorithm (ring/tree) and channel count. A group of one runs the same path (the
// copy into the scratch and the sum kernel; nothing is sent).
//
// No silent hang: the communicator is non-blocking (ncclConfig_t.blocking = 0), and every
// wait — NCCL's own progress and the stream — polls ncclCommGetAsyncError against a deadline
// (the armed collective timeout, Communicator::set_collective_timeout, for the collectives of
// a step; broadcasts, which may wait for an idle leader's next request, have none). On an error or at the deadline the
// communicator is aborted (ncclCommAbort) and the call returns an error naming this rank, the
// collective and the time waited; every later call fails at once.
// abort_job: ncclCommAbort, then the process exits; under mpirun that ends the job, under
// LeaderWorkerSet the group is recreated (RecreateGroupOnPodRestart).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

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

// Inside NcclCommunicator: a failed call aborts the communicator (give_up). A non-blocking
// communicator's calls may return ncclInProgress, which settle()/wait_stream() then follow.
#define SNAP_NCCL_CALL(call, ...)                                                              \
  do {                                                                                         \
    const ncclResult_t snap_nccl_rc_ = call(__VA_ARGS__);                                      \
    if (snap_nccl_rc_ != ncclSuccess && snap_nccl_rc_ != ncclInProgress)                       \
      return give_up(#call, std::string("failed: ") + nccl_failure(#call, snap_nccl_rc_, comm_).message()); \
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
    if (aborted_) return;  // ncclCommAbort freed it
    ncclCommFinalize(comm_);
    ncclResult_t state = ncclInProgress;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (state == ncclInProgress && Clock::now() < deadline) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  const char* backend_name() const override { return "nccl"; }

  [[noreturn]] void abort_job(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "snapserve: rank %d aborting the job: %s\n", world().rank(), message.c_str());
    std::fflush(stderr);
    if (!aborted_) ncclCommAbort(comm_);
    std::_Exit(exit_code);
  }

 protected:
  Status do_all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    if (count == 0) return Status();
    SNAP_RETURN_IF_ERROR(usable("all_reduce_sum"));
    const int p = group_size(), me = group_rank();
    const int64_t elem = dtype_size(dtype);
    const std::vector<RankChunk> chunks = rank_chunks(count, p);
    const int64_t widest = chunks[0].length;  // the first chunks are the longest
    SNAP_RETURN_IF_ERROR(reserve_scratch(static_cast<size_t>(p * widest * elem)));
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    auto* base = static_cast<uint8_t*>(buf);
    auto* slots = static_cast<uint8_t*>(scratch_);  // [p, widest]: slot r = rank r's copy of my chunk
    const auto deadline = step_deadline();
    // Reduce-scatter: my chunk's P copies into the slots, then summed in rank order into buf.
    const RankChunk mine = chunks[me];
    if (mine.length > 0) {
      SNAP_CUDA_CALL(cudaMemcpyAsync, slots + me * widest * elem, base + mine.offset * elem, mine.length * elem,
                     cudaMemcpyDeviceToDevice, cudaStreamLegacy);
    }
    if (p > 1) {
      SNAP_RETURN_IF_ERROR(group_start("all_reduce_sum", deadline));
      for (int r = 0; r < p; ++r) {
        if (r == me) continue;
        if (chunks[r].length > 0)
          SNAP_NCCL_CALL(ncclSend, base + chunks[r].offset * elem, chunks[r].length * elem, ncclUint8, r, comm_,
                         cudaStreamLegacy);
        if (mine.length > 0)
          SNAP_NCCL_CALL(ncclRecv, slots + r * widest * elem, mine.length * elem, ncclUint8, r, comm_, cudaStreamLegacy);
      }
      SNAP_RETURN_IF_ERROR(group_end("all_reduce_sum", deadline));
    }
    if (mine.length > 0) {
      SNAP_CUDA_CALL(detail::nccl_sum_blocks_rank_order, slots, p, widest, mine.length, sum_type(dtype),
                     base + mine.offset * elem, cudaStreamLegacy);
    }
    // All-gather: my finished chunk to every rank, theirs into place.
    if (p > 1) {
      SNAP_RETURN_IF_ERROR(group_start("all_reduce_sum", deadline));
      for (int r = 0; r < p; ++r) {
        if (r == me) continue;
        if (mine.length > 0)
          SNAP_NCCL_CALL(ncclSend, base + mine.offset * elem, mine.length * elem, ncclUint8, r, comm_, cudaStreamLegacy);
        if (chunks[r].length > 0)
          SNAP_NCCL_CALL(ncclRecv, base + chunks[r].offset * elem, chunks[r].length * elem, ncclUint8, r, comm_,
                         cudaStreamLegacy);
      }
      SNAP_RETURN_IF_ERROR(group_end("all_reduce_sum", deadline));
    }
    return wait_stream("all_reduce_sum", deadline);
  }

  Status do_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (count == 0) return Status();
    SNAP_RETURN_IF_ERROR(usable("all_gather"));
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    const auto deadline = step_deadline();
    SNAP_NCCL_CALL(ncclAllGather, send, recv, count, nccl_type(dtype), comm_, cudaStreamLegacy);
    SNAP_RETURN_IF_ERROR(settle("all_gather", deadline));
    return wait_stream("all_gather", deadline);
  }

  Status do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
    if (count == 0) return Status();
    SNAP_RETURN_IF_ERROR(usable("broadcast"));
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    SNAP_NCCL_CALL(ncclBroadcast, buf, buf, count, nccl_type(dtype), root, comm_, cudaStreamLegacy);
    SNAP_RETURN_IF_ERROR(settle("broadcast", Clock::time_point::max()));
    return wait_stream("broadcast", Clock::time_point::max());
  }

  // Host bytes (step plans, token ids): staged through a device buffer, since NCCL moves
  // device memory. No deadline: a worker may wait here for an idle leader's next request.
  Status do_broadcast_bytes(void* buf, int64_t num_bytes, int root) override {
    if (num_bytes == 0) return Status();
    SNAP_RETURN_IF_ERROR(usable("broadcast_bytes"));
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    if (host_staging_bytes_ < static_cast<size_t>(num_bytes)) {
      if (host_staging_ != nullptr) cudaFree(host_staging_);
      host_staging_ = nullptr;
      host_staging_bytes_ = 0;
      SNAP_CUDA_CALL(cudaMalloc, &host_staging_, num_bytes);
      host_staging_bytes_ = num_bytes;
    }
    if (group_rank() == root) SNAP_CUDA_CALL(cudaMemcpy, host_staging_, buf, num_bytes, cudaMemcpyHostToDevice);
    SNAP_NCCL_CALL(ncclBroadcast, host_staging_, host_staging_, num_bytes, ncclUint8, root, comm_, cudaStreamLegacy);
    SNAP_RETURN_IF_ERROR(settle("broadcast_bytes", Clock::time_point::max()));
    SNAP_RETURN_IF_ERROR(wait_stream("broadcast_bytes", Clock::time_point::max()));
    SNAP_CUDA_CALL(cudaMemcpy, buf, host_staging_, num_bytes, cudaMemcpyDeviceToHost);
    return Status();
  }

  // NCCL has no barrier: an all-reduce of one float is one.
  Status do_barrier() override {
    SNAP_RETURN_IF_ERROR(usable("barrier"));
    SNAP_RETURN_IF_ERROR(reserve_scratch(sizeof(float) * group_size()));
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    const auto deadline = step_deadline();
    SNAP_NCCL_CALL(ncclAllReduce, scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, cudaStreamLegacy);
    SNAP_RETURN_IF_ERROR(settle("barrier", deadline));
    return wait_stream("barrier", deadline);
  }

 private:
  using Clock = std::chrono::steady_clock;

  Status usable(const char* op) const {
    if (!aborted_) return Status();
    return unavailable(std::string("comm/nccl: rank ") + std::to_string(world().rank()) + ": " + op +
                               " after the communicator was aborted (" + abort_reason_ + ")");
  }

  // Ends the communicator: later calls fail at once, the other ranks' pending operations
  // with this one fail too (NCCL propagates the abort), and no wait outlives its deadline.
  Status give_up(const char* op, const std::string& why) {
    abort_reason_ = why;
    if (!aborted_) ncclCommAbort(comm_);
    aborted_ = true;
    return internal_error(std::string("comm/nccl: rank ") + std::to_string(world().rank()) + ": " + op + " " + why +
                          "; communicator aborted");
  }

  std::string waited_text() const {
    char text[112];
    std::snprintf(text, sizeof text, "did not finish within %.0f s (%s): another rank died or hangs",
                  collective_timeout().count() / 1000.0, collective_timeout_flag());
    return text;
  }
  // The deadline of a collective inside a step: the armed timeout from now, or none.
  Clock::time_point step_deadline() const {
    const auto t = collective_timeout();
    return t.count() > 0 ? Clock::now() + t : Clock::time_point::max();
  }

  // A non-blocking communicator's calls may return ncclInProgress: poll until NCCL settles.
  Status settle(const char* op, Clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return give_up(op, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r));
      if (state == ncclSuccess) return Status();
      if (state != ncclInProgress) return give_up(op, std::string("failed: ") + ncclGetErrorString(state));
      if (Clock::now() >= deadline) return give_up(op, waited_text());
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  Status group_start(const char* op, Clock::time_point deadline) {
    const ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess && r != ncclInProgress) return give_up(op, std::string("ncclGroupStart: ") + ncclGetErrorString(r));
    return settle(op, deadline);
  }
  Status group_end(const char* op, Clock::time_point deadline) {
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) return give_up(op, std::string("ncclGroupEnd: ") + ncclGetErrorString(r));
    return settle(op, deadline);
  }

  // The queued work on the legacy stream, done — or an NCCL error / the deadline first.
  Status wait_stream(const char* op, Clock::time_point deadline) {
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaStreamQuery(cudaStreamLegacy);
      if (e == cudaSuccess) return Status();
      if (e != cudaErrorNotReady) return give_up(op, std::string("cudaStreamQuery: ") + cudaGetErrorString(e));
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
        return give_up(op, std::string("failed: ") + ncclGetErrorString(state));
      if (Clock::now() >= deadline) return give_up(op, waited_text());
      // Spin first (a decode step's all-reduce takes ~10-30 us), then yield the core.
      if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Status reserve_scratch(size_t bytes) {
    if (scratch_bytes_ >= bytes) return Status();
    SNAP_CUDA_CALL(cudaSetDevice, device_);
    SNAP_CUDA_CALL(cudaStreamSynchronize, cudaStreamLegacy);  // queued work may still read it
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    SNAP_CUDA_CALL(cudaMalloc, &scratch_, bytes);
    scratch_bytes_ = bytes;
    return Status();
  }

  const int device_;
  ncclComm_t comm_;
  bool aborted_ = false;
  std::string abort_reason_;
  void* scratch_ = nullptr;  // [P, widest chunk] reduce-scatter slots (barrier: P floats)
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
      SNAP_RETURN_IF_ERROR(mpi_broadcast_from_rank0(&id, sizeof id, options.rendezvous_timeout));
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
  // Non-blocking, so that no wait on a dead peer outlives a deadline (see the top of the file).
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world.size(), id, world.rank(), &config);
  if (r != ncclSuccess && r != ncclInProgress) return nccl_failure("ncclCommInitRankConfig", r, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + options.rendezvous_timeout;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
    if (state == ncclSuccess) break;
    if (state != ncclInProgress || std::chrono::steady_clock::now() >= deadline) {
      const Status failed = state != ncclInProgress
                                ? nccl_failure("ncclCommInitRankConfig", state, comm)
                                : internal_error("comm/nccl: rank " + std::to_string(world.rank()) +
                                                 ": ncclCommInitRankConfig did not finish within the rendezvous "
                                                 "timeout: another rank died or never joined");
      ncclCommAbort(comm);
      return failed;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(world, device, comm));
}

}  // namespace detail
}  // namespace snap::comm
