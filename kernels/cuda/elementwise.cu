// CUDA twins of the small element-wise steps of the forward: the residual add, a scale, the
// embedding gather (bf16 table -> f32 rows) and the f32 -> bf16 conversion in front of the
// cuBLAS GEMM. All memory-bound grid-stride loops: one element per thread per iteration.
#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

namespace {
constexpr int k_threads = 256;

// Enough blocks to cover n once, capped at 65535 (grid-stride beyond that).
unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + k_threads - 1) / k_threads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}
}  // namespace

__global__ void residual_add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

void residual_add_cuda(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  residual_add_kernel<<<grid_for(n), k_threads, 0, stream>>>(x, y, n);
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= s;
}

void scale_cuda(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), k_threads, 0, stream>>>(x, s, n);
}

// One block row per token (blockIdx.x: up to 2^31 − 1 tokens), blockIdx.y and the threads
// stride over the hidden dimension.
__global__ void embedding_gather_kernel(const __nv_bfloat16* table, const int32_t* ids, int64_t hidden_size,
                                        int64_t vocab_size, float* out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * hidden_size;
  const bool valid = id >= 0 && id < vocab_size;
  const __nv_bfloat16* row = table + (valid ? static_cast<int64_t>(id) : 0) * hidden_size;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < hidden_size;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x)
    o[i] = valid ? __bfloat162float(row[i]) : __int_as_float(0x7fc00000);  // quiet NaN
}

void embedding_gather_cuda(const __nv_bfloat16* table, const int32_t* ids, int64_t num_tokens, int64_t hidden_size,
                           int64_t vocab_size, float* out, cudaStream_t stream) {
  if (num_tokens <= 0 || hidden_size <= 0) return;
  const int64_t xb = (hidden_size + k_threads - 1) / k_threads;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(xb < 64 ? xb : 64));
  embedding_gather_kernel<<<grid, k_threads, 0, stream>>>(table, ids, hidden_size, vocab_size, out);
}

__global__ void f32_to_bf16_kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

void f32_to_bf16_cuda(const float* x, __nv_bfloat16* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<grid_for(n), k_threads, 0, stream>>>(x, y, n);
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* x, float* y, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

void bf16_to_f32_cuda(const __nv_bfloat16* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<grid_for(n), k_threads, 0, stream>>>(x, y, n);
}

}  // namespace snap::kernels
