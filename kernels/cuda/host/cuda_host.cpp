// The host twin of the CUDA runtime (cuda_runtime.h here): one emulated device whose memory
// is host memory in a registry of live allocations. Streams run nothing asynchronously: every
// copy and launch completes before it returns, so stream order always holds here (a missing
// synchronisation that a GPU would expose cannot be seen on this twin).
#include "cuda_runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

// What the device calls itself: the twin's kernels are CPU twins; the kernel emulator (../emu),
// which shares this runtime (built with SNAP_HOSTCUDA_EMULATOR=1), runs the kernels' own code.
#if SNAP_HOSTCUDA_EMULATOR
#define SNAP_HOSTCUDA_DEVICE_NAME "kernel emulator (no GPU; kernels/cuda/emu)"
#else
#define SNAP_HOSTCUDA_DEVICE_NAME "host twin (no GPU; kernels/cuda/host)"
#endif

namespace snap::hostcuda {
namespace {

struct Registry {
  std::mutex mu;
  struct Alloc {
    size_t bytes;
    uint64_t tag;  // content_tag: new at the allocation and at every copy or memset into it
  };
  std::map<uintptr_t, Alloc> live;  // start -> allocation
  uint64_t next_tag = 1;
  size_t bytes = 0;
  uint64_t frees = 0;  // cudaFree calls that released memory
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: frees may run from static destructors
  return *r;
}

thread_local cudaError_t t_error = cudaSuccess;
thread_local std::string t_what;
thread_local int t_device = 0;

size_t capacity_from_env() {
  const char* v = std::getenv("SNAP_HOSTCUDA_MIB");
  const long long mib = v ? std::atoll(v) : 0;
  return static_cast<size_t>(mib > 0 ? mib : 8192) << 20;
}

cudaError_t fail(cudaError_t e, std::string what) {
  t_error = e;
  t_what = std::move(what);
  return e;
}

}  // namespace

bool is_device(const void* ptr, size_t bytes) {
  if (ptr == nullptr) return bytes == 0;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.upper_bound(p);
  if (it == r.live.begin()) return false;
  --it;
  const uintptr_t end = it->first + it->second.bytes;
  return p <= end && bytes <= end - p && (p < end || bytes == 0);
}

bool require_device(const void* ptr, size_t bytes, const char* what) {
  if (is_device(ptr, bytes)) return true;
  fail(cudaErrorIllegalAddress, std::string("host twin: ") + what + " is not device memory of " +
                                    std::to_string(bytes) + " bytes");
  return false;
}

void set_error(cudaError_t e) {
  if (e != cudaSuccess) fail(e, "");
}

void set_error(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail(e, what);
}

size_t allocated_bytes() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.bytes;
}

namespace {
// The allocation holding p (its start <= p < its end), or null; under r.mu.
Registry::Alloc* holder(Registry& r, const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = r.live.upper_bound(p);
  if (it == r.live.begin()) return nullptr;
  --it;
  return p < it->first + it->second.bytes ? &it->second : nullptr;
}

// A copy or memset wrote into the allocation holding dst (if device memory): a new tag.
void retag(void* dst) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (Registry::Alloc* a = holder(r, dst)) a->tag = r.next_tag++;
}

}  // namespace

uint64_t content_tag(const void* ptr) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const Registry::Alloc* a = holder(r, ptr);
  return a ? a->tag : 0;
}

uint64_t free_count() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.frees;
}

size_t capacity_bytes() {
  static const size_t cap = capacity_from_env();
  return cap;
}

namespace {

bool side_ok(const void* p, size_t bytes, bool device) { return device ? is_device(p, bytes) : !is_device(p, 0); }

cudaError_t check_copy(void* dst, const void* src, size_t dst_span, size_t src_span, cudaMemcpyKind kind) {
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = side_ok(dst, dst_span, true) && side_ok(src, src_span, false); break;
    case cudaMemcpyDeviceToHost: ok = side_ok(dst, dst_span, false) && side_ok(src, src_span, true); break;
    case cudaMemcpyDeviceToDevice: ok = side_ok(dst, dst_span, true) && side_ok(src, src_span, true); break;
    case cudaMemcpyHostToHost: ok = side_ok(dst, dst_span, false) && side_ok(src, src_span, false); break;
    case cudaMemcpyDefault: break;
  }
  if (!ok) {
    static const char* names[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
    return fail(cudaErrorInvalidValue, std::string("host twin: cudaMemcpy") + names[kind] + " of " +
                                           std::to_string(dst_span) + " bytes: a pointer is on the wrong side");
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace snap::hostcuda

using namespace snap::hostcuda;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice, "host twin: only device 0 exists");
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice, "host twin: only device 0 exists");
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "%s", SNAP_HOSTCUDA_DEVICE_NAME);
  prop->totalGlobalMem = capacity_bytes();
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const size_t used = allocated_bytes(), cap = capacity_bytes();
  *total_bytes = cap;
  *free_bytes = used < cap ? cap - used : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return t_error; }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (bytes > capacity_bytes() - std::min(r.bytes, capacity_bytes()))
      return fail(cudaErrorMemoryAllocation, "host twin: out of emulated device memory (SNAP_HOSTCUDA_MIB)");
    r.bytes += bytes;
  }
  // 256-byte aligned, as cudaMalloc's memory is (WMMA and vector loads rely on it); the exact
  // size, so AddressSanitizer still sees an overflow of a few bytes.
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes) != 0) p = nullptr;
  if (p == nullptr) {
    std::lock_guard<std::mutex> lock(r.mu);
    r.bytes -= bytes;
    return fail(cudaErrorMemoryAllocation, "host twin: malloc failed");
  }
  std::memset(p, 0xA5, bytes);  // garbage, as fresh device memory: nothing may rely on zeros
  std::lock_guard<std::mutex> lock(r.mu);
  r.live[reinterpret_cast<uintptr_t>(p)] = {bytes, r.next_tag++};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.live.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.live.end()) return fail(cudaErrorInvalidValue, "host twin: cudaFree of a pointer cudaMalloc did not return");
    r.bytes -= it->second.bytes;
    r.live.erase(it);
    ++r.frees;
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  *ptr = std::malloc(bytes ? bytes : 1);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation, "host twin: malloc failed");
}

cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (const cudaError_t e = check_copy(dst, src, bytes, bytes, kind); e != cudaSuccess) return e;
  std::memmove(dst, src, bytes);
  retag(dst);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch) return fail(cudaErrorInvalidValue, "host twin: cudaMemcpy2D width above a pitch");
  const size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
  if (const cudaError_t e = check_copy(dst, src, dspan, sspan, kind); e != cudaSuccess) return e;
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  retag(dst);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!require_device(dst, bytes, "cudaMemset's destination")) return cudaErrorIllegalAddress;
  std::memset(dst, value, bytes);
  retag(dst);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) { return cudaMemset(dst, value, bytes); }

struct CUstream_st {
  int unused = 0;
};

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}

// A launch's error is sticky until read, as a kernel fault surfaces at the next synchronisation.
cudaError_t cudaStreamSynchronize(cudaStream_t) { return t_error; }

struct CUevent_st {
  std::chrono::steady_clock::time_point at{};
  bool recorded = false;
};

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (event == nullptr) return fail(cudaErrorInvalidValue, "host twin: cudaEventRecord of a null event");
  event->at = std::chrono::steady_clock::now();
  event->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidValue, "host twin: cudaEventSynchronize of a null event");
  return t_error;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (start == nullptr || end == nullptr || !start->recorded || !end->recorded)
    return fail(cudaErrorInvalidValue, "host twin: cudaEventElapsedTime of an event never recorded");
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_error;
  t_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return t_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  if (error != cudaSuccess && !t_what.empty()) return t_what.c_str();
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}
