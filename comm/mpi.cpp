// MPI backend (host buffers; written against Debian's OpenMPI 4.1). MPI is initialised on
// first use (MPI_THREAD_SERIALIZED: one thread at a time may call) and finalised at exit if
// we initialised it. Each communicator is a duplicate (or tp split) of MPI_COMM_WORLD with
// MPI_ERRORS_RETURN, so MPI failures come back as Status instead of killing the process.
//
// A rank that dies: OpenMPI's mpirun notices the exit (signal or exit without
// MPI_Finalize) and kills every other rank of the job, printing "mpirun noticed that
// process rank R ... exited on signal 9" and exiting non-zero; survivors are killed while
// they wait in a collective, so no rank hangs (tests/comm/test_comm_fault.cpp measures it).
//
// A rank that hangs without dying (SIGSTOP, a stuck device, a partition): MPI has no
// timeout on its collectives, so the all-reduce, all-gather and barrier are written here as
// non-blocking point-to-point transfers with every peer, polled against the armed collective
// timeout (Communicator::collective_timeout). At the deadline the call fails naming the
// ranks whose transfers did not finish ("comm/mpi: rank 0: all_reduce_sum waited 2.0 s for
// rank 1 (--collective-timeout 2 s): it died or hangs") and the communicator is broken. In the
// second round of a large all-reduce that may include a live rank still stuck in the first
// (waiting for the hung one too); a rank in the first round, or with every live rank in the
// second, names only the hung ones, so at least one rank's message does.
// MPI cannot take back a transfer a collective has begun, nor finalize while a rank of the
// job hangs (MPI_Finalize waits for every rank), so once any communicator broke, this
// process ends the job at exit with MPI_Abort instead of MPI_Finalize: mpirun then kills the
// hung rank too. The traffic is that of the collectives they replace (see do_all_reduce_sum).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// Set once a communicator fails (a timed-out collective): MPI_Finalize would wait for the
// rank that hangs, so the process ends the job at exit instead.
std::atomic<bool> g_job_broken{false};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_job_broken.load()) {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
}

// The deadline of one polled wait: `limit` from its start, none when 0. A gap of over 1 s
// between two polls means this process itself was not running (stopped, then continued):
// that time is not the peers' to answer for, so it moves the deadline on.
class PollDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  PollDeadline(std::chrono::milliseconds limit, const char* flag)
      : limit_(limit), flag_(flag), start_(Clock::now()), last_(start_),
        deadline_(limit.count() > 0 ? start_ + limit : Clock::time_point::max()) {}
  // Called at every poll.
  bool passed() {
    const Clock::time_point now = Clock::now();
    if (now - last_ > std::chrono::seconds(1) && deadline_ != Clock::time_point::max()) deadline_ += now - last_;
    last_ = now;
    return now >= deadline_;
  }
  std::chrono::milliseconds limit() const { return limit_; }
  const char* flag() const { return flag_; }  // the flag that set the limit, for messages
  Clock::time_point start() const { return start_; }

 private:
  const std::chrono::milliseconds limit_;
  const char* const flag_;
  const Clock::time_point start_;
  Clock::time_point last_, deadline_;
};

// Polls `req` until it completes (*done true) or `deadline` passes (*done false; an MPI
// collective cannot be cancelled, so the request is left to MPI_Abort at exit). Spins for the
// first 200 µs (a decode step's plan arrives well within that), then sleeps between polls,
// backing off to 1 ms: a rank waiting for an idle leader does not spin a core.
Status poll_request(MPI_Request* req, PollDeadline& deadline, bool* done) {
  const auto spin_until = deadline.start() + std::chrono::microseconds(200);
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    int flag = 0;
    SNAP_MPI_CALL(MPI_Test, req, &flag, MPI_STATUS_IGNORE);
    *done = flag != 0;
    if (*done || deadline.passed()) return Status();
    if (PollDeadline::Clock::now() < spin_until) continue;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

// Point-to-point tags of the collectives written here (apart from MPI's own collectives,
// which match in a separate context). Messages between two ranks with one tag arrive in
// order, and every rank runs the collectives in the same order, so a tag per phase suffices.
constexpr int k_tag_reduce_scatter = 701;
constexpr int k_tag_all_gather = 702;
constexpr int k_tag_barrier = 703;

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
    // A broken communicator may still have transfers in flight: leave it to MPI_Abort.
    if (!finalized && comm_ != MPI_COMM_NULL && failed_.ok()) MPI_Comm_free(&comm_);
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
  //  - small (<= small_all_reduce_bytes_): every buffer to every rank (an all-gather), each
  //    sums locally. One round; each rank receives (P-1)·n bytes. A decode step's 576 f32
  //    (2.3 KB) is latency-bound, so one round beats two.
  //  - large: rank r owns chunk r (count/P elements, the first count%P chunks one longer).
  //    Each chunk goes to its owner, the owner sums the P copies in rank order, and the
  //    finished chunks go back to every rank. Each rank sends 2(P-1)/P·n bytes, the same as
  //    a ring all-reduce, versus (P-1)·n for the gather path (4x more at P=8 for a 1.2 MB
  //    prefill chunk). Partial sums never travel, so bf16 rounds once.
  // Both are point-to-point transfers with every peer at once, bounded by the collective
  // timeout (see the top of the file).
  Status do_all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    SNAP_RETURN_IF_ERROR(failed_);
    const int p = group_size();
    const int64_t elem = dtype_size(dtype);
    const int64_t bytes = count * elem;
    SNAP_RETURN_IF_ERROR(check_int_bytes("all_reduce_sum", bytes));
    if (count == 0 || p == 1) return Status();
    uint8_t* data = static_cast<uint8_t*>(buf);
    const int me = group_rank();
    if (bytes <= small_all_reduce_bytes_ || count < p) {
      scratch_.resize(static_cast<size_t>(p) * bytes);
      SNAP_RETURN_IF_ERROR(gather_blocks(data, scratch_.data(), bytes, CommOp::all_reduce_sum));
      sum_blocks_in_rank_order(scratch_.data(), p, count, count, dtype, buf);
      return Status();
    }
    const std::vector<RankChunk> chunks = rank_chunks(count, p);
    const int64_t my_len = chunks[me].length;
    const int64_t my_bytes = my_len * elem;
    scratch_.resize(static_cast<size_t>(p) * my_bytes);
    // Reduce-scatter: chunk r of every rank to rank r; this rank's own copy lands in slot me.
    std::vector<Transfer> ts;
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      SNAP_RETURN_IF_ERROR(post(ts, false, scratch_.data() + r * my_bytes, my_bytes, r, k_tag_reduce_scatter));
      SNAP_RETURN_IF_ERROR(post(ts, true, data + chunks[r].offset * elem, chunks[r].length * elem, r,
                                k_tag_reduce_scatter));
    }
    std::memcpy(scratch_.data() + me * my_bytes, data + chunks[me].offset * elem, static_cast<size_t>(my_bytes));
    SNAP_RETURN_IF_ERROR(wait(ts, CommOp::all_reduce_sum));
    sum_blocks_in_rank_order(scratch_.data(), p, my_len, my_len, dtype, data + chunks[me].offset * elem);
    // All-gather of the finished chunks (the sends above are complete: buf is free to fill).
    for (int r = 0; r < p; ++r) {
      if (r == me) continue;
      SNAP_RETURN_IF_ERROR(post(ts, false, data + chunks[r].offset * elem, chunks[r].length * elem, r,
                                k_tag_all_gather));
      SNAP_RETURN_IF_ERROR(post(ts, true, data + chunks[me].offset * elem, my_bytes, r, k_tag_all_gather));
    }
    return wait(ts, CommOp::all_reduce_sum);
  }

  Status do_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    SNAP_RETURN_IF_ERROR(failed_);
    const int64_t bytes = count * dtype_size(dtype);
    SNAP_RETURN_IF_ERROR(check_int_bytes("all_gather", bytes * group_size()));
    if (count == 0) return Status();
    return gather_blocks(static_cast<const uint8_t*>(send), static_cast<uint8_t*>(recv), bytes, CommOp::all_gather);
  }

  Status do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
    return do_broadcast_bytes(buf, count * dtype_size(dtype), root);
  }

  // Worker ranks wait here for rank 0's next step plan, which may be seconds away when a
  // server is idle. MPI_Bcast would spin a core the whole time (and on CPU ranks that
  // share cores, slow rank 0 down), so a receiving rank polls a non-blocking broadcast:
  // it spins for the first 200 µs (a decode step's plan arrives well within that), then
  // sleeps between polls, backing off to 1 ms. Not timed out (a worker waits here for an
  // idle leader) unless bound_broadcasts() bounds it; a broken communicator fails it at once.
  Status do_broadcast_bytes(void* buf, int64_t num_bytes, int root) override {
    SNAP_RETURN_IF_ERROR(failed_);
    SNAP_RETURN_IF_ERROR(check_int_bytes("broadcast", num_bytes));
    if (num_bytes == 0) return Status();
    // Every rank uses MPI_Ibcast: a blocking and a non-blocking collective never match.
    MPI_Request req = MPI_REQUEST_NULL;
    SNAP_MPI_CALL(MPI_Ibcast, buf, static_cast<int>(num_bytes), MPI_BYTE, root, comm_, &req);
    if (group_rank() == root) {
      SNAP_MPI_CALL(MPI_Wait, &req, MPI_STATUS_IGNORE);
      return Status();
    }
    PollDeadline deadline(broadcast_timeout(), broadcast_timeout_flag());
    bool done = false;
    SNAP_RETURN_IF_ERROR(poll_request(&req, deadline, &done));
    if (done) return Status();
    std::vector<Transfer> none;
    return fail(none, timed_out({root}, CommOp::broadcast, deadline));
  }

  // An empty message to and from every peer: no rank leaves before all have entered.
  Status do_barrier() override {
    SNAP_RETURN_IF_ERROR(failed_);
    std::vector<Transfer> ts;
    for (int r = 0; r < group_size(); ++r) {
      if (r == group_rank()) continue;
      SNAP_RETURN_IF_ERROR(post(ts, false, nullptr, 0, r, k_tag_barrier));
      SNAP_RETURN_IF_ERROR(post(ts, true, nullptr, 0, r, k_tag_barrier));
    }
    return wait(ts, CommOp::barrier);
  }

 private:
  using Clock = std::chrono::steady_clock;

  // One point-to-point transfer of a collective, and the peer it depends on.
  struct Transfer {
    MPI_Request req = MPI_REQUEST_NULL;
    int peer = 0;
  };

  Status post(std::vector<Transfer>& ts, bool send, const void* data, int64_t bytes, int peer, int tag) {
    Transfer t;
    t.peer = peer;
    const int rc = send ? MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &t.req)
                        : MPI_Irecv(const_cast<void*>(data), static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &t.req);
    if (rc != MPI_SUCCESS) return fail(ts, mpi_failure(send ? "MPI_Isend" : "MPI_Irecv", rc));
    ts.push_back(t);
    return Status();
  }

  // recv[P × bytes]: block r is rank r's `send` (this rank's copied locally).
  Status gather_blocks(const uint8_t* send, uint8_t* recv, int64_t bytes, CommOp op) {
    const int me = group_rank();
    std::vector<Transfer> ts;
    for (int r = 0; r < group_size(); ++r) {
      if (r == me) continue;
      SNAP_RETURN_IF_ERROR(post(ts, false, recv + r * bytes, bytes, r, k_tag_all_gather));
      SNAP_RETURN_IF_ERROR(post(ts, true, send, bytes, r, k_tag_all_gather));
    }
    if (recv + me * bytes != send) std::memcpy(recv + me * bytes, send, static_cast<size_t>(bytes));
    return wait(ts, op);
  }

  // Polls every transfer to completion (MPI_Test* also drives MPI's progress, as MPI_Wait
  // would), at most the armed collective timeout; `ts` is empty on return.
  Status wait(std::vector<Transfer>& ts, CommOp op) {
    PollDeadline deadline(collective_timeout(), collective_timeout_flag());
    reqs_.resize(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) reqs_[i] = ts[i].req;
    done_.resize(ts.size());
    for (;;) {
      const bool late = deadline.passed();
      int n_done = 0;
      const int rc = MPI_Testsome(static_cast<int>(reqs_.size()), reqs_.data(), &n_done, done_.data(),
                                  MPI_STATUSES_IGNORE);
      for (size_t i = 0; i < ts.size(); ++i) ts[i].req = reqs_[i];
      if (rc != MPI_SUCCESS) return fail(ts, mpi_failure("MPI_Testsome", rc));
      if (n_done == MPI_UNDEFINED) break;  // no transfer left
      if (n_done == 0 && late) return fail(ts, timed_out(pending_peers(ts), op, deadline));
    }
    ts.clear();
    return Status();
  }

  // "comm/mpi: rank 0: all_reduce_sum waited 2.0 s for rank 1 (--collective-timeout 2 s): it died or hangs"
  Status timed_out(const std::vector<int>& peers, CommOp op, const PollDeadline& deadline) const {
    const std::chrono::milliseconds limit = deadline.limit();
    std::string who = peers.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < peers.size(); ++i) who += (i ? ", " : "") + std::to_string(peers[i]);
    char secs[112];
    std::snprintf(secs, sizeof secs, "%.1f s for %s (%s %g s)",
                  std::chrono::duration<double>(Clock::now() - deadline.start()).count(), who.c_str(), deadline.flag(),
                  limit.count() / 1000.0);
    std::string text = "comm/mpi: rank ";
    text += std::to_string(group_rank());
    text += ": ";
    text += comm_op_name(op);
    text += " waited ";
    text += secs;
    text += peers.size() == 1 ? ": it died or hangs" : ": they died or hang";
    return internal_error(text);
  }

  // The ranks whose transfers have not finished, in order.
  static std::vector<int> pending_peers(const std::vector<Transfer>& ts) {
    std::vector<int> peers;
    for (const Transfer& t : ts)
      if (t.req != MPI_REQUEST_NULL && std::find(peers.begin(), peers.end(), t.peer) == peers.end())
        peers.push_back(t.peer);
    std::sort(peers.begin(), peers.end());
    return peers;
  }

  // The communicator is unusable after a failure: its transfers still in flight are
  // cancelled (receives) or released, every later call returns `s`, and the process ends
  // the job at exit (see finalize_at_exit).
  Status fail(std::vector<Transfer>& ts, Status s) {
    for (Transfer& t : ts) {
      if (t.req == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&t.req);
      MPI_Request_free(&t.req);
    }
    ts.clear();
    failed_ = s;
    g_job_broken.store(true);
    return s;
  }

  MPI_Comm comm_;
  const int64_t small_all_reduce_bytes_;
  std::vector<uint8_t> scratch_;  // [P × chunk] receive area of the all-reduce
  std::vector<MPI_Request> reqs_;  // wait()'s request array
  std::vector<int> done_;          // MPI_Testsome's completed indices
  Status failed_;                  // the first failure; ok while the communicator works
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

// Non-blocking throughout (MPI_Comm_idup, then MPI_Ibcast), each step polled against `timeout`:
// a rank 0 that failed before it (a launcher need not end the job when one rank exits) or hangs
// is named instead of hanging the others, and the job ends at exit (MPI_Abort), as after a
// timed-out collective.
Status mpi_broadcast_from_rank0(void* buf, int num_bytes, std::chrono::milliseconds timeout) {
  SNAP_RETURN_IF_ERROR(ensure_mpi_initialized());
  int rank = 0;
  SNAP_MPI_CALL(MPI_Comm_rank, MPI_COMM_WORLD, &rank);
  PollDeadline deadline(timeout, "the rendezvous timeout");
  const auto wait = [&](MPI_Request* req) -> Status {
    bool done = false;
    SNAP_RETURN_IF_ERROR(poll_request(req, deadline, &done));
    if (done) return Status();
    g_job_broken.store(true);  // the request is left to MPI_Abort at exit
    char text[160];
    std::snprintf(text, sizeof text, "comm/mpi: rank %d: the broadcast of the NCCL id waited %.1f s for rank 0 (%s, %g s): it "
                  "failed before it or hangs", rank, std::chrono::duration<double>(PollDeadline::Clock::now() - deadline.start()).count(),
                  deadline.flag(), deadline.limit().count() / 1000.0);
    return unavailable(text);
  };
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  SNAP_MPI_CALL(MPI_Comm_idup, MPI_COMM_WORLD, &comm, &req);
  SNAP_RETURN_IF_ERROR(wait(&req));
  int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Ibcast(buf, num_bytes, MPI_BYTE, 0, comm, &req);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return mpi_failure("MPI_Ibcast", rc);
  }
  SNAP_RETURN_IF_ERROR(wait(&req));
  MPI_Comm_free(&comm);
  return Status();
}

}  // namespace detail
}  // namespace snap::comm
