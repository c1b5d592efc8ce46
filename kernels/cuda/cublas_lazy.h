// cuBLAS opened on first use (dlopen), not linked: linking libcublas maps libcublasLt into every
// process at start, about 150 MiB of resident memory (measured: dlopen of libcublas.so.13 alone
// +154 MiB RSS, libcudart +0.7, libnccl +2.5), which CPU runs of a CUDA-enabled snapserve paid
// for nothing. The four functions the device path calls go through here; the first of them
// loads the library. Without it (not installed, not on the loader's path) every call returns
// CUBLAS_STATUS_NOT_INITIALIZED and cublas_load_error() says why.
#pragma once

#include <cublas_v2.h>

#include <string>

namespace snap::kernels {

// Loads libcublas.so.<major of the headers> (the loader's search path, then the toolkit's
// library directory this was built against); true when its four functions are resolved.
// Thread-safe; tries once.
bool cublas_load();
// Whether cublas_load() succeeded already (without trying).
bool cublas_loaded();
// Why cublas_load() failed ("" when it did not).
const std::string& cublas_load_error();

cublasStatus_t cublas_create(cublasHandle_t* handle);
cublasStatus_t cublas_destroy(cublasHandle_t handle);
cublasStatus_t cublas_set_stream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublas_gemm_ex(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                              cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                              cublasComputeType_t compute_type, cublasGemmAlgo_t algo);

}  // namespace snap::kernels
