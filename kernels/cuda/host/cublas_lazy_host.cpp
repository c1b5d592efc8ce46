// kernels/cuda/cublas_lazy.h on the host twin (cuda_runtime.h here): nothing to load; a handle
// is a token that matmul_bf16_cuda's CPU twin (kernels_host.cpp) requires to be non-null.
#include "kernels/cuda/cublas_lazy.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace snap::kernels {

bool cublas_load() { return true; }
bool cublas_loaded() { return true; }

const std::string& cublas_load_error() {
  static const std::string none;
  return none;
}

cublasStatus_t cublas_create(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublas_destroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublas_set_stream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

// Only matmul_bf16_cuda calls cuBLAS, and its twin does not: a direct call has no twin.
cublasStatus_t cublas_gemm_ex(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                              const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) {
  return CUBLAS_STATUS_NOT_INITIALIZED;
}

}  // namespace snap::kernels
