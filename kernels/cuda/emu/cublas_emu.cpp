// cublasGemmEx for the kernel emulator (its handles: ../host/cublas_lazy_host.cpp), computed with
// its documented meaning (column-major, C = alpha op(A) op(B) + beta C, bf16 or f32 inputs and
// output, f32 compute), so that matmul_bf16_cuda's own code — its cuBLAS call and the bias
// kernel after it — runs as written. The sum over k is sequential in f32; cuBLAS's order is its
// own, which the tests' bf16 tolerances cover.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/cublas_lazy.h"

namespace snap::kernels {

namespace {

size_t elem_bytes(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

float load(const void* p, cudaDataType t, size_t i) {
  if (t == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

}  // namespace

cublasStatus_t cublas_gemm_ex(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                              cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                              cublasComputeType_t compute_type, cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || compute_type != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_INVALID_VALUE;
  // Leading dimensions as cuBLAS checks them: at least the stored rows of each matrix.
  const int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
  const int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
  if (lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  auto span = [](int ld, int cols, cudaDataType t) {
    return cols == 0 ? size_t{0} : (static_cast<size_t>(ld) * (cols - 1) + 1) * elem_bytes(t);
  };
  if ((k > 0 && (!snap::hostcuda::is_device(a, span(lda, a_cols, a_type)) ||
                 !snap::hostcuda::is_device(b, span(ldb, b_cols, b_type)))) ||
      !snap::hostcuda::is_device(c, span(ldc, n, c_type))) {
    snap::hostcuda::set_error(cudaErrorIllegalAddress, "kernel emulator: cublasGemmEx: a matrix is not device memory");
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // op(A)'s rows and op(B)'s columns unpacked to f32 once, each contiguous over k, then each
  // output's sum runs over p = 0..k-1 in order as before; eight outputs of a column at a time
  // (eight independent chains) so that the loop is not bound by one add's latency.
  std::vector<float> ar(static_cast<size_t>(m) * k), bc(static_cast<size_t>(n) * k);
  for (int i = 0; i < m; ++i)
    for (int p = 0; p < k; ++p)
      ar[static_cast<size_t>(i) * k + p] =
          load(a, a_type, transa == CUBLAS_OP_N ? static_cast<size_t>(p) * lda + i : static_cast<size_t>(i) * lda + p);
  for (int j = 0; j < n; ++j)
    for (int p = 0; p < k; ++p)
      bc[static_cast<size_t>(j) * k + p] =
          load(b, b_type, transb == CUBLAS_OP_N ? static_cast<size_t>(j) * ldb + p : static_cast<size_t>(p) * ldb + j);
  constexpr int kRows = 8;
  for (int j = 0; j < n; ++j) {
    const float* bj = bc.data() + static_cast<size_t>(j) * k;
    for (int i0 = 0; i0 < m; i0 += kRows) {
      const int rows = std::min(kRows, m - i0);
      float acc[kRows] = {};
      const float* a0 = ar.data() + static_cast<size_t>(i0) * k;
      if (rows == kRows) {
        for (int p = 0; p < k; ++p)
          for (int r = 0; r < kRows; ++r) acc[r] += a0[static_cast<size_t>(r) * k + p] * bj[p];
      } else {
        for (int r = 0; r < rows; ++r)
          for (int p = 0; p < k; ++p) acc[r] += a0[static_cast<size_t>(r) * k + p] * bj[p];
      }
      for (int r = 0; r < rows; ++r) {
        const size_t ci = static_cast<size_t>(j) * ldc + i0 + r;
        const float v = be == 0.0f ? al * acc[r] : al * acc[r] + be * load(c, c_type, ci);  // beta 0: C not read
        if (c_type == CUDA_R_16BF)
          static_cast<__nv_bfloat16*>(c)[ci] = __float2bfloat16(v);
        else
          static_cast<float*>(c)[ci] = v;
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace snap::kernels
