// Shared pieces of the CUDA tests (tests/cuda): CUDA_TRY, device buffers, bf16 round trips,
// and a paged per-KV-head cache built on the host (blocks shuffled so no head's blocks are
// adjacent) with its device copy and the f32 view the CPU references read. Test-only code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/attention_paged.h"
#include "kernels/cuda/kernels_cuda.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels::cuda_test {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

#define CUDA_TRY(expr)                                                                       \
  do {                                                                                       \
    const cudaError_t err_ = (expr);                                                         \
    if (err_ != cudaSuccess) return AssertionFailure() << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

// Device copy of a host vector, freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(const std::vector<T>& host) : n(host.size()) {
    if (cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)) == cudaSuccess && n > 0)
      cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit DeviceBuffer(size_t count) : DeviceBuffer(std::vector<T>(count)) {}
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    if (n > 0) cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// Launch check + synchronize, as every case does after its kernels.
inline AssertionResult sync_ok() {
  CUDA_TRY(cudaGetLastError());
  CUDA_TRY(cudaDeviceSynchronize());
  return AssertionSuccess();
}


inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}
inline const __nv_bfloat16* as_bf16(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
inline __nv_bfloat16* as_bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

struct AttnShape {
  const char* name;
  int num_heads, num_kv_heads, head_dim;
  std::vector<int64_t> lengths;  // per KV head
  int64_t num_tokens;            // queries
  bool decode;                   // queries after every key (else: the last num_tokens positions)
  bool gaps;                     // positions a sorted random subset (a compressed cache)
  int window;
};

inline constexpr int k_block = 16;

// A paged cache on the host (blocks shuffled, so no head's blocks are adjacent), its device
// copy, and the f32 view the CPU reference reads.
struct PagedFixture {
  std::vector<uint16_t> k, v;   // [num_blocks][k_block][head_dim] bf16
  std::vector<float> kf, vf;    // the same values in f32
  std::vector<int32_t> pos;     // [num_blocks][k_block]
  std::vector<std::vector<int32_t>> tables;
  std::vector<PagedKvHead> heads;
  int32_t max_pos = 0;
  int64_t max_len = 0;

  PagedFixture(const AttnShape& s, uint32_t seed) {
    std::mt19937 gen(seed);
    int64_t num_blocks = 0;
    for (int64_t len : s.lengths) num_blocks += (len + k_block - 1) / k_block;
    num_blocks += 3;  // unused blocks in between
    std::vector<int32_t> order(static_cast<size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    const size_t elems = static_cast<size_t>(num_blocks) * k_block * s.head_dim;
    kf = test::random_floats(static_cast<int64_t>(elems), seed + 1, -1.0f, 1.0f);
    vf = test::random_floats(static_cast<int64_t>(elems), seed + 2, -1.0f, 1.0f);
    k = to_bf16(kf);
    v = to_bf16(vf);
    kf = from_bf16(k);
    vf = from_bf16(v);
    pos.assign(static_cast<size_t>(num_blocks) * k_block, -1);
    int64_t next = 0;
    for (int64_t len : s.lengths) max_len = std::max(max_len, len);
    const int64_t span = s.gaps ? 2 * max_len + 5 : max_len;
    for (int64_t len : s.lengths) {
      std::vector<int32_t> p(static_cast<size_t>(span));
      std::iota(p.begin(), p.end(), 0);
      if (s.gaps) std::shuffle(p.begin(), p.end(), gen);
      p.resize(static_cast<size_t>(len));
      std::sort(p.begin(), p.end());
      std::vector<int32_t> table;
      for (int64_t j = 0; j < len; ++j) {
        if (j % k_block == 0) table.push_back(order[next++]);
        pos[table.back() * k_block + j % k_block] = p[j];
        max_pos = std::max(max_pos, p[j]);
      }
      tables.push_back(std::move(table));
    }
    for (size_t g = 0; g < tables.size(); ++g) heads.push_back({tables[g].data(), s.lengths[g]});
  }

  PagedKv cpu_view() const {
    PagedKv kv;
    kv.k_base = kf.data();
    kv.v_base = vf.data();
    kv.pos_base = pos.data();
    kv.k_block_stride = kv.v_block_stride = static_cast<int64_t>(k_block) * static_cast<int64_t>(kf.size() / pos.size());
    kv.pos_block_stride = k_block;
    kv.block_size = k_block;
    kv.heads = heads.data();
    return kv;
  }
};

// One element in front of `v`: the data then starts 2 bytes past cudaMalloc's alignment.
inline std::vector<uint16_t> shifted(const std::vector<uint16_t>& v, bool shift) {
  if (!shift) return v;
  std::vector<uint16_t> r{0};
  r.insert(r.end(), v.begin(), v.end());
  return r;
}

// The paged fixture on the device; `view` points into it. misaligned: K and V start 2 bytes
// past a 16-byte boundary (the kernels' scalar load path; the tensor-core kernel refuses it).
struct DevicePaged {
  DeviceBuffer<uint16_t> k, v;
  DeviceBuffer<int32_t> pos;
  std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> tables;
  std::unique_ptr<DeviceBuffer<PagedKvHead>> heads;
  PagedKvCuda view;
  explicit DevicePaged(const PagedFixture& f, int head_dim, bool misaligned = false)
      : k(shifted(f.k, misaligned)), v(shifted(f.v, misaligned)), pos(f.pos) {
    std::vector<PagedKvHead> dh;
    for (size_t g = 0; g < f.tables.size(); ++g) {
      tables.push_back(std::make_unique<DeviceBuffer<int32_t>>(f.tables[g]));
      dh.push_back({tables.back()->ptr, f.heads[g].length});
    }
    heads = std::make_unique<DeviceBuffer<PagedKvHead>>(dh);
    view.k_base = as_bf16(k.ptr) + (misaligned ? 1 : 0);
    view.v_base = as_bf16(v.ptr) + (misaligned ? 1 : 0);
    view.pos_base = pos.ptr;
    view.k_block_stride = view.v_block_stride = static_cast<int64_t>(k_block) * head_dim;
    view.pos_block_stride = k_block;
    view.block_size = k_block;
    view.heads = heads->ptr;
    view.max_length = f.max_len;
  }
};

}  // namespace snap::kernels::cuda_test
