// Communicator base: argument checks, byte counters, and the host rank-order sum shared
// by the host backends (see comm/communicator.h for the order and counter definitions).
#include "comm/communicator.h"

#include <cstring>

namespace snap::comm {

namespace {

bool is_collective_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

inline float load_f32(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

inline void store_f32(void* p, int64_t i, DType t, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    default: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
  }
}

}  // namespace

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce_sum: return "all_reduce_sum";
    case CommOp::all_gather: return "all_gather";
    case CommOp::broadcast: return "broadcast";
    case CommOp::barrier: return "barrier";
  }
  return "?";
}

int64_t CommStats::total_bytes() const {
  int64_t total = 0;
  for (const CommOpStats& s : ops) total += s.bytes;
  return total;
}

namespace {

// One dtype per instantiation so the inner loops carry no switch (the f32 loop
// vectorises across i; the order over r is untouched).
template <DType T>
void sum_blocks_typed(const uint8_t* base, int num_blocks, int64_t stride, int64_t count, void* out) {
  const int64_t elem = dtype_size(T);
  for (int64_t i = 0; i < count; ++i) {
    float acc = load_f32(base, i, T);
    for (int r = 1; r < num_blocks; ++r) acc += load_f32(base + r * stride * elem, i, T);
    store_f32(out, i, T, acc);
  }
}

template <DType T>
void sum_pair_typed(const uint8_t* first, const uint8_t* second, int64_t count, void* out) {
  for (int64_t i = 0; i < count; ++i) {
    float acc = load_f32(first, i, T);  // as sum_blocks_typed with two blocks
    acc += load_f32(second, i, T);
    store_f32(out, i, T, acc);
  }
}

}  // namespace

void sum_pair_in_rank_order(const void* first, const void* second, int64_t count, DType dtype, void* out) {
  const auto* a = static_cast<const uint8_t*>(first);
  const auto* b = static_cast<const uint8_t*>(second);
  switch (dtype) {
    case DType::f32: return sum_pair_typed<DType::f32>(a, b, count, out);
    case DType::bf16: return sum_pair_typed<DType::bf16>(a, b, count, out);
    case DType::f16: return sum_pair_typed<DType::f16>(a, b, count, out);
    default: CHECK(false) << "sum_pair_in_rank_order on " << dtype_name(dtype);
  }
}

std::vector<RankChunk> rank_chunks(int64_t count, int group_size) {
  CHECK(group_size > 0 && count >= 0) << "rank_chunks(" << count << ", " << group_size << ")";
  std::vector<RankChunk> out(static_cast<size_t>(group_size));
  int64_t offset = 0;
  for (int r = 0; r < group_size; ++r) {
    out[r] = {offset, count / group_size + (r < count % group_size ? 1 : 0)};
    offset += out[r].length;
  }
  return out;
}

void sum_blocks_in_rank_order(const void* blocks, int num_blocks, int64_t stride, int64_t count, DType dtype,
                              void* out) {
  const auto* base = static_cast<const uint8_t*>(blocks);
  switch (dtype) {
    case DType::f32: return sum_blocks_typed<DType::f32>(base, num_blocks, stride, count, out);
    case DType::bf16: return sum_blocks_typed<DType::bf16>(base, num_blocks, stride, count, out);
    case DType::f16: return sum_blocks_typed<DType::f16>(base, num_blocks, stride, count, out);
    default: CHECK(false) << "sum_blocks_in_rank_order on " << dtype_name(dtype);
  }
}

Status Communicator::check_buffer(const char* op, const void* buf, int64_t count, DType dtype) const {
  if (!is_collective_dtype(dtype)) {
    return invalid_argument(std::string("comm: ") + op + " on dtype " + dtype_name(dtype) +
                            "; only f32, bf16 and f16 are supported");
  }
  if (count < 0) return invalid_argument(std::string("comm: ") + op + " with negative count " + std::to_string(count));
  if (count > 0 && buf == nullptr) {
    return invalid_argument(std::string("comm: ") + op + " of " + std::to_string(count) + " elements on a null buffer");
  }
  return Status();
}

Status Communicator::check_root(const char* op, int root) const {
  if (root < 0 || root >= group_size()) {
    return invalid_argument(std::string("comm: ") + op + " root " + std::to_string(root) + " is outside the group [0, " +
                            std::to_string(group_size()) + ")");
  }
  return Status();
}

void Communicator::record(CommOp op, int64_t bytes, std::chrono::steady_clock::time_point start) {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  calls_[static_cast<int>(op)].fetch_add(1, std::memory_order_relaxed);
  bytes_[static_cast<int>(op)].fetch_add(bytes, std::memory_order_relaxed);
  nanos_[static_cast<int>(op)].fetch_add(ns, std::memory_order_relaxed);
}

Status Communicator::all_reduce_sum(void* buf, int64_t count, DType dtype) {
  SNAP_RETURN_IF_ERROR(check_buffer("all_reduce_sum", buf, count, dtype));
  const auto start = std::chrono::steady_clock::now();
  SNAP_RETURN_IF_ERROR(do_all_reduce_sum(buf, count, dtype));
  record(CommOp::all_reduce_sum, count * dtype_size(dtype), start);
  return Status();
}

Status Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  SNAP_RETURN_IF_ERROR(check_buffer("all_gather", send, count, dtype));
  SNAP_RETURN_IF_ERROR(check_buffer("all_gather", recv, count, dtype));
  const auto start = std::chrono::steady_clock::now();
  SNAP_RETURN_IF_ERROR(do_all_gather(send, recv, count, dtype));
  record(CommOp::all_gather, count * dtype_size(dtype), start);
  return Status();
}

Status Communicator::broadcast(void* buf, int64_t count, DType dtype, int root) {
  SNAP_RETURN_IF_ERROR(check_buffer("broadcast", buf, count, dtype));
  SNAP_RETURN_IF_ERROR(check_root("broadcast", root));
  const auto start = std::chrono::steady_clock::now();
  SNAP_RETURN_IF_ERROR(do_broadcast(buf, count, dtype, root));
  record(CommOp::broadcast, count * dtype_size(dtype), start);
  broadcast_arrived();
  return Status();
}

Status Communicator::broadcast_bytes(void* buf, int64_t num_bytes, int root) {
  if (num_bytes < 0) return invalid_argument("comm: broadcast_bytes with negative size " + std::to_string(num_bytes));
  if (num_bytes > 0 && buf == nullptr) return invalid_argument("comm: broadcast_bytes on a null buffer");
  SNAP_RETURN_IF_ERROR(check_root("broadcast_bytes", root));
  const auto start = std::chrono::steady_clock::now();
  SNAP_RETURN_IF_ERROR(do_broadcast_bytes(buf, num_bytes, root));
  record(CommOp::broadcast, num_bytes, start);
  broadcast_arrived();
  return Status();
}

void Communicator::broadcast_arrived() {
  BroadcastBound first = BroadcastBound::load;
  broadcast_bound_.compare_exchange_strong(first, BroadcastBound::step);
}

Status Communicator::broadcast_message(std::vector<uint8_t>& bytes, int root, const char* what) {
  int64_t size = group_rank() == root ? static_cast<int64_t>(bytes.size()) : 0;
  SNAP_RETURN_IF_ERROR(broadcast_bytes(&size, sizeof size, root));
  if (size <= 0 || size > (int64_t{1} << 32)) return data_loss(std::string(what) + " of " + std::to_string(size) + " bytes");
  bytes.resize(static_cast<size_t>(size));
  return broadcast_bytes(bytes.data(), size, root);
}

Status Communicator::barrier() {
  const auto start = std::chrono::steady_clock::now();
  SNAP_RETURN_IF_ERROR(do_barrier());
  record(CommOp::barrier, 0, start);
  return Status();
}

CommStats Communicator::stats() const {
  CommStats s;
  for (int i = 0; i < k_num_comm_ops; ++i) {
    s.ops[i].calls = calls_[i].load(std::memory_order_relaxed);
    s.ops[i].bytes = bytes_[i].load(std::memory_order_relaxed);
    s.ops[i].seconds = nanos_[i].load(std::memory_order_relaxed) * 1e-9;
  }
  return s;
}

void Communicator::reset_stats() {
  for (int i = 0; i < k_num_comm_ops; ++i) {
    calls_[i].store(0, std::memory_order_relaxed);
    bytes_[i].store(0, std::memory_order_relaxed);
    nanos_[i].store(0, std::memory_order_relaxed);
  }
}

}  // namespace snap::comm
