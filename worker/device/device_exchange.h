// DeviceExchange: what crosses GPUs in a tensor-parallel DeviceForward — the row-parallel
// all-reduce after o_proj and down_proj, and the gather of the vocab-parallel LM head's
// logits — on device buffers, over one Communicator (the tp group), in two ways:
//  - direct: an NCCL communicator takes the device pointers (one rank per GPU);
//  - host-staged: any host backend (MPI, TCP): device → pinned host buffer → the collective →
//    device. NCCL refuses two ranks on one GPU; staging lets several ranks share one, and
//    runs the same forward without NCCL.
// Both keep the communicator's rank-order sums (comm/communicator.h), so the bits are the same
// whichever way is used, and its byte counters count the payload as on the CPU.
// The all-reduce's wire type is f32 (the activations' own) or bf16 (--tp-exchange-dtype bf16):
// each rank's partial sum is rounded to bf16 once before it leaves (the sum itself is taken in
// f32, in rank order, and rounded once: the communicator's rule), halving the bytes; the result
// comes back widened to f32. The logits gather stays f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "comm/communicator.h"
#include "common/status.h"

namespace snap {

class DeviceExchange {
 public:
  // comm and the stream must outlive this object. Work queued on `stream` before a call is
  // part of the exchanged data; work queued after it sees the result.
  DeviceExchange(comm::Communicator& comm, cudaStream_t stream, DType wire = DType::f32);
  ~DeviceExchange();
  DeviceExchange(const DeviceExchange&) = delete;
  DeviceExchange& operator=(const DeviceExchange&) = delete;

  comm::Communicator& comm() const { return comm_; }
  int size() const { return comm_.group_size(); }
  int rank() const { return comm_.group_rank(); }
  // True unless the communicator moves device memory itself (NCCL).
  bool staged() const { return staged_; }

  // In place on device f32 buf[count]: the rank-order sum over the group.
  Status all_reduce(float* buf, int64_t count);
  // Device f32: recv[size × count] holds group rank r's send[count] at r × count.
  Status all_gather(const float* send, float* recv, int64_t count);
  // Pinned host bytes held for staging (0 on the direct path).
  int64_t staging_bytes() const { return host_bytes_; }
  DType wire() const { return wire_; }

 private:
  Status reserve(int64_t bytes);

  Status all_reduce_bf16(float* buf, int64_t count);

  comm::Communicator& comm_;
  cudaStream_t stream_;
  bool staged_;
  DType wire_;
  __nv_bfloat16* wire_buf_ = nullptr;  // device, the bf16 payload [largest count]
  int64_t wire_count_ = 0;
  float* host_ = nullptr;  // pinned: [size + 1, largest count] for a gather, [count] for a sum
  int64_t host_bytes_ = 0;
};

}  // namespace snap
