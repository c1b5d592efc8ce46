// The CUDA kernel language on the CPU, for the kernel emulator (kernels/cuda/emu/README.md).
// kernels/cuda/*.cu are compiled as C++ after emu_rewrite.py has turned each `k<<<cfg>>>(args)`
// into `::snap_emu::launch(...)` and each `__shared__` declaration into a block-local slot, and
// put `#include "kernels/cuda/emu/kernel_lang.h"` first. What a kernel sees here:
//  - threadIdx, blockIdx, blockDim, gridDim, warpSize, as on the GPU (unsigned components);
//  - __syncthreads() and the warp shuffles, which really synchronise: every CUDA thread of a
//    block is a fiber (emu_runtime.cpp), and a thread that reaches a barrier waits there until
//    all the threads the barrier names have reached it. A barrier some threads never reach (a
//    __syncthreads after an early return, a full-mask shuffle in a partial warp) is a fault
//    that names the kernel, the block and the threads, instead of a hang or undefined result;
//  - shared memory that is fresh per block and filled with 0xFF bytes (NaN as floats), each
//    declaration its own heap allocation of exactly its size (AddressSanitizer sees overflows);
//    the dynamic part is exactly the launch's byte count;
//  - the intrinsics the kernels use, with the GPU's rounding where it is specified (__fadd_rn,
//    __fsub_rn, __fmul_rn: one rounding each, never fused; compile with -ffp-contract=off).
// The runtime API (cudaMalloc, copies, streams) is the host twin's (kernels/cuda/host).
#pragma once

// Code that must differ under the emulator tests this (kernels/cuda/ptx.cuh: the PTX
// instructions come from emu/ptx_emu.h instead of inline asm).
#define SNAP_KERNEL_EMULATOR 1

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/emu/emu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// --- built-in vector types (uint3 and dim3: the host twin's cuda_runtime.h) -------------------
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

// --- function qualifiers ----------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __noinline__
#define __align__(n) alignas(n)

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

namespace snap_emu {

struct Config {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  Config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), smem(s), stream(st) {}
};

struct Site {
  const char* kernel;  // as written at the launch
  const char* file;
  int line;
};

// The running CUDA thread's coordinates (valid only inside a kernel), set by the scheduler on
// every switch into a thread. constinit: no TLS wrapper call on each read of threadIdx.
struct Engine;
struct Current {
  uint3 tid, bid;
  dim3 bdim, gdim;
  int lane = 0;  // linear thread index % 32
  Engine* engine = nullptr;
};
inline thread_local constinit Current t_current{};

void syncthreads();
// Deposits `bits` for the lanes of `mask`, waits for all of them, returns lane src's bits.
uint64_t warp_exchange(uint32_t mask, uint64_t bits, int src_lane, const char* what);
inline int lane_id() { return t_current.lane; }
// A warp-collective operation (WMMA's load/store/mma in include/mma.h, __syncwarp): every lane
// of `mask` deposits `arg`; the last to arrive runs fn(args, mask) once, args[l] being lane l's
// deposit, before any lane goes on. fn returns null, or what is wrong (a fault: the launch ends).
// Lanes at a collective must all be at the same one (`what`), not at a shuffle.
using WarpCollectiveFn = const char* (*)(void* const* args, uint32_t mask);
void warp_collective(uint32_t mask, void* arg, WarpCollectiveFn fn, const char* what);

// cp.async (the PTX instructions, through kernels/cuda/ptx.cuh): a copy of `bytes` (4, 8 or
// 16, aligned) from global to this block's shared memory, of which the first src_bytes come
// from src and the rest are zeros. Nothing lands when it is issued: cp_async_commit closes the
// thread's open copies into a group, and cp_async_wait(n) completes the thread's groups but
// the n most recent, oldest first (cp.async.wait_group n). So a kernel that reads the
// destination before its wait (and the __syncthreads after it) reads the old bytes — 0xFF,
// NaN, in fresh shared memory — as it might on the GPU. Groups still pending when a thread
// ends never land. A destination outside the block's shared memory, a source that is not
// device memory, or a size or alignment PTX refuses is a fault.
void cp_async(void* dst, const void* src, size_t bytes, size_t src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);
// Whether [p, p + bytes) lies in the running block's shared memory (static or dynamic).
bool is_shared(const void* p, size_t bytes);

// Block-local shared memory: the calling thread's next static `__shared__` declaration of
// `bytes` (every thread of the block declares the same sequence), and the dynamic part.
void* shared_slot(size_t bytes, size_t align, const char* name);
void* dynamic_shared();

// One launch: checks the configuration as the runtime does (sets the error and returns
// without running on a bad one), then runs `body(ctx)` once per CUDA thread, block by block.
void run(const Config& c, const Site& s, const void* fn, void (*body)(void*), void* ctx);
// A kernel argument that is a pointer must be device memory (or null): false, with the error
// set to cudaErrorIllegalAddress, and the launch does not run (on a GPU it would fault when the
// kernel reads it; an argument the kernel never reads would not, but none of ours is such).
bool check_pointer_arg(const Site& s, int index, const void* p);
cudaError_t set_max_dynamic_shared(const void* fn, int bytes);

template <typename T>
bool check_arg(const Site& s, int index, const T& v) {
  if constexpr (std::is_pointer_v<T>) return check_pointer_arg(s, index, static_cast<const void*>(v));
  return true;
}

template <typename... P, typename... A>
void launch(const Config& c, const Site& s, void (*k)(P...), A&&... a) {
  using Params = std::tuple<std::decay_t<P>...>;
  struct Ctx {
    void (*k)(P...);
    Params params;
  } ctx{k, Params(std::forward<A>(a)...)};  // converted at the launch, as CUDA does
  const bool args_ok = std::apply([&](const auto&... v) {
    int i = 0;
    return (check_arg(s, i++, v) && ...);
  }, ctx.params);
  if (!args_ok) return;
  run(c, s, reinterpret_cast<const void*>(k),
      [](void* p) {
        auto* x = static_cast<Ctx*>(p);
        std::apply(x->k, x->params);  // each thread gets the same by-value parameters
      },
      &ctx);
}

template <typename T>
T shfl(uint32_t mask, T v, int src_lane, const char* what) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(mask, bits, src_lane, what);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

}  // namespace snap_emu

template <typename F>
cudaError_t cudaFuncSetAttribute(F* fn, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize)
    return snap_emu::set_max_dynamic_shared(reinterpret_cast<const void*>(fn), value);
  return cudaSuccess;
}

#define threadIdx (static_cast<const uint3&>(::snap_emu::t_current.tid))
#define blockIdx (static_cast<const uint3&>(::snap_emu::t_current.bid))
#define blockDim (static_cast<const dim3&>(::snap_emu::t_current.bdim))
#define gridDim (static_cast<const dim3&>(::snap_emu::t_current.gdim))
constexpr int warpSize = 32;

inline void __syncthreads() { snap_emu::syncthreads(); }
// Every lane of mask waits for the others (a collective with nothing to do).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  snap_emu::warp_collective(mask, nullptr, [](void* const*, uint32_t) -> const char* { return nullptr; }, "__syncwarp");
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = snap_emu::lane_id();
  return snap_emu::shfl(mask, v, (lane ^ lane_mask) % width + lane / width * width, "__shfl_xor_sync");
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  const int lane = snap_emu::lane_id();
  return snap_emu::shfl(mask, v, src_lane % width + lane / width * width, "__shfl_sync");
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = snap_emu::lane_id();
  const int in_seg = lane % width;
  return snap_emu::shfl(mask, v, in_seg + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane,
                        "__shfl_down_sync");
}

// --- intrinsics (one rounding each; the emulated sources build with -ffp-contract=off) --------
#if SNAP_EMU_GPU_MATH
// GPU-like arithmetic (README.md, "GPU-like arithmetic"): the sources build with
// -ffp-contract=fast -mfma, so the compiler fuses a*b+c as nvcc does by default (--fmad=true),
// and the functions whose CUDA result is not correctly rounded return a result off by up to
// the documented bound, chosen per argument by a hash (deterministic). _rn intrinsics stay
// single roundings: the empty asm makes each result opaque, so nothing fuses across them.
namespace snap_emu::gpu_math {
inline float opaque(float r) {
  asm("" : "+x"(r));
  return r;
}
// r moved by -1, 0 or +1 ulp (within CUDA's 2-ulp bound for expf and rsqrtf), by x's bits.
inline float off_by_ulp(float r, float x) {
  if (!std::isfinite(r) || r == 0.0f) return r;
  const unsigned h = (std::bit_cast<unsigned>(x) * 0x9E3779B1u) >> 30;  // 0..3
  if (h == 1) return std::nextafter(r, INFINITY);
  if (h == 2) return std::nextafter(r, -INFINITY);
  return r;
}
// CUDA's expf: at most 2 ulp from exp (CUDA Math API, single-precision functions).
inline float expf(float x) { return off_by_ulp(std::exp(x), x); }
// __expf: ex2.approx of the float product x * log2(e), whose rounding is the main error.
inline float fast_expf(float x) { return off_by_ulp(std::exp2(opaque(x * 1.44269504f)), x); }
// rsqrtf: at most 2 ulp from 1/sqrt(x).
inline float rsqrtf(float x) { return off_by_ulp(1.0f / std::sqrt(x), x); }
// CUDA's tanhf: at most 2 ulp from tanh.
inline float tanhf(float x) { return off_by_ulp(std::tanh(x), x); }
}  // namespace snap_emu::gpu_math
inline float __fadd_rn(float a, float b) { return snap_emu::gpu_math::opaque(a + b); }
inline float __fsub_rn(float a, float b) { return snap_emu::gpu_math::opaque(a - b); }
inline float __fmul_rn(float a, float b) { return snap_emu::gpu_math::opaque(a * b); }
inline float __fdiv_rn(float a, float b) { return snap_emu::gpu_math::opaque(a / b); }
inline float __expf(float x) { return snap_emu::gpu_math::fast_expf(x); }
inline float rsqrtf(float x) { return snap_emu::gpu_math::rsqrtf(x); }
#define expf(x) ::snap_emu::gpu_math::expf(x)
#define tanhf(x) ::snap_emu::gpu_math::tanhf(x)
#else
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
#endif
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{__bfloat162float(h.x), __bfloat162float(h.y)}; }
using std::max;
using std::min;
using std::isfinite;
using std::isinf;
using std::isnan;
