// CUDA twins of the CPU ops in kernels/kernels.h: same arguments (device pointers) plus the
// stream. Each launcher picks the launch shape; the kernels are `<op>_kernel` in <op>.cu.
// Errors are reported by the CUDA runtime (cudaGetLastError after the launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace snap::kernels {

// y[t, :] = x[t, :] / sqrt(mean(x[t, :]²) + eps) · weight; y may alias x. One block per token.
void rms_norm_cuda(const float* x, const float* weight, float* y, int64_t num_tokens, int64_t hidden_size, float eps,
                   cudaStream_t stream);
// In-place rotate_half RoPE of x[num_tokens, num_heads, head_dim]; inv_freq[head_dim/2] on device.
void rope_cuda(float* x, const int32_t* positions, int64_t num_tokens, int num_heads, int head_dim,
               const float* inv_freq, cudaStream_t stream);
// out[i] = silu(gate[i]) · up[i]; out may alias gate.
void swiglu_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

}  // namespace snap::kernels
