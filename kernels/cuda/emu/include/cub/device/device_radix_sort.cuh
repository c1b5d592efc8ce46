// The kernel emulator's cub::DeviceRadixSort (kernels/cuda/emu): the calls kernels/cuda makes,
// with CUB's documented results — stable, keys compared on bits [begin_bit, end_bit) after
// CUB's transform (floats: sign-magnitude to unsigned, -0.0 equal to +0.0, NaN by its bits) —
// and its temp-storage protocol (a null d_temp_storage asks for the size; a call with less
// than it asked for, or with buffers that are not device memory, is refused).
#pragma once

#include "kernels/cuda/emu/radix_sort_emu.h"

namespace cub {

struct DeviceRadixSort {
  template <typename K, typename V, typename N>
  static cudaError_t SortPairsDescending(void* tmp, size_t& tmp_bytes, const K* keys_in, K* keys_out,
                                         const V* values_in, V* values_out, N num_items, int begin_bit = 0,
                                         int end_bit = sizeof(K) * 8, cudaStream_t = nullptr) {
    const int begin[1] = {0};
    const int end[1] = {static_cast<int>(num_items)};
    return snap_emu::radix_sort<K, V>(tmp, tmp_bytes, keys_in, keys_out, values_in, values_out,
                                      static_cast<int64_t>(num_items), 1, begin, end, begin_bit, end_bit, true, true, false,
                                      "cub::DeviceRadixSort::SortPairsDescending");
  }
  template <typename K, typename N>
  static cudaError_t SortKeys(void* tmp, size_t& tmp_bytes, const K* keys_in, K* keys_out, N num_items,
                              int begin_bit = 0, int end_bit = sizeof(K) * 8, cudaStream_t = nullptr) {
    const int begin[1] = {0};
    const int end[1] = {static_cast<int>(num_items)};
    return snap_emu::radix_sort<K, int>(tmp, tmp_bytes, keys_in, keys_out, nullptr, nullptr,
                                        static_cast<int64_t>(num_items), 1, begin, end, begin_bit, end_bit, false, false,
                                        false, "cub::DeviceRadixSort::SortKeys");
  }
};

}  // namespace cub
