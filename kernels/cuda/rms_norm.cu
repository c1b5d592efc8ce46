// CUDA twin of rms_norm_cpu: one 256-thread block per token; each thread sums squares over
// a strided slice, a shared-memory tree reduces them (fixed order, so runs are repeatable),
// then every thread scales its slice. y may alias x (each element is read before written).
#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

namespace {
constexpr int k_threads = 256;
}

__global__ void rms_norm_kernel(const float* x, const float* weight, float* y, int64_t hidden_size, float eps) {
  __shared__ float partial[k_threads];
  const float* xt = x + blockIdx.x * hidden_size;
  float* yt = y + blockIdx.x * hidden_size;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden_size; i += k_threads) ss += xt[i] * xt[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = k_threads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = rsqrtf(partial[0] / static_cast<float>(hidden_size) + eps);
  for (int64_t i = threadIdx.x; i < hidden_size; i += k_threads) yt[i] = xt[i] * inv * weight[i];
}

void rms_norm_cuda(const float* x, const float* weight, float* y, int64_t num_tokens, int64_t hidden_size, float eps,
                   cudaStream_t stream) {
  if (num_tokens <= 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(num_tokens), k_threads, 0, stream>>>(x, weight, y, hidden_size, eps);
}

}  // namespace snap::kernels
