// Device rank-order sum for the NCCL backend (see comm/nccl_sum.h). Conversions repeat
// common/dtype.h bit for bit (round to nearest even, quiet NaN) so host and device agree.
#include <cuda_fp16.h>

#include "comm/nccl_sum.h"

namespace snap::comm::detail {

namespace {

__device__ float load_f32(const void* p, int64_t i, NcclSumType t) {
  if (t == NcclSumType::f32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  if (t == NcclSumType::bf16) return __uint_as_float(static_cast<uint32_t>(h) << 16);
  return __half2float(__ushort_as_half(h));
}

__device__ void store_f32(void* p, int64_t i, NcclSumType t, float v) {
  if (t == NcclSumType::f32) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  uint16_t h;
  if (t == NcclSumType::bf16) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      h = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      h = static_cast<uint16_t>(u >> 16);
    }
  } else {
    h = __half_as_ushort(__float2half_rn(v));
  }
  static_cast<uint16_t*>(p)[i] = h;
}

__global__ void sum_rank_order_kernel(const uint8_t* blocks, int num_blocks, int64_t stride, int64_t count, int elem,
                                      NcclSumType type, void* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = load_f32(blocks, i, type);
    for (int r = 1; r < num_blocks; ++r) acc += load_f32(blocks + r * stride * elem, i, type);
    store_f32(out, i, type, acc);
  }
}

}  // namespace

cudaError_t nccl_sum_blocks_rank_order(const void* blocks, int num_blocks, int64_t stride, int64_t count,
                                       NcclSumType type, void* out, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int elem = type == NcclSumType::f32 ? 4 : 2;
  const int threads = 256;
  const int64_t want = (count + threads - 1) / threads;
  const int grid = static_cast<int>(want < 4096 ? want : 4096);
  sum_rank_order_kernel<<<grid, threads, 0, stream>>>(static_cast<const uint8_t*>(blocks), num_blocks, stride, count,
                                                      elem, type, out);
  return cudaGetLastError();
}

}  // namespace snap::comm::detail
