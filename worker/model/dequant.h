// Dequantization of ggml tensor types to f32: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Bit-exact with the reference dequantizer of the
// PyPI package `gguf` (tests/worker/test_dequant.cpp, fixtures from tools/gen_dequant_fixture.py).
#pragma once

#include <cstdint>

#include "common/status.h"
#include "worker/model/gguf.h"

namespace snap {

struct GgmlTypeInfo {
  const char* name = "?";
  int64_t block_size = 1;  // elements per block
  int64_t type_size = 4;   // bytes per block
  bool dequantizable = false;
};

// Facts for a type; for an unknown type number, name "unknown" and dequantizable=false.
GgmlTypeInfo ggml_type_info(GgmlType type);

// Bytes taken by n elements (n must be a multiple of the block size; else error).
Result<uint64_t> ggml_nbytes(GgmlType type, int64_t n);

// dst[0..n) = dequantized src. n must be a multiple of the type's block size.
// unimplemented for types we cannot dequantize (the message names the type).
Status dequantize(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace snap
