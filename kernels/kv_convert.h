// Conversions between f32 and the KV cache's element types (f32, bf16, f16), one row at a
// time: the paged cache converts each K/V row on write and the compressor reads rows back as
// f32. f32 → bf16/f16 rounds to nearest even (f16 overflows to ±inf, as IEEE does); the
// reverse is exact. _ref is the scalar definition (common/dtype.h); _cpu the SIMD path, equal
// to it bit for bit (NaNs stay NaN, payload aside).
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace snap::kernels {

// dst[n] of `dtype` (f32, bf16 or f16; CHECK) = src[n] rounded.
void kv_convert_ref(const float* src, DType dtype, void* dst, int64_t n);
void kv_convert_cpu(const float* src, DType dtype, void* dst, int64_t n);
// dst[n] f32 = src[n] of `dtype`.
void kv_to_f32_ref(const void* src, DType dtype, float* dst, int64_t n);
void kv_to_f32_cpu(const void* src, DType dtype, float* dst, int64_t n);

}  // namespace snap::kernels
