// The kernel emulator's PTX (kernels/cuda/ptx.cuh): mma.sync m16n8k16 bf16, ldmatrix and
// cp.async, with the fragment layouts the PTX ISA documents (listed in ptx.cuh). Unlike WMMA's
// unspecified layout (include/mma.h scrambles it), these layouts are the instructions'
// contract, so the emulator follows them exactly: a kernel whose fragment indexing is wrong
// gets wrong numbers here, and one that is right here is right on the GPU.
//  - mma_bf16_16816 and the ldmatrix forms are warp-collective (every lane of the warp must
//    reach the same one); the last lane to arrive runs the instruction over all 32 lanes'
//    registers. The MMA sums each D element from C over k = 0..15 in order, in f32 (a bf16
//    product is exact in f32); the tensor cores' own order is not specified, so the last bits
//    may differ on a GPU.
//  - ldmatrix faults on a row address that is not 16-byte aligned or not in the block's
//    shared memory.
//  - cp.async lands only at the wait that completes its group (kernel_lang.h, cp_async).
#pragma once

#include <cuda_bf16.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/cuda/emu/kernel_lang.h"

namespace snap::kernels::ptx {
namespace detail {

inline thread_local std::string t_error;

inline float bf16_bits_to_float(uint32_t bits) { return std::bit_cast<float>((bits & 0xffffu) << 16); }

struct Mma {
  float* d;
  const uint32_t* a;
  uint32_t b0, b1;
};

inline const char* mma_fn(void* const* args, uint32_t mask) {
  if (mask != 0xffffffffu) return "mma.sync needs all 32 lanes";
  float A[16][16], B[16][8], C[16][8];
  for (int t = 0; t < 32; ++t) {
    const Mma& m = *static_cast<const Mma*>(args[t]);
    const int g = t / 4, q = t % 4;
    for (int i = 0; i < 8; ++i) {  // a0..a7: register i / 2, half i % 2
      const int row = g + ((i >> 1) & 1) * 8, col = 2 * q + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = bf16_bits_to_float(m.a[i / 2] >> (16 * (i & 1)));
    }
    const uint32_t b[2] = {m.b0, m.b1};
    for (int i = 0; i < 4; ++i) B[2 * q + (i & 1) + (i >= 2 ? 8 : 0)][g] = bf16_bits_to_float(b[i / 2] >> (16 * (i & 1)));
    for (int i = 0; i < 4; ++i) C[g + (i >= 2 ? 8 : 0)][2 * q + (i & 1)] = m.d[i];
  }
  for (int t = 0; t < 32; ++t) {  // every input is read above
    const Mma& m = *static_cast<const Mma*>(args[t]);
    const int g = t / 4, q = t % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >= 2 ? 8 : 0), col = 2 * q + (i & 1);
      float acc = C[row][col];
      for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];  // bf16 products: exact in f32
      m.d[i] = acc;
    }
  }
  return nullptr;
}

struct Ldm {
  uint32_t* r;
  const __nv_bfloat16* p;
};

template <bool kTrans>
const char* ldmatrix_fn(void* const* args, uint32_t mask) {
  if (mask != 0xffffffffu) return "ldmatrix needs all 32 lanes";
  for (int i = 0; i < 4; ++i) {
    uint16_t M[8][8];
    for (int row = 0; row < 8; ++row) {
      const int lane = 8 * i + row;
      const void* p = static_cast<const Ldm*>(args[lane])->p;
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        return (t_error = "lane " + std::to_string(lane) + "'s row address is not 16-byte aligned").c_str();
      if (!snap_emu::is_shared(p, 16))
        return (t_error = "lane " + std::to_string(lane) + "'s row address is not in the block's shared memory").c_str();
      std::memcpy(M[row], p, 16);
    }
    for (int t = 0; t < 32; ++t) {
      const int a = t / 4, b = 2 * (t % 4);
      const uint32_t lo = kTrans ? M[b][a] : M[a][b], hi = kTrans ? M[b + 1][a] : M[a][b + 1];
      static_cast<const Ldm*>(args[t])->r[i] = lo | hi << 16;
    }
  }
  return nullptr;
}

}  // namespace detail

inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  detail::Mma m{d, a, b0, b1};
  snap_emu::warp_collective(0xffffffffu, &m, &detail::mma_fn, "mma.sync.m16n8k16");
}
inline void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
  detail::Ldm l{r, p};
  snap_emu::warp_collective(0xffffffffu, &l, &detail::ldmatrix_fn<false>, "ldmatrix.x4");
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
  detail::Ldm l{r, p};
  snap_emu::warp_collective(0xffffffffu, &l, &detail::ldmatrix_fn<true>, "ldmatrix.x4.trans");
}
inline void cp_async_16(void* smem, const void* src, bool valid) { snap_emu::cp_async(smem, src, 16, valid ? 16 : 0); }
inline void cp_async_commit() { snap_emu::cp_async_commit(); }
template <int kPending>
inline void cp_async_wait() {
  snap_emu::cp_async_wait(kPending);
}
inline uint32_t pack_bf16x2(float x, float y) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(x))) |
         static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(y))) << 16;
}

}  // namespace snap::kernels::ptx
