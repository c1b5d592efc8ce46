// kernels/cuda/cublas_lazy.h's handles on the host twin (cuda_runtime.h here) and the kernel
// emulator (../emu): nothing to load; a handle is a token that matmul_bf16_cuda requires to be
// non-null. cublas_gemm_ex is each one's own (kernels_host.cpp; ../emu/cublas_emu.cpp).
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

}  // namespace snap::kernels
