// The kernel emulator's cub::DeviceSegmentedRadixSort (see device_radix_sort.cuh here): each
// segment [d_begin_offsets[i], d_end_offsets[i]) sorted on its own; the offsets are device memory.
#pragma once

#include "kernels/cuda/emu/radix_sort_emu.h"

namespace cub {

struct DeviceSegmentedRadixSort {
  template <typename K, typename V, typename B, typename E>
  static cudaError_t SortPairsDescending(void* tmp, size_t& tmp_bytes, const K* keys_in, K* keys_out,
                                         const V* values_in, V* values_out, int num_items, int num_segments,
                                         B begin_offsets, E end_offsets, int begin_bit = 0,
                                         int end_bit = sizeof(K) * 8, cudaStream_t = nullptr) {
    return snap_emu::radix_sort<K, V>(tmp, tmp_bytes, keys_in, keys_out, values_in, values_out, num_items,
                                      num_segments, begin_offsets, end_offsets, begin_bit, end_bit, true, true, true,
                                      "cub::DeviceSegmentedRadixSort::SortPairsDescending");
  }
  template <typename K, typename B, typename E>
  static cudaError_t SortKeys(void* tmp, size_t& tmp_bytes, const K* keys_in, K* keys_out, int num_items,
                              int num_segments, B begin_offsets, E end_offsets, int begin_bit = 0,
                              int end_bit = sizeof(K) * 8, cudaStream_t = nullptr) {
    return snap_emu::radix_sort<K, int>(tmp, tmp_bytes, keys_in, keys_out, nullptr, nullptr, num_items,
                                        num_segments, begin_offsets, end_offsets, begin_bit, end_bit, false, false, true,
                                        "cub::DeviceSegmentedRadixSort::SortKeys");
  }
};

}  // namespace cub
