// The host twin of the CUDA runtime (kernels/cuda/host/): the subset of <cuda_runtime.h> that
// worker/device and tests/cuda call, implemented on the CPU (cuda_host.cpp). It exists so that
// CI machines without a GPU run the device path's HOST code — the forward's orchestration, the
// KV pool, SnapKV's compaction, tensor parallelism's shard configs, exchange and lockstep —
// through its real call sites, with kernels_host.cpp's CPU twins of kernels_cuda.h standing in
// for the kernels. It verifies none of the CUDA kernels (the kernel emulator in ../emu, which
// uses this runtime, runs them on the CPU; tests/cuda on a GPU does).
//
// Only targets that put this directory first on their include path see it (the "-host"
// targets of kernels/cuda/CMakeLists.txt); they never include the toolkit's headers. These
// functions have C++ linkage, so they cannot collide with libcudart's C symbols when a binary
// links both.
//
// Checks a GPU would make and a plain CPU run would not: "device" memory is a registry of
// cudaMalloc'd ranges, and every copy's direction and every launcher's pointer argument is
// checked against it (a host pointer handed to a kernel, or a copy the wrong way, is
// cudaErrorIllegalAddress / cudaErrorInvalidValue, as on a GPU, instead of silently working).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;

struct cudaDeviceProp {
  char name[256] = {};
  size_t totalGlobalMem = 0;
  int multiProcessorCount = 0;
  int major = 0;
  int minor = 0;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFreeHost(void* ptr);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

// Events: the host clock at the record (every call before it has completed: nothing is
// asynchronous here), so elapsed times are the CPU's, for benchmarks' code paths only.
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

namespace snap::hostcuda {

// Whether [ptr, ptr + bytes) lies inside one live cudaMalloc allocation (bytes 0: ptr inside
// or one past the end of one, or null).
bool is_device(const void* ptr, size_t bytes);
// A launcher's pointer check: false, and the thread's pending error set to
// cudaErrorIllegalAddress with `what` kept for cudaGetErrorString, when ptr is not device
// memory of that size. Null with bytes 0 passes.
bool require_device(const void* ptr, size_t bytes, const char* what);
// A launcher's own error (a bad shape): the next cudaGetLastError returns it.
void set_error(cudaError_t e);
// The same with the text cudaGetErrorString returns for it (the kernel emulator's faults).
void set_error(cudaError_t e, const std::string& what);
// The bytes cudaMalloc holds now, and the emulated device's size (SNAP_HOSTCUDA_MIB, default
// 8192 MiB): cudaMalloc beyond it fails with cudaErrorMemoryAllocation as a full GPU would.
size_t allocated_bytes();
size_t capacity_bytes();
// What a cache of values derived from device memory (kernels_host.cpp's weight matrices) checks:
// free_count, how many cudaFree calls have released memory so far (a change: any entry's memory
// may have been freed and reused); content_tag, a value that changes whenever the allocation
// holding ptr is written by a cudaMemcpy* or cudaMemset* (0: ptr is not device memory). A
// kernel's stores do not change it.
uint64_t free_count();
uint64_t content_tag(const void* ptr);

}  // namespace snap::hostcuda
