// CUDA twin of geglu_cpu (kernels/cpu/geglu.h, Gemma 3's MLP activation):
// out[i] = gelu_tanh(gate[i]) · up[i], gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g³))),
// grid-stride loop. tanhf (not a fast approximation: CUDA documents 2 ulp) so that the test can
// hold it to the f64 reference at 2e-6 as swiglu_cuda is held; NaN in gate or up propagates.
#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

__global__ void geglu_kernel(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
  constexpr float k_cubic = 0.044715f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    const float inner = k_sqrt_2_over_pi * (g + k_cubic * g * g * g);
    out[i] = 0.5f * g * (1.0f + tanhf(inner)) * up[i];
  }
}

void geglu_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int k_threads = 256;
  const int64_t blocks = (n + k_threads - 1) / k_threads;
  geglu_kernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), k_threads, 0, stream>>>(gate, up, out, n);
}

}  // namespace snap::kernels
