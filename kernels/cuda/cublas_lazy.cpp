// cublas_lazy.h: dlopen libcublas once, resolve the four entry points by their exported names
// (cublas_v2.h maps cublasCreate to cublasCreate_v2 and so on), forward to them.
#include "kernels/cuda/cublas_lazy.h"

#include <dlfcn.h>

#include <mutex>

namespace snap::kernels {

namespace {

// The C signatures of the exported symbols (cublasGemmEx also has a C++ overload, so no decltype).
using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct Api {
  CreateFn create = nullptr;
  DestroyFn destroy = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm_ex = nullptr;
  bool ok = false;
  std::string error;
};

Api load_api() {
  Api api;
  const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef SNAP_CUDA_LIBRARY_DIR
  if (lib == nullptr) lib = dlopen((std::string(SNAP_CUDA_LIBRARY_DIR) + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
  if (lib == nullptr) {
    const char* e = dlerror();
    api.error = "cannot load " + name + ": " + (e ? e : "dlopen failed");
    return api;
  }
  auto sym = [&](const char* s) {
    void* p = dlsym(lib, s);
    if (p == nullptr && api.error.empty()) api.error = name + ": no symbol " + s;
    return p;
  };
  api.create = reinterpret_cast<decltype(api.create)>(sym("cublasCreate_v2"));
  api.destroy = reinterpret_cast<decltype(api.destroy)>(sym("cublasDestroy_v2"));
  api.set_stream = reinterpret_cast<decltype(api.set_stream)>(sym("cublasSetStream_v2"));
  api.gemm_ex = reinterpret_cast<decltype(api.gemm_ex)>(sym("cublasGemmEx"));
  api.ok = api.error.empty();
  return api;
}

std::once_flag g_once;
Api g_api;

const Api& api() {
  std::call_once(g_once, [] { g_api = load_api(); });
  return g_api;
}

}  // namespace

bool cublas_load() { return api().ok; }

bool cublas_loaded() {
  // Reading g_api before call_once ran would race; a flag set inside it would too. The loader
  // tells: the library is resident once loaded (RTLD_NOLOAD opens nothing new).
  const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) dlclose(h);
  return h != nullptr;
}

const std::string& cublas_load_error() { return api().error; }

cublasStatus_t cublas_create(cublasHandle_t* handle) {
  return api().ok ? api().create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublas_destroy(cublasHandle_t handle) {
  return api().ok ? api().destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublas_set_stream(cublasHandle_t handle, cudaStream_t stream) {
  return api().ok ? api().set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublas_gemm_ex(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
                              cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
                              cublasComputeType_t compute_type, cublasGemmAlgo_t algo) {
  if (!api().ok) return CUBLAS_STATUS_NOT_INITIALIZED;
  return api().gemm_ex(handle, transa, transb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type, ldc,
                       compute_type, algo);
}

}  // namespace snap::kernels
