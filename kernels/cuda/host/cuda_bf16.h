// The host twin of <cuda_bf16.h> (see cuda_runtime.h here): the bf16 storage type, two bytes
// with the bits of common/dtype.h's bf16, and its conversions (round to nearest even).
#pragma once

#include <cstdint>

#include "common/dtype.h"

struct __nv_bfloat16 {
  uint16_t bits = 0;
};
static_assert(sizeof(__nv_bfloat16) == 2);

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{snap::f32_to_bf16(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return snap::bf16_to_f32(h.bits); }
