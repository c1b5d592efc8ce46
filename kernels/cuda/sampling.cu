// CUDA twin of greedy sampling (sample_cpu at temperature 0): per row, the argmax with the
// CPU's rule — strictly greater wins, so the lowest id wins ties and NaN never wins; a row
// of only -inf/NaN gives id 0. One 256-thread block per row: strided scan, then a shared-
// memory tree whose combine keeps (larger value, else lower id), so the order of the scan
// cannot change the answer. Only num_tokens int32 ids cross to the host, not the logits.
#include <cmath>

#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

namespace {
constexpr int k_threads = 256;
constexpr int64_t k_none = INT64_MAX;  // "no candidate yet"

__device__ bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);  // NaN compares false: never better
}
}  // namespace

__global__ void argmax_kernel(const float* logits, int64_t vocab_size, int32_t* ids) {
  __shared__ float sv[k_threads];
  __shared__ int64_t si[k_threads];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab_size;
  float bv = -INFINITY;
  int64_t bi = k_none;
  for (int64_t i = threadIdx.x; i < vocab_size; i += k_threads) {
    const float v = row[i];
    if (v > bv) {  // ascending i per thread: strict > keeps the lowest id of equal values
      bv = v;
      bi = i;
    }
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = k_threads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && si[threadIdx.x + s] != k_none &&
        (si[threadIdx.x] == k_none || better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x]))) {
      sv[threadIdx.x] = sv[threadIdx.x + s];
      si[threadIdx.x] = si[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = si[0] == k_none ? 0 : static_cast<int32_t>(si[0]);
}

void argmax_cuda(const float* logits, int64_t num_tokens, int64_t vocab_size, int32_t* ids, cudaStream_t stream) {
  if (num_tokens <= 0) return;
  argmax_kernel<<<static_cast<unsigned>(num_tokens), k_threads, 0, stream>>>(logits, vocab_size, ids);
}

}  // namespace snap::kernels
