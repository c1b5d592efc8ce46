// The host twin of <cublas_v2.h> (see cuda_runtime.h here): the types that
// kernels/cuda/cublas_lazy.h and the device forward name. The GEMM itself is
// matmul_bf16_cuda's CPU twin (kernels_host.cpp); cublas_lazy_host.cpp hands out handles.
#pragma once

#include "cuda_runtime.h"

struct cublasContext;
using cublasHandle_t = cublasContext*;

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
