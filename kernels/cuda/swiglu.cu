// CUDA twin of swiglu_cpu: out[i] = gate[i] / (1 + e^−gate[i]) · up[i], grid-stride loop.
// expf (not __expf): full-precision so the test can hold it to the CPU reference at 2e-6.
#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

__global__ void swiglu_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

void swiglu_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int k_threads = 256;
  const int64_t blocks = (n + k_threads - 1) / k_threads;
  swiglu_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), k_threads, 0, stream>>>(gate, up, out, n);
}

}  // namespace snap::kernels
