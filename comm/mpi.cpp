// MPI backend (host buffers; written against Debian's OpenMPI 4.1). MPI is initialised on
// first use (MPI_THREAD_SERIALIZED: one thread at a time may call) and finalised at exit if
// we initialised it. Each communicator is a duplicate (or tp split) of MPI_COMM_WORLD with
// MPI_ERRORS_RETURN, so MPI failures come back as Status instead of killing the process.
//
// A rank that dies: OpenMPI's mpirun notices the exit (signal or exit without
// MPI_Finalize) and kills every other rank of the job, printing "mpirun noticed that
// process rank R ... exited on signal 9" and exiting non-zero; survivors are killed while
// they wait in a collective, so no rank hangs (tests/comm/test_comm_fault.cpp measures it).
// A rank that hangs without dying is not detected here.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/backends.h"

namespace snap::comm {

namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

Status mpi_failure(const char* call, int code) {
  return internal_error(std::string("comm/mpi: ") + call + " failed: " + mpi_error_text(code));
}

#define SNAP_MPI_CALL(call, ...)                          \
  do {                                                    \
    const int snap_mpi_rc_ = call(__VA_ARGS__);           \
    if (snap_mpi_rc_ != MPI_SUCCESS) return mpi_failure(#call, snap_mpi_rc_); \
  } while (0)

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Status ensure_mpi_initialized() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return internal_error("comm/mpi: MPI was already finalized in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return Status();
  int provided = 0;
  SNAP_MPI_CALL(MPI_Init_thread, nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  std::atexit(finalize_at_exit);
  return Status();
}

Status check_int_bytes(const char* op, int64_t bytes) {
  if (bytes > INT_MAX) {
    return invalid_argument(std::string("comm/mpi: ") + op + " of " + std::to_string(bytes) +
                            " bytes exceeds MPI's int count (2 GiB); split the buffer");
  }
  return Status();
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(World world, MPI_Comm comm, int64_t small_all_reduce_bytes)
      : Communicator(world), comm_(comm), small_all_reduce_bytes_(small_all_reduce_bytes) {}
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  const char* backend_name() const override { return "mpi"; }

  [[noreturn]] void abort_job(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "snapserve: rank %d aborting the job: %s\n", world().rank(), message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

 protected:
  // Fixed-order all-reduce (see comm/communicator.h). MPI_Allreduce's order is up to the
  // implementation (and differs between its algorithms), so we never use it. Two paths,
  // same arithmetic (sum_blocks_in_rank_order), hence the same bits:
  //  - small (<= small_all_reduce_bytes_): MPI_Allgather every buffer to every rank, each
  //    sums locally. One round; each rank receives (P-1)·n bytes. A decode step's 576 f32
  //    (2.3 KB) is latency-bound, so one round beats two.
  //  - large: rank r owns chunk r (count/P elements, the first count%P chunks one longer).
  //    MPI_Alltoallv sends each chunk to its owner, the owner sums the P copies in rank
  //    order, MPI_Allgatherv returns the finished chunks. Each rank sends 2(P-1)/P·n bytes,
  //    the same as a ring all-reduce, versus (P-1)·n for the gather path (4x more at P=8
  //    for a 1.2 MB prefill chunk). Partial sums never travel, so bf16 rounds once.
  Status do_all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    const int p = group_size();
    const int64_t elem = dtype_size(dtype);
    const int64_t bytes = count * elem;
    SNAP_RETURN_IF_ERROR(check_int_bytes("all_reduce_sum", bytes));
    if (count == 0 || p == 1) return Status();
    if (bytes <= small_all_reduce_bytes_ || count < p) {
      scratch_.resize(static_cast<size_t>(p) * bytes);
      SNAP_MPI_CALL(MPI_Allgather, buf, static_cast<int>(bytes), MPI_BYTE, scratch_.data(), static_cast<int>(bytes),
                    MPI_BYTE, comm_);
      sum_blocks_in_rank_order(scratch_.data(), p, count, count, dtype, buf);
      return Status();
    }
    std::vector<int> chunk_bytes(p), chunk_offsets(p), recv_bytes(p), recv_offsets(p);
    const std::vector<RankChunk> chunks = rank_chunks(count, p);
    for (int r = 0; r < p; ++r) {
      chunk_bytes[r] = static_cast<int>(chunks[r].length * elem);
      chunk_offsets[r] = static_cast<int>(chunks[r].offset * elem);
    }
    const int me = group_rank();
    const int64_t my_len = chunk_bytes[me] / elem;
    for (int r = 0; r < p; ++r) {
      recv_bytes[r] = chunk_bytes[me];
      recv_offsets[r] = r * chunk_bytes[me];
    }
    scratch_.resize(static_cast<size_t>(p) * chunk_bytes[me]);
    SNAP_MPI_CALL(MPI_Alltoallv, buf, chunk_bytes.data(), chunk_offsets.data(), MPI_BYTE, scratch_.data(),
                  recv_bytes.data(), recv_offsets.data(), MPI_BYTE, comm_);
    sum_blocks_in_rank_order(scratch_.data(), p, my_len, my_len, dtype,
                             static_cast<uint8_t*>(buf) + chunk_offsets[me]);
    SNAP_MPI_CALL(MPI_Allgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, chunk_bytes.data(), chunk_offsets.data(),
                  MPI_BYTE, comm_);
    return Status();
  }

  Status do_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    const int64_t bytes = count * dtype_size(dtype);
    SNAP_RETURN_IF_ERROR(check_int_bytes("all_gather", bytes * group_size()));
    if (count == 0) return Status();
    SNAP_MPI_CALL(MPI_Allgather, send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                  comm_);
    return Status();
  }

  Status do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
    return do_broadcast_bytes(buf, count * dtype_size(dtype), root);
  }

  // Worker ranks wait here for rank 0's next step plan, which may be seconds away when a
  // server is idle. MPI_Bcast would spin a core the whole time (and on CPU ranks that
  // share cores, slow rank 0 down), so a receiving rank polls a non-blocking broadcast:
  // it spins for the first 200 µs (a decode step's plan arrives well within that), then
  // sleeps between polls, backing off to 1 ms.
  Status do_broadcast_bytes(void* buf, int64_t num_bytes, int root) override {
    SNAP_RETURN_IF_ERROR(check_int_bytes("broadcast", num_bytes));
    if (num_bytes == 0) return Status();
    // Every rank uses MPI_Ibcast: a blocking and a non-blocking collective never match.
    MPI_Request req = MPI_REQUEST_NULL;
    SNAP_MPI_CALL(MPI_Ibcast, buf, static_cast<int>(num_bytes), MPI_BYTE, root, comm_, &req);
    if (group_rank() == root) {
      SNAP_MPI_CALL(MPI_Wait, &req, MPI_STATUS_IGNORE);
      return Status();
    }
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      int done = 0;
      SNAP_MPI_CALL(MPI_Test, &req, &done, MPI_STATUS_IGNORE);
      if (done) return Status();
      if (std::chrono::steady_clock::now() < spin_until) continue;
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  Status do_barrier() override {
    SNAP_MPI_CALL(MPI_Barrier, comm_);
    return Status();
  }

 private:
  MPI_Comm comm_;
  const int64_t small_all_reduce_bytes_;
  std::vector<uint8_t> scratch_;  // [P × chunk] receive area of the all-reduce
};

}  // namespace

namespace detail {

Result<std::unique_ptr<Communicator>> make_mpi_communicator(const World& world, const CommOptions& options) {
  SNAP_RETURN_IF_ERROR(ensure_mpi_initialized());
  int mpi_rank = 0;
  int mpi_size = 0;
  SNAP_MPI_CALL(MPI_Comm_rank, MPI_COMM_WORLD, &mpi_rank);
  SNAP_MPI_CALL(MPI_Comm_size, MPI_COMM_WORLD, &mpi_size);
  if (mpi_rank != world.rank() || mpi_size != world.size()) {
    return invalid_argument("comm/mpi: World says " + world.to_string() + " but MPI_COMM_WORLD has rank " +
                            std::to_string(mpi_rank) + " of " + std::to_string(mpi_size));
  }
  MPI_Comm comm = MPI_COMM_NULL;
  if (world.tp_size() == world.size()) {
    SNAP_MPI_CALL(MPI_Comm_dup, MPI_COMM_WORLD, &comm);
  } else {
    SNAP_MPI_CALL(MPI_Comm_split, MPI_COMM_WORLD, world.tp_group(), world.tp_rank(), &comm);
  }
  const int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return mpi_failure("MPI_Comm_set_errhandler", rc);
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<MpiCommunicator>(world, comm, options.mpi_small_all_reduce_bytes));
}

Status mpi_broadcast_from_rank0(void* buf, int num_bytes) {
  SNAP_RETURN_IF_ERROR(ensure_mpi_initialized());
  MPI_Comm comm = MPI_COMM_NULL;
  SNAP_MPI_CALL(MPI_Comm_dup, MPI_COMM_WORLD, &comm);
  int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Bcast(buf, num_bytes, MPI_BYTE, 0, comm);
  MPI_Comm_free(&comm);
  if (rc != MPI_SUCCESS) return mpi_failure("MPI_Bcast", rc);
  return Status();
}

}  // namespace detail
}  // namespace snap::comm
