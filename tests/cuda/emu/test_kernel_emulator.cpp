// The kernel emulator (kernels/cuda/emu) against what CUDA guarantees: a right kernel gives the
// right result under every schedule; a race, a barrier some threads never reach, a partial-warp
// shuffle and a divergent barrier are faults or visible differences, never a silent pass; the
// launch limits and shared-memory rules are the runtime's; cub's sorts and cublasGemmEx mean
// what their documentation says. The kernels are probe_kernels.cu, compiled through the same
// emu_rewrite.py as kernels/cuda/*.cu.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cuda/cublas_lazy.h"
#include "kernels/cuda/emu/emu.h"
#include "tests/cuda/emu/probe_kernels.h"

namespace {

using namespace snap::emu_probe;

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n;
  explicit Dev(size_t count, const T* init = nullptr) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, sizeof(T) * std::max<size_t>(n, 1)), cudaSuccess);
    if (init) cudaMemcpy(p, init, sizeof(T) * n, cudaMemcpyHostToDevice);
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size(), v.data()) {}
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost);
    return h;
  }
};

class Emulator : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = snap_emu::schedule();
    (void)cudaGetLastError();
  }
  void TearDown() override {
    snap_emu::set_schedule(saved_);
    (void)cudaGetLastError();
  }
  snap_emu::Schedule saved_{};
};

TEST_F(Emulator, RightKernelIsRightUnderEverySchedule) {
  std::vector<float> x(4 * 256);
  std::iota(x.begin(), x.end(), 1.0f);
  for (auto s : {snap_emu::Schedule::forward, snap_emu::Schedule::reverse, snap_emu::Schedule::shuffle}) {
    snap_emu::set_schedule(s);
    Dev<float> dx(x), out(4);
    ASSERT_EQ(block_sum(dx.p, out.p, 4, nullptr), cudaSuccess);
    const auto o = out.get();
    for (int b = 0; b < 4; ++b) {
      const double lo = 256.0 * b + 1, hi = 256.0 * (b + 1);
      EXPECT_EQ(o[b], static_cast<float>((lo + hi) * 256 / 2)) << "block " << b << " schedule " << static_cast<int>(s);
    }
  }
}

TEST_F(Emulator, MissingBarrierShowsAsScheduleDependence) {
  Dev<float> out(1);
  snap_emu::set_schedule(snap_emu::Schedule::forward);
  ASSERT_EQ(missing_barrier(out.p, nullptr), cudaSuccess);
  const float forward = out.get()[0];
  snap_emu::set_schedule(snap_emu::Schedule::reverse);
  ASSERT_EQ(missing_barrier(out.p, nullptr), cudaSuccess);
  const float reverse = out.get()[0];
  EXPECT_TRUE(std::isnan(forward)) << "thread 0 ran first and read fresh (0xFF) shared memory: " << forward;
  EXPECT_EQ(reverse, 31.0f);
}

TEST_F(Emulator, SyncthreadsAfterAnEarlyReturnIsAFault) {
  Dev<float> out(64);
  const long long before = snap_emu::faults();
  EXPECT_EQ(early_return(out.p, 40, nullptr), cudaErrorLaunchFailure);
  EXPECT_EQ(snap_emu::faults(), before + 1);
  const std::string what = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(what.find("early_return_kernel"), std::string::npos) << what;
  EXPECT_NE(what.find("__syncthreads reached by 40 of 64 threads"), std::string::npos) << what;
  // The error is sticky until read, as on a GPU; the same kernel with every thread is fine.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(early_return(out.p, 64, nullptr), cudaSuccess);
}

TEST_F(Emulator, FullMaskShuffleInAPartialWarpIsAFault) {
  Dev<float> out(16);
  EXPECT_EQ(partial_warp(out.p, nullptr), cudaErrorLaunchFailure);
  const std::string what = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(what.find("does not have"), std::string::npos) << what;
}

TEST_F(Emulator, DivergentBarrierIsADeadlockFault) {
  Dev<float> out(64);
  EXPECT_EQ(divergent_barrier(out.p, nullptr), cudaErrorLaunchFailure);
  const std::string what = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(what.find("deadlock: 32 threads at __syncthreads, 32 at warp shuffles"), std::string::npos) << what;
}

TEST_F(Emulator, SharedMemoryIsFreshInEveryBlock) {
  Dev<unsigned> out(3);
  ASSERT_EQ(fresh_shared(out.p, 3, nullptr), cudaSuccess);
  for (unsigned v : out.get()) EXPECT_EQ(v, 0xffffffffu);  // never the previous block's 12345
}

TEST_F(Emulator, DynamicSharedMemoryAndTheLaunchLimits) {
  Dev<int> out(2 * 1024);
  // 2 blocks (y) of 1024 threads, 4 KiB of dynamic shared memory each: every thread reads its mirror.
  ASSERT_EQ(dynamic_shared(out.p, dim3(1, 2), dim3(1024), 4096, -1, nullptr), cudaSuccess);
  const auto o = out.get();
  EXPECT_EQ(o[0], 1023);
  EXPECT_EQ(o[1024 + 1], 1000 + 1022);
  // More than 48 KiB needs the attribute; with it, up to 227 KiB.
  EXPECT_EQ(dynamic_shared(out.p, dim3(1), dim3(32), 64 * 1024, -1, nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("cudaFuncAttributeMaxDynamicSharedMemorySize"),
            std::string::npos);
  (void)cudaGetLastError();
  EXPECT_EQ(dynamic_shared(out.p, dim3(1), dim3(32), 64 * 1024, 64 * 1024, nullptr), cudaSuccess);
  EXPECT_EQ(dynamic_shared(out.p, dim3(1), dim3(32), 0, 228 * 1024, nullptr), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  // Blocks of more than 1024 threads, empty grids and grid.y beyond 65535 are refused.
  EXPECT_EQ(dynamic_shared(out.p, dim3(1), dim3(1025), 0, -1, nullptr), cudaErrorInvalidConfiguration);
  (void)cudaGetLastError();
  EXPECT_EQ(dynamic_shared(out.p, dim3(0), dim3(32), 0, -1, nullptr), cudaErrorInvalidConfiguration);
  (void)cudaGetLastError();
  EXPECT_EQ(dynamic_shared(out.p, dim3(1, 65536), dim3(32), 0, -1, nullptr), cudaErrorInvalidConfiguration);
}

TEST_F(Emulator, HostPointerArgumentIsAnIllegalAddress) {
  std::vector<float> host(64);
  EXPECT_EQ(partial_warp(host.data(), nullptr), cudaErrorIllegalAddress);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorIllegalAddress)).find("argument 0 is not device memory"),
            std::string::npos);
}

TEST_F(Emulator, RadixSortsAreStableWithCubsFloatOrder) {
  // Descending pairs: ties keep their input order (lower index first); -0.0 equals +0.0.
  const std::vector<float> keys = {1.0f, -0.0f, 3.0f, 1.0f, 0.0f, -2.0f, 3.0f, 0.0f};
  std::vector<int> ids(keys.size());
  std::iota(ids.begin(), ids.end(), 0);
  Dev<float> k_in(keys), k_out(keys.size());
  Dev<int> v_in(ids), v_out(ids.size());
  size_t tmp_bytes = 0;
  ASSERT_EQ(cub::DeviceRadixSort::SortPairsDescending(nullptr, tmp_bytes, k_in.p, k_out.p, v_in.p, v_out.p,
                                                      static_cast<int>(keys.size())),
            cudaSuccess);
  Dev<char> tmp(tmp_bytes);
  ASSERT_EQ(cub::DeviceRadixSort::SortPairsDescending(tmp.p, tmp_bytes, k_in.p, k_out.p, v_in.p, v_out.p,
                                                      static_cast<int>(keys.size())),
            cudaSuccess);
  EXPECT_EQ(v_out.get(), (std::vector<int>{2, 6, 0, 3, 1, 4, 7, 5}));
  // Too little temp storage is refused, as is a host buffer.
  size_t small = tmp_bytes - 1;
  EXPECT_EQ(cub::DeviceRadixSort::SortPairsDescending(tmp.p, small, k_in.p, k_out.p, v_in.p, v_out.p,
                                                      static_cast<int>(keys.size())),
            cudaErrorInvalidValue);
  std::vector<float> host_out(keys.size());
  EXPECT_EQ(cub::DeviceRadixSort::SortPairsDescending(tmp.p, tmp_bytes, k_in.p, host_out.data(), v_in.p, v_out.p,
                                                      static_cast<int>(keys.size())),
            cudaErrorIllegalAddress);
  // Segmented ascending keys: each segment on its own, items outside every segment untouched.
  const std::vector<int> ik = {5, -1, 3, 9, 9, 2, 7, 100};
  Dev<int> s_in(ik), s_out(std::vector<int>(ik.size(), 42));
  Dev<int> begin(std::vector<int>{0, 3}), end(std::vector<int>{3, 7});
  size_t sb = 0;
  ASSERT_EQ(cub::DeviceSegmentedRadixSort::SortKeys(nullptr, sb, s_in.p, s_out.p, 8, 2, begin.p, end.p), cudaSuccess);
  Dev<char> stmp(sb);
  ASSERT_EQ(cub::DeviceSegmentedRadixSort::SortKeys(stmp.p, sb, s_in.p, s_out.p, 8, 2, begin.p, end.p), cudaSuccess);
  EXPECT_EQ(s_out.get(), (std::vector<int>{-1, 3, 5, 2, 7, 9, 9, 42}));
}

TEST_F(Emulator, GemmExIsColumnMajorOpTimesOp) {
  // matmul_bf16_cuda's call: C (rows x tokens, f32) = W^T (W: cols x rows, bf16) * X (cols x tokens, bf16).
  const int rows = 3, tokens = 2, cols = 4;
  std::vector<__nv_bfloat16> w(static_cast<size_t>(rows) * cols), x(static_cast<size_t>(cols) * tokens);
  std::vector<float> wf(w.size()), xf(x.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = __float2bfloat16(wf[i] = static_cast<float>(i % 5) - 2.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = __float2bfloat16(xf[i] = 0.5f * static_cast<float>(i) - 1.0f);
  Dev<__nv_bfloat16> dw(w), dx(x);
  Dev<float> dy(static_cast<size_t>(rows) * tokens);
  cublasHandle_t h = nullptr;
  ASSERT_EQ(snap::kernels::cublas_create(&h), CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  ASSERT_EQ(snap::kernels::cublas_gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &alpha, dw.p, CUDA_R_16BF,
                                          cols, dx.p, CUDA_R_16BF, cols, &beta, dy.p, CUDA_R_32F, rows,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  const auto y = dy.get();
  for (int t = 0; t < tokens; ++t)
    for (int r = 0; r < rows; ++r) {
      float ref = 0.0f;
      for (int c = 0; c < cols; ++c) ref += wf[static_cast<size_t>(r) * cols + c] * xf[static_cast<size_t>(t) * cols + c];
      EXPECT_EQ(y[static_cast<size_t>(t) * rows + r], ref) << "row " << r << " token " << t;
    }
  // A leading dimension shorter than the stored rows is refused, as cuBLAS does.
  EXPECT_EQ(snap::kernels::cublas_gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &alpha, dw.p, CUDA_R_16BF,
                                          cols - 1, dx.p, CUDA_R_16BF, cols, &beta, dy.p, CUDA_R_32F, rows,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  snap::kernels::cublas_destroy(h);
}

// WMMA as CUDA documents it: D = A·B + C per 16×16 tile in f32 from bf16 operands, whatever the
// (unspecified, here scrambled) element mapping; an accumulator loaded from a tile of row
// indices tells each lane its elements' rows. A misaligned pointer and lanes that disagree
// are faults; code that assumes a mapping gets wrong numbers, not a pass.
TEST_F(Emulator, WmmaIsATileProductWhateverTheMapping) {
  std::vector<__nv_bfloat16> a(256), b(256);
  std::vector<float> c(256), rows(256), fa(256), fb(256);
  for (int i = 0; i < 256; ++i) {
    a[i] = __float2bfloat16(static_cast<float>((i * 7) % 13) - 6.0f);  // A row-major: (r, k) at r*16 + k
    b[i] = __float2bfloat16(static_cast<float>((i * 5) % 11) * 0.5f);  // B col-major: (k, n) at n*16 + k
    fa[i] = __bfloat162float(a[i]);
    fb[i] = __bfloat162float(b[i]);
    c[i] = 0.25f * static_cast<float>(i % 9);
    rows[i] = static_cast<float>(i / 16);
  }
  std::vector<float> want(256);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float acc = c[r * 16 + n];
      for (int k = 0; k < 16; ++k) acc += fa[r * 16 + k] * fb[n * 16 + k];
      want[r * 16 + n] = acc * static_cast<float>(r + 1);
    }
  Dev<__nv_bfloat16> da(a), db(b);
  Dev<float> dc(c), drows(rows), dd(256 + 32);
  for (int mode : {0, 4}) {
    ASSERT_EQ(wmma_probe(da.p, db.p, dc.p, dd.p, drows.p, mode, nullptr), cudaSuccess) << "mode " << mode;
    const auto got = dd.get();
    for (int i = 0; i < 256; ++i) ASSERT_EQ(got[i], want[i]) << "element " << i << " mode " << mode;
    if (mode == 4) {
      for (int l = 0; l < 32; ++l) EXPECT_EQ(got[256 + l], static_cast<float>(31 - l)) << "lane " << l;
    }
  }
  EXPECT_EQ(wmma_probe(da.p, db.p, dc.p, dd.p, drows.p, 1, nullptr), cudaErrorLaunchFailure);
  std::string what = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(what.find("not 256-bit aligned"), std::string::npos) << what;
  EXPECT_EQ(wmma_probe(da.p, db.p, dc.p, dd.p, drows.p, 2, nullptr), cudaErrorLaunchFailure);
  what = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(what.find("lane 5 passes another pointer"), std::string::npos) << what;
  ASSERT_EQ(wmma_probe(da.p, db.p, dc.p, dd.p, drows.p, 3, nullptr), cudaSuccess);
  const auto assumed = dd.get();
  int wrong = 0;
  for (int i = 0; i < 256; ++i) wrong += assumed[i] != want[i];
  EXPECT_GT(wrong, 128) << "a kernel that assumes lane l holds elements 8l..8l+7 must not pass";
}

// PTX's mma.sync m16n8k16, ldmatrix and cp.async follow the layouts the PTX ISA documents
// (kernels/cuda/ptx.cuh): loaded and multiplied as attention_prefill_mma.cu does, the tiles
// give exactly A·Ktᵀ and A·V (small integers: every order of summation is exact). A cp.async
// lands only at its wait: a read before it sees the old bytes (0xFF: NaN). A zero-filled
// cp.async gives zeros; a misaligned ldmatrix address is a fault.
TEST_F(Emulator, PtxMmaLdmatrixCpAsyncFollowThePtxLayouts) {
  std::vector<__nv_bfloat16> a(256), kt(256), v(256);
  std::vector<float> fa(256), fk(256), fv(256);
  for (int i = 0; i < 256; ++i) {
    a[i] = __float2bfloat16(static_cast<float>((i * 7) % 13) - 6.0f);
    kt[i] = __float2bfloat16(static_cast<float>((i * 5) % 11) - 5.0f);
    v[i] = __float2bfloat16(static_cast<float>((i * 3) % 17) - 8.0f);
    fa[i] = __bfloat162float(a[i]);
    fk[i] = __bfloat162float(kt[i]);
    fv[i] = __bfloat162float(v[i]);
  }
  std::vector<float> want(512);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float qk = 0.0f, pv = 0.0f;
      for (int k = 0; k < 16; ++k) {
        qk += fa[r * 16 + k] * fk[n * 16 + k];
        pv += fa[r * 16 + k] * fv[k * 16 + n];
      }
      want[r * 16 + n] = qk;
      want[256 + r * 16 + n] = pv;
    }
  Dev<__nv_bfloat16> da(a), dk(kt), dv(v);
  Dev<float> dd(512);
  ASSERT_EQ(ptx_probe(da.p, dk.p, dv.p, dd.p, 0, nullptr), cudaSuccess);
  auto got = dd.get();
  for (int i = 0; i < 512; ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
  ASSERT_EQ(ptx_probe(da.p, dk.p, dv.p, dd.p, 3, nullptr), cudaSuccess);  // Kt rows 8..15 zero-filled
  got = dd.get();
  for (int i = 0; i < 512; ++i) {
    const bool zeroed = i < 256 && i % 16 >= 8;
    ASSERT_EQ(got[i], zeroed ? 0.0f : want[i]) << "element " << i << " (mode 3)";
  }
  ASSERT_EQ(ptx_probe(da.p, dk.p, dv.p, dd.p, 1, nullptr), cudaSuccess);  // read before the wait
  got = dd.get();
  int nan = 0;
  for (float x : got) nan += std::isnan(x);
  EXPECT_EQ(nan, 512) << "tiles read before their cp.async group completed must not hold the data";
  EXPECT_EQ(ptx_probe(da.p, dk.p, dv.p, dd.p, 2, nullptr), cudaErrorLaunchFailure);
  const std::string what = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_NE(what.find("lane 3's row address is not 16-byte aligned"), std::string::npos) << what;
}

}  // namespace
