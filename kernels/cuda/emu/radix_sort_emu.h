// The sort behind the emulator's cub shims (include/cub/device/*.cuh): CUB's key transform and
// stability, on the host, over "device" buffers checked against the host twin's registry.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace snap_emu {

// CUB's radix key: unsigned bits whose order is the key's (floats: -0.0 as +0.0).
template <typename K>
uint64_t radix_key(K k) {
  if constexpr (std::is_same_v<K, float>) {
    uint32_t b = std::bit_cast<uint32_t>(k);
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b & 0xffffffffu : b ^ 0x80000000u;
  } else if constexpr (std::is_integral_v<K> && std::is_signed_v<K>) {
    using U = std::make_unsigned_t<K>;
    return static_cast<U>(static_cast<U>(k) ^ (U{1} << (sizeof(K) * 8 - 1)));
  } else {
    static_assert(std::is_unsigned_v<K>, "the emulator sorts float and integer keys");
    return static_cast<uint64_t>(k);
  }
}

// What the emulated sort asks for as temp storage: CUB's double buffers, plus 4 KiB.
inline size_t radix_temp_bytes(int64_t items, size_t key_bytes, size_t value_bytes) {
  return static_cast<size_t>(std::max<int64_t>(items, 0)) * (key_bytes + value_bytes) * 2 + 4096;
}

template <typename K, typename V, typename B, typename E>
cudaError_t radix_sort(void* tmp, size_t& tmp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                       V* values_out, int64_t items, int segments, B begin, E end, int begin_bit, int end_bit,
                       bool pairs, bool descending, bool segmented, const char* what) {
  const size_t need = radix_temp_bytes(items, sizeof(K), pairs ? sizeof(V) : 0);
  if (tmp == nullptr) {
    tmp_bytes = need;
    return cudaSuccess;
  }
  auto refuse = [&](cudaError_t e, const std::string& why) {
    snap::hostcuda::set_error(e, std::string("kernel emulator: ") + what + ": " + why);
    return e;
  };
  if (tmp_bytes < need) return refuse(cudaErrorInvalidValue, "temp storage of " + std::to_string(tmp_bytes) +
                                                                 " bytes, less than the " + std::to_string(need) +
                                                                 " it asked for");
  if (items < 0 || segments < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) || begin_bit > end_bit)
    return refuse(cudaErrorInvalidValue, "bad sizes or bit range");
  const size_t n = static_cast<size_t>(items);
  if (!snap::hostcuda::is_device(tmp, tmp_bytes) || !snap::hostcuda::is_device(keys_in, n * sizeof(K)) ||
      !snap::hostcuda::is_device(keys_out, n * sizeof(K)) ||
      (pairs && (!snap::hostcuda::is_device(values_in, n * sizeof(V)) ||
                     !snap::hostcuda::is_device(values_out, n * sizeof(V)))))
    return refuse(cudaErrorIllegalAddress, "a buffer is not device memory of its size");
  if (segmented && (!snap::hostcuda::is_device(&begin[0], sizeof(begin[0]) * segments) ||
                    !snap::hostcuda::is_device(&end[0], sizeof(end[0]) * segments)))
    return refuse(cudaErrorIllegalAddress, "the segment offsets are not device memory");
  const int bits = end_bit - begin_bit;
  const uint64_t mask = bits >= 64 ? ~uint64_t{0} : ((uint64_t{1} << bits) - 1);
  std::vector<size_t> order;
  std::vector<K> keys(keys_in, keys_in + n);  // in and out may not overlap, but read first anyway
  std::vector<V> values;
  if (pairs) values.assign(values_in, values_in + n);
  for (int s = 0; s < segments; ++s) {
    const int64_t b = begin[s], e = end[s];
    if (b < 0 || e > items) return refuse(cudaErrorIllegalAddress, "segment " + std::to_string(s) + " outside the items");
    if (e <= b) continue;
    order.resize(static_cast<size_t>(e - b));
    std::iota(order.begin(), order.end(), static_cast<size_t>(b));
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      const uint64_t kx = radix_key(keys[x]) >> begin_bit & mask, ky = radix_key(keys[y]) >> begin_bit & mask;
      return descending ? kx > ky : kx < ky;
    });
    for (size_t i = 0; i < order.size(); ++i) {
      keys_out[static_cast<size_t>(b) + i] = keys[order[i]];
      if (pairs) values_out[static_cast<size_t>(b) + i] = values[order[i]];
    }
  }
  return cudaSuccess;
}

}  // namespace snap_emu
