// The kernel emulator's WMMA (nvcuda::wmma, CUDA's <mma.h>): the m16n16k16 shape with bf16
// A/B operands and f32 accumulators, as the kernels use it.
// Each operation is warp-collective, as on the GPU: every lane of the warp must reach the
// same one (snap_emu::warp_collective), which then runs once over all 32 lanes' fragments.
//  - Element mapping. CUDA leaves unspecified which element of the 16×16 tile each lane's
//    x[e] holds. Here lane l's x[e] holds the tile's element k(l, e) = ((8l + e)·77 + 29) mod
//    256 (row-major index): a scrambled bijection, so a kernel that assumes a layout gets
//    wrong results here instead of passing by luck. What CUDA does promise holds: the mapping
//    is the same for every fragment of one kind, so an element-wise operation on x[] of
//    fragments of one kind lines up, and a tile loaded into an accumulator tells each lane
//    which row or column its elements are.
//  - Checks (faults that end the launch, naming the operation): every lane must pass the same
//    pointer, ldm and layout; the pointer must be 256-bit (32-byte) aligned and ldm a multiple
//    of 16 bytes (8 bf16 or 4 floats), as the CUDA C++ Programming Guide requires.
//  - mma_sync: D = A·B + C, each element accumulated in f32 from C over k = 0..15 (a bf16
//    product is exact in f32; the tensor cores' own summation order is not specified, so
//    results may differ from a GPU's in the last bits).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/emu/kernel_lang.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the kernel emulator models WMMA's m16n16k16 shape only");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float> : std::is_same_v<T, __nv_bfloat16>,
                "the kernel emulator models bf16 A/B fragments and f32 accumulators");

 public:
  static constexpr int num_elements = 8;
  T x[num_elements];
};

namespace detail {
constexpr int k_tile = 256;
// The tile element (row-major index) that lane l's x[e] holds.
constexpr int element_of(int lane, int e) { return ((lane * 8 + e) * 77 + 29) & 255; }

inline thread_local std::string t_error;

struct Io {
  void* x;          // this lane's fragment elements
  const void* ptr;  // the tile in memory
  unsigned ldm;
  bool col;         // column-major in memory
  size_t elem;      // element bytes
};

// All lanes name the same tile, aligned as WMMA requires; null when they do.
inline const char* check_io(void* const* args) {
  const Io& a = *static_cast<const Io*>(args[0]);
  for (int l = 1; l < 32; ++l) {
    const Io& b = *static_cast<const Io*>(args[l]);
    if (b.ptr != a.ptr || b.ldm != a.ldm || b.col != a.col)
      return (t_error = "lane " + std::to_string(l) + " passes another pointer, ldm or layout than lane 0").c_str();
  }
  if (reinterpret_cast<uintptr_t>(a.ptr) % 32 != 0)
    return (t_error = "the pointer is not 256-bit aligned (address % 32 = " +
                      std::to_string(reinterpret_cast<uintptr_t>(a.ptr) % 32) + ")")
        .c_str();
  if ((a.ldm * a.elem) % 16 != 0)
    return (t_error = "ldm " + std::to_string(a.ldm) + " is not a multiple of 16 bytes").c_str();
  if (a.ldm < 16) return (t_error = "ldm " + std::to_string(a.ldm) + " is less than the tile's 16").c_str();
  return nullptr;
}

inline size_t offset(int idx, unsigned ldm, bool col) {
  const int r = idx / 16, c = idx % 16;
  return col ? static_cast<size_t>(c) * ldm + r : static_cast<size_t>(r) * ldm + c;
}

template <typename T>
const char* load_fn(void* const* args, uint32_t) {
  if (const char* err = check_io(args)) return err;
  const Io& a = *static_cast<const Io*>(args[0]);
  const T* src = static_cast<const T*>(a.ptr);
  for (int l = 0; l < 32; ++l) {
    T* x = static_cast<T*>(static_cast<const Io*>(args[l])->x);
    for (int e = 0; e < 8; ++e) x[e] = src[offset(element_of(l, e), a.ldm, a.col)];
  }
  return nullptr;
}

inline const char* store_fn(void* const* args, uint32_t) {
  if (const char* err = check_io(args)) return err;
  const Io& a = *static_cast<const Io*>(args[0]);
  float* dst = static_cast<float*>(const_cast<void*>(a.ptr));
  for (int l = 0; l < 32; ++l) {
    const float* x = static_cast<const float*>(static_cast<const Io*>(args[l])->x);
    for (int e = 0; e < 8; ++e) dst[offset(element_of(l, e), a.ldm, a.col)] = x[e];
  }
  return nullptr;
}

struct Mma {
  float* d;
  const __nv_bfloat16* a;
  const __nv_bfloat16* b;
  const float* c;
};

inline const char* mma_fn(void* const* args, uint32_t) {
  float A[k_tile], B[k_tile], C[k_tile];
  for (int l = 0; l < 32; ++l) {
    const Mma& m = *static_cast<const Mma*>(args[l]);
    for (int e = 0; e < 8; ++e) {
      const int k = element_of(l, e);
      A[k] = __bfloat162float(m.a[e]);
      B[k] = __bfloat162float(m.b[e]);
      C[k] = m.c[e];
    }
  }
  for (int l = 0; l < 32; ++l) {  // every input is read above, so d may be c
    const Mma& m = *static_cast<const Mma*>(args[l]);
    for (int e = 0; e < 8; ++e) {
      const int k = element_of(l, e), i = k / 16, j = k % 16;
      float acc = C[k];
      for (int kk = 0; kk < 16; ++kk) acc += A[i * 16 + kk] * B[kk * 16 + j];  // bf16 products: exact in f32
      m.d[e] = acc;
    }
  }
  return nullptr;
}
}  // namespace detail

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const T& v) {
  for (int e = 0; e < f.num_elements; ++e) f.x[e] = v;
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  for (int e = 0; e < f.num_elements; ++e) f.x[e] = v;
}

template <typename Use, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p, unsigned ldm) {
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                "an A or B fragment names its layout");
  detail::Io io{f.x, p, ldm, std::is_same_v<Layout, col_major>, sizeof(__nv_bfloat16)};
  snap_emu::warp_collective(0xffffffffu, &io, &detail::load_fn<__nv_bfloat16>, "wmma::load_matrix_sync");
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  detail::Io io{f.x, p, ldm, layout == mem_col_major, sizeof(float)};
  snap_emu::warp_collective(0xffffffffu, &io, &detail::load_fn<float>, "wmma::load_matrix_sync");
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  detail::Io io{const_cast<float*>(f.x), p, ldm, layout == mem_col_major, sizeof(float)};
  snap_emu::warp_collective(0xffffffffu, &io, &detail::store_fn, "wmma::store_matrix_sync");
}
template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  detail::Mma m{d.x, a.x, b.x, c.x};
  snap_emu::warp_collective(0xffffffffu, &m, &detail::mma_fn, "wmma::mma_sync");
}

}  // namespace nvcuda::wmma
