// Internal to kernels/cpu: the q8_0 KV row (layout in kernels/kv_convert.h): int8 q[head_dim]
// then one f16 scale per group of 32 values. Quantize and dequantize one row, scalar
// reference and AVX2 path (bit-equal: same float products, rounding to nearest even in both),
// and the scale lookup the attention block loaders share.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace snap::kernels {

inline constexpr int64_t k_kv_q8_group = 32;  // values per scale

inline int64_t kv_q8_groups(int64_t head_dim) { return (head_dim + k_kv_q8_group - 1) / k_kv_q8_group; }
inline int64_t kv_q8_row_bytes(int64_t head_dim) { return head_dim + 2 * kv_q8_groups(head_dim); }

// The f16 bits of the scale of value i of a row (group i / 32).
inline uint16_t kv_q8_scale_bits(const void* row, int64_t head_dim, int64_t i) {
  uint16_t d;
  std::memcpy(&d, static_cast<const uint8_t*>(row) + head_dim + 2 * (i / k_kv_q8_group), 2);
  return d;
}
// Value i of a row as f32: f32(d) · q (the one definition every reader follows).
inline float kv_q8_value(const void* row, int64_t head_dim, int64_t i) {
  return f16_to_f32(kv_q8_scale_bits(row, head_dim, i)) * static_cast<float>(static_cast<const int8_t*>(row)[i]);
}

// row (kv_q8_row_bytes(head_dim) bytes) = x[head_dim] quantized.
void kv_q8_quantize_ref(const float* x, int64_t head_dim, void* row);
// out[head_dim] = the row's values.
void kv_q8_dequantize_ref(const void* row, int64_t head_dim, float* out);
// AVX2 + F16C; head_dim % 8 == 0 (CHECK). Equal to the _ref functions bit for bit.
void kv_q8_quantize_avx2(const float* x, int64_t head_dim, void* row);
void kv_q8_dequantize_avx2(const void* row, int64_t head_dim, float* out);

}  // namespace snap::kernels
