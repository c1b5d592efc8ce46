// Internal to the NCCL backend: the device twin of sum_blocks_in_rank_order
// (comm/communicator.h), same order and rounding, so NCCL and MPI give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace snap::comm::detail {

enum class NcclSumType : int { f32 = 0, bf16 = 1, f16 = 2 };

// out[i] = round(sum over r in rank order of blocks[r × stride + i]) for i < count (stride
// >= count, in elements); f32 accumulator. out must not overlap the blocks.
cudaError_t nccl_sum_blocks_rank_order(const void* blocks, int num_blocks, int64_t stride, int64_t count,
                                       NcclSumType type, void* out, cudaStream_t stream);

}  // namespace snap::comm::detail
