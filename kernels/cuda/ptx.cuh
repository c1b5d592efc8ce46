// The PTX the FlashAttention-class prompt kernel (attention_prefill_mma.cu) is built on, as
// inline functions: the m16n8k16 bf16 MMA (mma.sync, f32 accumulation), ldmatrix (x4, plain
// and transposed) and cp.async (16 bytes, zero-filled past the source bytes; commit; wait).
// sm_80 and newer. Under the kernel emulator (kernels/cuda/emu) the same functions come from
// emu/ptx_emu.h, which models each instruction's documented fragment layout exactly.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"; group = lane / 4,
// tig = lane % 4; a .b32 register holds two bf16, the lower-indexed one in the low half):
//  - A (16 × 16, row-major), 4 registers: a[0] = row group, cols 2·tig + {0, 1}; a[1] = row
//    group + 8, same cols; a[2] = row group, cols 8 + 2·tig + {0, 1}; a[3] = row group + 8, same.
//  - B (16 × 8, k × n), 2 registers: b[0] = rows (k) 2·tig + {0, 1}, col (n) group; b[1] = rows
//    8 + 2·tig + {0, 1}, same col.
//  - C/D (16 × 8, f32), 4 floats: c[0], c[1] = row group, cols 2·tig + {0, 1}; c[2], c[3] = row
//    group + 8, same cols.
//  - ldmatrix .x4: lanes 8i .. 8i + 7 give the 8 row addresses (16 bytes each) of matrix i, and
//    register i of lane t gets row t / 4, elements 2·(t % 4) + {0, 1} of matrix i; .trans gives
//    the transpose: elements [2·(t % 4) + {0, 1}][t / 4].
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#if defined(SNAP_KERNEL_EMULATOR)  // kernel_lang.h, which the emulator puts first
#include "kernels/cuda/emu/ptx_emu.h"
#else

namespace snap::kernels::ptx {

inline __device__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// d += a · b (f32 accumulation).
inline __device__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 × 8 bf16 matrices from shared memory; p is this lane's row (16-byte aligned).
inline __device__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
inline __device__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// 16 bytes global -> shared, bypassing L1; zeros instead when !valid (src is not read then).
inline __device__ void cp_async_16(void* smem, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
inline __device__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
inline __device__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Two floats as a bf16 pair (x in the low half), rounded to nearest.
inline __device__ uint32_t pack_bf16x2(float x, float y) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

}  // namespace snap::kernels::ptx

#endif
