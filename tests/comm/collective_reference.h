// Shared by the collective tests (MPI, TCP): deterministic per-rank inputs whose sum
// changes bits with the summation order, and the documented rank-order sum written out
// independently of comm/ (f32 accumulator, one rounding at the end).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dtype.h"

namespace snap::comm::reference {

inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Rank r's input element i: sign, mantissa in [1, 2) and exponent in [-8, 8] all vary, so
// a different summation order changes the bits.
inline float input_value(int rank, int64_t i, uint64_t salt) {
  const uint64_t h = mix(salt * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(rank) * 1000003ull + i);
  const float mantissa = 1.0f + static_cast<float>(h & 0xffffff) / 16777216.0f;
  const int exponent = static_cast<int>((h >> 24) % 17) - 8;
  const float v = std::ldexp(mantissa, exponent);
  return (h >> 40) & 1 ? -v : v;
}

// Buffer of `count` elements of `dtype` holding rank r's inputs, as raw bytes.
inline std::vector<uint8_t> make_input(int rank, int64_t count, DType dtype, uint64_t salt) {
  std::vector<uint8_t> buf(count * dtype_size(dtype));
  for (int64_t i = 0; i < count; ++i) {
    const float v = input_value(rank, i, salt);
    if (dtype == DType::f32) {
      std::memcpy(buf.data() + i * 4, &v, 4);
    } else {
      const uint16_t h = dtype == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(buf.data() + i * 2, &h, 2);
    }
  }
  return buf;
}

inline float element(const std::vector<uint8_t>& buf, int64_t i, DType dtype) {
  if (dtype == DType::f32) {
    float v;
    std::memcpy(&v, buf.data() + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + i * 2, 2);
  return dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// The documented order, written out independently of the code under test: f32
// accumulator, ranks `first`, first+1, ..., first+n-1 (or reversed), one rounding.
inline std::vector<uint8_t> reference_sum(int first, int n, int64_t count, DType dtype, uint64_t salt, bool reversed = false) {
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = first; r < first + n; ++r) inputs.push_back(make_input(r, count, dtype, salt));
  if (reversed) std::reverse(inputs.begin(), inputs.end());
  std::vector<uint8_t> out(count * dtype_size(dtype));
  for (int64_t i = 0; i < count; ++i) {
    float acc = element(inputs[0], i, dtype);
    for (int r = 1; r < n; ++r) acc = acc + element(inputs[r], i, dtype);
    if (dtype == DType::f32) {
      std::memcpy(out.data() + i * 4, &acc, 4);
    } else {
      const uint16_t h = dtype == DType::bf16 ? f32_to_bf16(acc) : f32_to_f16(acc);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

// Index of the first differing element, -1 when equal.
inline int64_t first_mismatch(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType dtype) {
  const int elem = dtype_size(dtype);
  for (size_t i = 0; i + elem <= std::min(a.size(), b.size()); i += elem) {
    if (std::memcmp(a.data() + i, b.data() + i, elem) != 0) return static_cast<int64_t>(i / elem);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()) / elem);
}

}  // namespace snap::comm::reference
