// Device helpers shared by the KV selection kernels (snapkv.cu, adakv.cu, h2o.cu): warp
// reductions, the query·key dot formed as the CPU forms it, and the shared-memory loads of a
// key tile from the paged cache and of query rows. Header-only (inline __device__), so every
// .cu that includes it gets its own copy without relocatable device code.
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/paged_kv.cuh"

namespace snap::kernels::selection {

constexpr int k_tile = 64;   // keys per block (one thread per key in the column kernels)
constexpr int k_qrows = 32;  // query rows per shared-memory chunk

inline __device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
inline __device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// q · k, d ascending, every product and sum rounded separately (no FMA), as the CPU's qk_tile.
inline __device__ float dot_as_cpu(const float* q, const float* k, int hd) {
  float acc = 0.0f;
  for (int d = 0; d < hd; ++d) acc = __fadd_rn(acc, __fmul_rn(q[d], k[d]));
  return acc;
}

// Logical key j of a head (bf16 in the paged cache), element d, as f32.
inline __device__ float paged_key(const PagedKvCuda& kv, const PagedKvHead& head, int64_t j, int hd, int d) {
  return __bfloat162float(paged::kv_rows(kv, head, j, hd).k[d]);
}

// Loads keys [j0, j0 + n) of a head into k_s[k_tile][hd + 1] as f32 (+1: no bank conflicts
// when each thread walks its own key).
inline __device__ void load_key_tile(const PagedKvCuda& kv, const PagedKvHead& head, int64_t j0, int n, int hd,
                                     float* k_s) {
  for (int idx = threadIdx.x; idx < n * hd; idx += blockDim.x) {
    const int jj = idx / hd, d = idx % hd;
    k_s[jj * (hd + 1) + d] = paged_key(kv, head, j0 + jj, hd, d);
  }
}

// Shared memory of a kernel holding one key tile and one chunk of query rows.
inline size_t tile_smem_bytes(int hd) {
  return sizeof(float) * (static_cast<size_t>(k_tile) * (hd + 1) + static_cast<size_t>(k_qrows) * hd);
}

}  // namespace snap::kernels::selection
