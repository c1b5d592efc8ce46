// CUDA twin of rope_cpu (rotate_half layout): one thread per (token, head, pair i); rope_qk_cuda
// rotates a layer's q and k in one launch, each element as rope_cuda would. The
// angle is formed in f64 like the CPU paths (pos·inv_freq reaches ~1e4 rad at 8K, where an
// f32 product is off by 5e-4); sincos in f64 costs little next to the memory traffic.
#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

namespace {
// Pair i of row th (token · num_heads + head) of x: the rotation every RoPE launch applies.
__device__ void rope_pair(float* x, const int32_t* positions, int num_heads, int head_dim, const float* inv_freq,
                          int64_t idx) {
  const int half = head_dim / 2;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;  // token * num_heads + head
  const int64_t t = th / num_heads;
  double s, c;
  sincos(static_cast<double>(positions[t]) * inv_freq[i], &s, &c);
  float* v = x + th * head_dim;
  const float a = v[i], b = v[i + half];
  const float cf = static_cast<float>(c), sf = static_cast<float>(s);
  v[i] = a * cf - b * sf;
  v[i + half] = b * cf + a * sf;
}
}  // namespace

// Threads [0, q_pairs) rotate q, the rest k (k_heads 0: q only).
__global__ void rope_kernel(float* q, int q_heads, float* k, int k_heads, const int32_t* positions, int64_t num_tokens,
                            int head_dim, const float* inv_freq) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t q_pairs = num_tokens * q_heads * (head_dim / 2);
  if (idx < q_pairs)
    rope_pair(q, positions, q_heads, head_dim, inv_freq, idx);
  else if (idx - q_pairs < num_tokens * k_heads * (head_dim / 2))
    rope_pair(k, positions, k_heads, head_dim, inv_freq, idx - q_pairs);
}

namespace {
void launch_rope(float* q, int q_heads, float* k, int k_heads, const int32_t* positions, int64_t num_tokens,
                 int head_dim, const float* inv_freq, cudaStream_t stream) {
  const int64_t total = num_tokens * (q_heads + k_heads) * (head_dim / 2);
  if (total <= 0) return;
  constexpr int k_threads = 256;
  const auto blocks = static_cast<unsigned>((total + k_threads - 1) / k_threads);
  rope_kernel<<<blocks, k_threads, 0, stream>>>(q, q_heads, k, k_heads, positions, num_tokens, head_dim, inv_freq);
}
}  // namespace

void rope_cuda(float* x, const int32_t* positions, int64_t num_tokens, int num_heads, int head_dim,
               const float* inv_freq, cudaStream_t stream) {
  launch_rope(x, num_heads, nullptr, 0, positions, num_tokens, head_dim, inv_freq, stream);
}

void rope_qk_cuda(float* q, int q_heads, float* k, int k_heads, const int32_t* positions, int64_t num_tokens,
                  int head_dim, const float* inv_freq, cudaStream_t stream) {
  launch_rope(q, q_heads, k, k_heads, positions, num_tokens, head_dim, inv_freq, stream);
}

}  // namespace snap::kernels
