// Conversions between f32 and the KV cache's element types (f32, bf16, f16, q8_0), one row at
// a time: the paged cache converts each K/V row on write and the compressor reads rows back as
// f32. f32 → bf16/f16 rounds to nearest even (f16 overflows to ±inf, as IEEE does); the
// reverse is exact. _ref is the scalar definition (common/dtype.h); _cpu the SIMD path, equal
// to it bit for bit (NaNs stay NaN, payload aside).
//
// q8_0 KV row of head_dim values (our layout, not ggml's interleaved blocks, so that head_dim
// need not be a multiple of 32): int8 q[head_dim], then f16 d[ceil(head_dim / 32)], one scale
// per group of 32 values (the last group may be shorter, e.g. 16 of head_dim 80). value i =
// f32(d[i / 32]) · q[i]. Quantizing a group: amax = max |x|, d = amax / 127 (stored as f16),
// q = round_to_nearest_even(x · (127 / amax)); amax 0 gives d = 0, q = 0. A group holding a
// NaN or ±inf stores d = NaN, q = 0, so every value of it reads back NaN (never silently 0).
// Bytes per row: head_dim + 2·ceil(head_dim / 32) (68 for head_dim 64: 1.06 B a value).
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace snap::kernels {

// Bytes of one K or V row of head_dim values stored as `dtype` (f32, bf16, f16, q8_0; CHECK).
int64_t kv_row_bytes(DType dtype, int64_t head_dim);
// True for the KV element types above.
bool kv_dtype_supported(DType dtype);

// dst of `dtype` (f32, bf16, f16 or q8_0; CHECK) = src[n] rounded. For q8_0, n is ONE row
// (head_dim values; dst gets kv_row_bytes(q8_0, n) bytes): the groups of 32 start at src[0].
void kv_convert_ref(const float* src, DType dtype, void* dst, int64_t n);
void kv_convert_cpu(const float* src, DType dtype, void* dst, int64_t n);
// dst[n] f32 = src[n] of `dtype` (for q8_0: one row of n values, as written above).
void kv_to_f32_ref(const void* src, DType dtype, float* dst, int64_t n);
void kv_to_f32_cpu(const void* src, DType dtype, float* dst, int64_t n);

}  // namespace snap::kernels
