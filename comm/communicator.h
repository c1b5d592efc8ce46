// Communicator: collectives over the ranks of one tensor-parallel group (the whole world
// when tp_size == size). Buffers are `count` elements of f32, bf16 or f16, host memory for
// the single and MPI backends, device memory for NCCL. Every call returns a Status; bad
// arguments fail on the calling rank before any traffic. Calls are collective: every rank
// of the group makes the same calls in the same order from one thread at a time.
//
// Reduction order (the invariant that makes TP runs reproducible): all_reduce_sum computes,
// for every element i, ((x_0[i] + x_1[i]) + x_2[i]) + ... + x_{P-1}[i] in f32, in group-rank
// order, starting from rank 0's value; bf16/f16 inputs are widened to f32 and the sum is
// rounded to the buffer's type once, at the end (round to nearest even). Every backend
// produces exactly these bits on every rank, independent of timing and algorithm.
//
// Byte counters: for each collective type, the payload bytes this rank handed to it, i.e.
// count × element size per successful call (all_gather: this rank's send block, not the
// gathered result; broadcast: counted on every rank, root or not; barrier: 0 bytes). They
// count what the model asks to exchange, not the wire traffic of the algorithm underneath,
// so "2 all-reduces × layers × tokens × hidden × bytes" checks against all_reduce_sum.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/world.h"
#include "common/dtype.h"
#include "common/status.h"

namespace snap::comm {

enum class CommOp : uint8_t { all_reduce_sum, all_gather, broadcast, barrier };
inline constexpr int k_num_comm_ops = 4;
const char* comm_op_name(CommOp op);

struct CommOpStats {
  int64_t calls = 0;
  int64_t bytes = 0;     // payload bytes handed to the collective by this rank (see above)
  double seconds = 0;    // wall time inside successful calls, waiting for other ranks included
};

struct CommStats {
  std::array<CommOpStats, k_num_comm_ops> ops{};
  const CommOpStats& operator[](CommOp op) const { return ops[static_cast<int>(op)]; }
  int64_t total_bytes() const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  World world() const { return world_; }
  // Ranks taking part in the collectives: world().tp_size().
  int group_size() const { return world_.tp_size(); }
  int group_rank() const { return world_.tp_rank(); }
  virtual const char* backend_name() const = 0;

  // In place: buf[count] becomes the rank-order sum over the group (see top of file).
  Status all_reduce_sum(void* buf, int64_t count, DType dtype);
  // recv[group_size × count]: block r (at r × count) is group rank r's send[count].
  Status all_gather(const void* send, void* recv, int64_t count, DType dtype);
  // buf[count] on every rank becomes group rank `root`'s buf.
  Status broadcast(void* buf, int64_t count, DType dtype, int root);
  // Raw bytes from group rank `root` (step plans, token ids); counted as broadcast bytes.
  // Host memory on every backend.
  Status broadcast_bytes(void* buf, int64_t num_bytes, int root);
  // Returns once every rank of the group has entered it.
  Status barrier();
  // A message of any size from group rank `root` (step plans, request headers): its size,
  // then its bytes, both by broadcast_bytes. Elsewhere `bytes` is resized to it; a size <= 0
  // or above 4 GiB is data_loss "<what> of N bytes".
  Status broadcast_message(std::vector<uint8_t>& bytes, int root, const char* what);

  // Typed conveniences for host f32 buffers.
  Status all_reduce_sum(std::span<float> buf) { return all_reduce_sum(buf.data(), buf.size(), DType::f32); }
  Status broadcast(std::span<float> buf, int root) { return broadcast(buf.data(), buf.size(), DType::f32, root); }

  // Ends every process of the job (not only this group) after printing `message` with
  // this rank's id to stderr. For a rank that cannot go on: the others would otherwise
  // wait for it in the next collective. Backends without a job launcher exit this process.
  [[noreturn]] virtual void abort_job(const std::string& message, int exit_code = 1) = 0;

  // Counters may be read from another thread (metrics) while collectives run.
  CommStats stats() const;
  void reset_stats();
  // Bytes this rank has put on the wire to each group rank ([r], message headers included)
  // where the backend sees them (TCP); empty elsewhere. For checking a topology's traffic;
  // read it from the thread that runs the collectives.
  virtual std::vector<int64_t> wire_bytes_sent() const { return {}; }

  // No silent hang: once armed, all_reduce_sum, all_gather and barrier (the collectives inside
  // a step, where every rank is busy alike) wait at most `timeout` for the other ranks; then
  // the call fails, naming the rank(s) waited for where the backend knows them, and the
  // communicator is broken (a later call fails at once). Broadcasts do not time out unless
  // bound_broadcasts() was called. Configured at construction (CommOptions::collective_timeout,
  // --collective-timeout; CommOptions::load_timeout, --load-timeout). agree_on_load arms the
  // load timeout for its own all-reduce (a rank still reading its shard, or stuck reading it, is
  // waited for that long), then the collective timeout once every rank has loaded, so a slow
  // load is not mistaken for a hang. Enforced by the TCP, MPI and NCCL backends; 0 means no limit.
  void set_collective_timeout(std::chrono::milliseconds timeout) { configured_timeout_ms_ = timeout.count(); }
  void set_load_timeout(std::chrono::milliseconds timeout) { load_timeout_ms_ = timeout.count(); }
  void arm_load_timeout() {
    armed_flag_.store(k_load_timeout_flag);
    armed_timeout_ms_.store(load_timeout_ms_);
  }
  void arm_collective_timeout() {
    armed_flag_.store(k_collective_timeout_flag);
    armed_timeout_ms_.store(configured_timeout_ms_);
  }
  std::chrono::milliseconds collective_timeout() const { return std::chrono::milliseconds(armed_timeout_ms_.load()); }
  // The flag that set collective_timeout(), for messages: "--collective-timeout" or "--load-timeout".
  const char* collective_timeout_flag() const { return armed_flag_.load(); }

  // How long a rank receiving a broadcast waits for the root. `none` (the default): for ever.
  // A worker rank follows rank 0's plans, and rank 0 sends one every step and, when idle, at
  // least once a second (the engines' rank reports), so a worker bounds its waits: `load` waits
  // --load-timeout for the first broadcast (rank 0 still loads its tokenizer and reads the
  // prompt after agree_on_load) and turns into `step` once one has arrived; `step` waits the
  // armed collective timeout: a leader that stops or hangs ends the job ("broadcast waited ...
  // for rank 0") instead of leaving its workers waiting for ever. TCP and MPI (NCCL carries no
  // broadcasts).
  enum class BroadcastBound : uint8_t { none, load, step };
  void bound_broadcasts(BroadcastBound bound = BroadcastBound::load) { broadcast_bound_.store(bound); }
  std::chrono::milliseconds broadcast_timeout() const {
    switch (broadcast_bound_.load()) {
      case BroadcastBound::load: return std::chrono::milliseconds(load_timeout_ms_);
      case BroadcastBound::step: return collective_timeout();
      case BroadcastBound::none: break;
    }
    return std::chrono::milliseconds(0);
  }
  const char* broadcast_timeout_flag() const {
    return broadcast_bound_.load() == BroadcastBound::load ? k_load_timeout_flag : collective_timeout_flag();
  }

 protected:
  explicit Communicator(World world) : world_(world) {}

  // Arguments are validated (dtype f32/bf16/f16, count >= 0, non-null when count > 0,
  // root in range, count × element size fits the backend's limits) before these run.
  virtual Status do_all_reduce_sum(void* buf, int64_t count, DType dtype) = 0;
  virtual Status do_all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual Status do_broadcast(void* buf, int64_t count, DType dtype, int root) = 0;
  virtual Status do_broadcast_bytes(void* buf, int64_t num_bytes, int root) = 0;
  virtual Status do_barrier() = 0;

 private:
  Status check_buffer(const char* op, const void* buf, int64_t count, DType dtype) const;
  Status check_root(const char* op, int root) const;
  void record(CommOp op, int64_t bytes, std::chrono::steady_clock::time_point start);
  // After a broadcast that arrived: BroadcastBound::load turns into step.
  void broadcast_arrived();

  const World world_;
  std::array<std::atomic<int64_t>, k_num_comm_ops> calls_{};
  std::array<std::atomic<int64_t>, k_num_comm_ops> bytes_{};
  std::array<std::atomic<int64_t>, k_num_comm_ops> nanos_{};
  static constexpr const char* k_collective_timeout_flag = "--collective-timeout";
  static constexpr const char* k_load_timeout_flag = "--load-timeout";
  int64_t configured_timeout_ms_ = 0;
  int64_t load_timeout_ms_ = 0;
  std::atomic<int64_t> armed_timeout_ms_{0};
  std::atomic<const char*> armed_flag_{k_collective_timeout_flag};
  std::atomic<BroadcastBound> broadcast_bound_{BroadcastBound::none};
};

// The owner of each chunk in the two-round all-reduce (reduce-scatter, then all-gather) of
// the MPI and NCCL backends: group rank r owns elements [offset, offset + length), count / p
// of them, the first count % p ranks one more. Chunks are consecutive, in rank order.
struct RankChunk {
  int64_t offset = 0;
  int64_t length = 0;
};
std::vector<RankChunk> rank_chunks(int64_t count, int group_size);

// Host reference of the documented order, used by the host backends: out[i] =
// round(sum over r in 0..num_blocks-1 of blocks[r × stride + i]) with an f32 accumulator.
// `out` may alias block 0.
void sum_blocks_in_rank_order(const void* blocks, int num_blocks, int64_t stride, int64_t count, DType dtype,
                              void* out);
// The same with two blocks anywhere in memory (rank 0's `first`); `out` may alias either.
void sum_pair_in_rank_order(const void* first, const void* second, int64_t count, DType dtype, void* out);

}  // namespace snap::comm
