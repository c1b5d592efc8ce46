// Kernels that exercise the kernel emulator itself (kernels/cuda/emu), right and wrong, for
// test_kernel_emulator.cpp. Written in CUDA and compiled through emu_rewrite.py like
// kernels/cuda/*.cu; never built by nvcc (each wrong one is wrong on purpose).
#include <mma.h>

#include "kernels/cuda/ptx.cuh"

#include "tests/cuda/emu/probe_kernels.h"

namespace snap::emu_probe {

// Right: a block sums its 256 inputs through shared memory, __syncthreads and warp shuffles.
__global__ void block_sum_kernel(const float* x, float* out) {
  __shared__ float warp_sums[8];
  float v = x[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) out[blockIdx.x] = w;
  }
}

cudaError_t block_sum(const float* x, float* out, int blocks, cudaStream_t s) {
  block_sum_kernel<<<blocks, 256, 0, s>>>(x, out);
  return cudaGetLastError();
}

// Wrong: thread 0 reads what thread 31 wrote to shared memory without a barrier between.
__global__ void missing_barrier_kernel(float* out) {
  __shared__ float s[32];
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  if (threadIdx.x == 0) out[0] = s[31];
}

cudaError_t missing_barrier(float* out, cudaStream_t s) {
  missing_barrier_kernel<<<1, 32, 0, s>>>(out);
  return cudaGetLastError();
}

// Wrong: the threads past n return before a __syncthreads the others wait at.
__global__ void early_return_kernel(float* out, int n) {
  __shared__ float s[64];
  if (static_cast<int>(threadIdx.x) >= n) return;
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % n];
}

cudaError_t early_return(float* out, int n, cudaStream_t s) {
  early_return_kernel<<<1, 64, 0, s>>>(out, n);
  return cudaGetLastError();
}

// Wrong: a full-mask shuffle in a block of 16 threads (half a warp).
__global__ void partial_warp_kernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<float>(threadIdx.x), 1);
}

cudaError_t partial_warp(float* out, cudaStream_t s) {
  partial_warp_kernel<<<1, 16, 0, s>>>(out);
  return cudaGetLastError();
}

// Wrong: in each warp, lanes 0-15 wait at __syncthreads while lanes 16-31 wait at a full-warp
// shuffle that needs lanes 0-15.
__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x % 32 < 16) {
    __syncthreads();
    out[threadIdx.x] = 1.0f;
  } else {
    out[threadIdx.x] = __shfl_sync(0xffffffffu, 2.0f, 0);
  }
}

cudaError_t divergent_barrier(float* out, cudaStream_t s) {
  divergent_barrier_kernel<<<1, 64, 0, s>>>(out);
  return cudaGetLastError();
}

// Shared memory is each block's own: every block reads its slot before writing it.
__global__ void fresh_shared_kernel(unsigned* out) {
  __shared__ unsigned s[1];
  if (threadIdx.x == 0) {
    out[blockIdx.x] = s[0];
    s[0] = 12345u;
  }
}

cudaError_t fresh_shared(unsigned* out, int blocks, cudaStream_t s) {
  fresh_shared_kernel<<<blocks, 32, 0, s>>>(out);
  return cudaGetLastError();
}

// Dynamic shared memory of `bytes`, after an optional cudaFuncSetAttribute; writes its coordinates.
__global__ void dynamic_shared_kernel(int* out) {
  extern __shared__ int dyn[];
  dyn[threadIdx.x] = static_cast<int>(threadIdx.x + blockIdx.y * 1000);
  __syncthreads();
  out[blockIdx.y * blockDim.x + threadIdx.x] = dyn[blockDim.x - 1 - threadIdx.x];
}

cudaError_t dynamic_shared(int* out, dim3 grid, dim3 block, size_t bytes, int attribute, cudaStream_t s) {
  if (attribute >= 0) {
    const cudaError_t e = cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               attribute);
    if (e != cudaSuccess) return e;
  }
  dynamic_shared_kernel<<<grid, block, bytes, s>>>(out);
  return cudaGetLastError();
}

// WMMA (kernels/cuda/emu/include/mma.h). Right: one warp computes D = A·B + C for 16×16 tiles
// (A row-major, B column-major in global memory, C and D row-major), with the same tile loaded
// into an accumulator telling each lane the row of its elements (`rows`: D's rows scaled by
// row + 1 through that mapping). mode 1 (wrong): A's pointer off by 8 bytes (not 256-bit
// aligned). mode 2 (wrong): lane 5 passes another pointer than the others. mode 3 (wrong):
// assumes lane l's x[e] is element 8l + e (CUDA leaves the mapping unspecified) when scaling.
// mode 4 (right): __syncwarp between a lane's shared write and another lane's read.
__global__ void wmma_probe_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d,
                                  const float* row_tile, int mode) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc, rows;
  const __nv_bfloat16* pa = mode == 1 ? a + 4 : mode == 2 && threadIdx.x == 5 ? a + 16 : a;
  wmma::load_matrix_sync(fa, pa, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
  wmma::load_matrix_sync(rows, row_tile, 16, wmma::mem_row_major);
  wmma::mma_sync(fc, fa, fb, fc);
  for (int e = 0; e < fc.num_elements; ++e) {
    const float row = mode == 3 ? static_cast<float>((threadIdx.x * 8 + e) / 16) : rows.x[e];
    fc.x[e] *= row + 1.0f;
  }
  wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
  if (mode == 4) {
    __shared__ float handoff[32];
    handoff[threadIdx.x] = static_cast<float>(threadIdx.x);
    __syncwarp();
    d[256 + threadIdx.x] = handoff[31 - threadIdx.x];
  }
}

cudaError_t wmma_probe(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d, const float* row_tile,
                       int mode, cudaStream_t s) {
  wmma_probe_kernel<<<1, 32, 0, s>>>(a, b, c, d, row_tile, mode);
  return cudaGetLastError();
}

// PTX: mma.sync m16n8k16, ldmatrix (plain and transposed) and cp.async, used as
// attention_prefill_mma.cu uses them (A as Q, Kt as a chunk of keys, V as values). Right in
// modes 0 and 3; mode 1 (wrong) reads the tiles before its cp.async group has completed;
// mode 2 (wrong) gives lane 3 a row address that is not 16-byte aligned.
__global__ void ptx_probe_kernel(const __nv_bfloat16* a, const __nv_bfloat16* kt, const __nv_bfloat16* v, float* d,
                                 int mode) {
  namespace ptx = snap::kernels::ptx;
  constexpr int ld = 24;  // padded rows, as the kernel pads them
  extern __shared__ __align__(128) unsigned char probe_smem[];
  __nv_bfloat16* s = reinterpret_cast<__nv_bfloat16*>(probe_smem);  // [3][16][ld]
  const int lane = threadIdx.x, gq = lane >> 2, tq = lane & 3;
  for (int i = lane; i < 3 * 16 * 2; i += 32) {  // 3 tiles x 16 rows x 2 pieces of 16 bytes
    const int t = i / 32, row = (i / 2) % 16, c8 = (i % 2) * 8;
    const __nv_bfloat16* src = (t == 0 ? a : t == 1 ? kt : v) + row * 16 + c8;
    ptx::cp_async_16(s + (t * 16 + row) * ld + c8, src, !(mode == 3 && t == 1 && row >= 8));
  }
  ptx::cp_async_commit();
  if (mode != 1) ptx::cp_async_wait<0>();
  __syncthreads();
  uint32_t fa[4], fk[4], fv[4];
  const __nv_bfloat16* pa = s + (lane & 15) * ld + (lane >> 4) * 8;
  if (mode == 2 && lane == 3) pa += 4;
  ptx::ldmatrix_x4(fa, pa);
  ptx::ldmatrix_x4(fk, s + (16 + (lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8);
  ptx::ldmatrix_x4_trans(fv, s + (32 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);
  float c[4][4] = {};
  ptx::mma_bf16_16816(c[0], fa, fk[0], fk[1]);
  ptx::mma_bf16_16816(c[1], fa, fk[2], fk[3]);
  ptx::mma_bf16_16816(c[2], fa, fv[0], fv[1]);
  ptx::mma_bf16_16816(c[3], fa, fv[2], fv[3]);
  for (int i = 0; i < 4; ++i)
    for (int e = 0; e < 4; ++e)
      d[(i / 2) * 256 + (gq + (e >= 2 ? 8 : 0)) * 16 + (i % 2) * 8 + 2 * tq + (e & 1)] = c[i][e];
  if (mode == 1) ptx::cp_async_wait<0>();
}

cudaError_t ptx_probe(const __nv_bfloat16* a, const __nv_bfloat16* kt, const __nv_bfloat16* v, float* d, int mode,
                      cudaStream_t s) {
  ptx_probe_kernel<<<1, 32, 3 * 16 * 24 * sizeof(__nv_bfloat16), s>>>(a, kt, v, d, mode);
  return cudaGetLastError();
}

}  // namespace snap::emu_probe
