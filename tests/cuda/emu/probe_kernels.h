// The launchers of probe_kernels.cu (see there): the kernel emulator's own test kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace snap::emu_probe {

cudaError_t block_sum(const float* x, float* out, int blocks, cudaStream_t s);
cudaError_t missing_barrier(float* out, cudaStream_t s);
cudaError_t early_return(float* out, int n, cudaStream_t s);
cudaError_t partial_warp(float* out, cudaStream_t s);
cudaError_t divergent_barrier(float* out, cudaStream_t s);
cudaError_t fresh_shared(unsigned* out, int blocks, cudaStream_t s);
cudaError_t dynamic_shared(int* out, dim3 grid, dim3 block, size_t bytes, int attribute, cudaStream_t s);
// mode 0 right, 1 misaligned, 2 lanes disagree, 3 assumes a layout, 4 right + __syncwarp (probe_kernels.cu).
cudaError_t wmma_probe(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d, const float* row_tile,
                       int mode, cudaStream_t s);

// PTX (kernels/cuda/ptx.cuh) on one warp: d[0..255] = A·Ktᵀ and d[256..511] = A·V (16×16,
// row-major), the tiles (16×16 bf16, row-major) staged through cp.async and loaded with
// ldmatrix as attention_prefill_mma.cu loads Q, K and V. mode 1: reads before cp_async_wait;
// mode 2: lane 3's ldmatrix address 8 bytes off; mode 3: Kt's rows 8..15 fetched as zeros.
cudaError_t ptx_probe(const __nv_bfloat16* a, const __nv_bfloat16* kt, const __nv_bfloat16* v, float* d, int mode,
                      cudaStream_t s);

}  // namespace snap::emu_probe
