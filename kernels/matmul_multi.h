// Several matrices that read the same input (a layer's q/k/v projections, gate/up) in one
// call: their decode-row matvecs share one OpenMP parallel region (one fork/join and one
// barrier instead of one per matrix) and, with q8act, one quantization of x. Each output is
// bitwise what matmul_cpu (rowwise = false) or matmul_rowwise_cpu (rowwise = true) would give
// for that matrix alone, so fusing changes no result and keeps batch invariance.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace snap::kernels {

constexpr int k_matmul_multi_max = 4;

struct MatmulOut {
  WeightView w;               // [rows_i, cols]; every matrix of a call has the same cols
  const float* bias = nullptr;  // [rows_i] or null
  float* y = nullptr;          // [num_tokens, rows_i]
};

// y_i = x · w_iᵀ (+ bias_i) for 1 ≤ count ≤ k_matmul_multi_max matrices. Without rowwise, a
// matrix whose num_tokens reaches matmul_cpu's sgemm threshold takes the sgemm path on its own.
void matmul_multi_cpu(const float* x, const MatmulOut* outs, int count, int64_t num_tokens, bool rowwise);

}  // namespace snap::kernels
