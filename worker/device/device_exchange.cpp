// DeviceExchange (device_exchange.h): NCCL on device pointers, or staged through pinned host
// memory for the host backends. Staging costs two PCIe copies per exchange (a decode step's
// 4096 f32 = 16 KB each way on Llama-3-8B: ~2 x 10 us), next to the collective itself.
#include "worker/device/device_exchange.h"

#include <cstring>
#include <string>

#include "kernels/cuda/kernels_cuda.h"

namespace snap {

namespace {
Status cuda_status(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return Status::ok_status();
  return internal_error(std::string("device exchange: ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

DeviceExchange::DeviceExchange(comm::Communicator& comm, cudaStream_t stream, DType wire)
    : comm_(comm), stream_(stream), staged_(std::strcmp(comm.backend_name(), "nccl") != 0), wire_(wire) {}

DeviceExchange::~DeviceExchange() {
  if (host_ != nullptr) cudaFreeHost(host_);
  if (wire_buf_ != nullptr) cudaFree(wire_buf_);
}

Status DeviceExchange::reserve(int64_t bytes) {
  if (bytes <= host_bytes_) return Status::ok_status();
  if (host_ != nullptr) cudaFreeHost(host_);
  host_ = nullptr;
  host_bytes_ = 0;
  SNAP_RETURN_IF_ERROR(cuda_status("cudaMallocHost", cudaMallocHost(reinterpret_cast<void**>(&host_), bytes)));
  host_bytes_ = bytes;
  return Status::ok_status();
}

Status DeviceExchange::all_reduce(float* buf, int64_t count) {
  if (count <= 0 || size() == 1) return Status::ok_status();
  if (wire_ == DType::bf16) return all_reduce_bf16(buf, count);
  if (!staged_) {
    // NCCL runs on the legacy default stream, which waits for `stream_` (a blocking stream)
    // and is waited for by later work on it; the call returns with the sum in place.
    return comm_.all_reduce_sum(buf, count, DType::f32);
  }
  SNAP_RETURN_IF_ERROR(reserve(4 * count));
  SNAP_RETURN_IF_ERROR(cuda_status("to host", cudaMemcpyAsync(host_, buf, 4 * count, cudaMemcpyDeviceToHost, stream_)));
  SNAP_RETURN_IF_ERROR(cuda_status("to host", cudaStreamSynchronize(stream_)));
  SNAP_RETURN_IF_ERROR(comm_.all_reduce_sum(host_, count, DType::f32));
  // The host buffer is reused by the next exchange: wait for this copy before returning.
  SNAP_RETURN_IF_ERROR(cuda_status("to device", cudaMemcpyAsync(buf, host_, 4 * count, cudaMemcpyHostToDevice, stream_)));
  return cuda_status("to device", cudaStreamSynchronize(stream_));
}

// bf16 on the wire: f32 -> bf16 on the device, the sum (NCCL on the device buffer, or staged:
// half the PCIe bytes too), bf16 -> f32 back into buf.
Status DeviceExchange::all_reduce_bf16(float* buf, int64_t count) {
  if (count > wire_count_) {
    if (wire_buf_ != nullptr) cudaFree(wire_buf_);
    wire_buf_ = nullptr;
    wire_count_ = 0;
    SNAP_RETURN_IF_ERROR(cuda_status("cudaMalloc", cudaMalloc(&wire_buf_, 2 * static_cast<size_t>(count))));
    wire_count_ = count;
  }
  kernels::f32_to_bf16_cuda(buf, wire_buf_, count, stream_);
  SNAP_RETURN_IF_ERROR(cuda_status("to bf16", cudaGetLastError()));
  if (!staged_) {
    SNAP_RETURN_IF_ERROR(comm_.all_reduce_sum(wire_buf_, count, DType::bf16));
  } else {
    SNAP_RETURN_IF_ERROR(reserve(2 * count));
    SNAP_RETURN_IF_ERROR(
        cuda_status("to host", cudaMemcpyAsync(host_, wire_buf_, 2 * count, cudaMemcpyDeviceToHost, stream_)));
    SNAP_RETURN_IF_ERROR(cuda_status("to host", cudaStreamSynchronize(stream_)));
    SNAP_RETURN_IF_ERROR(comm_.all_reduce_sum(host_, count, DType::bf16));
    SNAP_RETURN_IF_ERROR(
        cuda_status("to device", cudaMemcpyAsync(wire_buf_, host_, 2 * count, cudaMemcpyHostToDevice, stream_)));
  }
  kernels::bf16_to_f32_cuda(wire_buf_, buf, count, stream_);
  SNAP_RETURN_IF_ERROR(cuda_status("from bf16", cudaGetLastError()));
  // Staged: the host buffer is reused by the next exchange; both: buf is final when we return.
  return cuda_status("from bf16", cudaStreamSynchronize(stream_));
}

Status DeviceExchange::all_gather(const float* send, float* recv, int64_t count) {
  if (count <= 0) return Status::ok_status();
  if (!staged_) return comm_.all_gather(send, recv, count, DType::f32);
  const int64_t p = size();
  SNAP_RETURN_IF_ERROR(reserve(4 * count * (p + 1)));
  float* mine = host_ + p * count;
  SNAP_RETURN_IF_ERROR(cuda_status("to host", cudaMemcpyAsync(mine, send, 4 * count, cudaMemcpyDeviceToHost, stream_)));
  SNAP_RETURN_IF_ERROR(cuda_status("to host", cudaStreamSynchronize(stream_)));
  SNAP_RETURN_IF_ERROR(comm_.all_gather(mine, host_, count, DType::f32));
  SNAP_RETURN_IF_ERROR(
      cuda_status("to device", cudaMemcpyAsync(recv, host_, 4 * count * p, cudaMemcpyHostToDevice, stream_)));
  return cuda_status("to device", cudaStreamSynchronize(stream_));
}

}  // namespace snap
