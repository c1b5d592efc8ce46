// Dequantization of ggml tensor types to f32: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; and quantization of f32 to Q8_0. Bit-exact with the reference dequantizer of the
// PyPI package `gguf` (tests/worker/test_dequant.cpp, fixtures from tools/gen_dequant_fixture.py).
#pragma once

#include <cstdint>

#include "common/dtype.h"
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

// The ggml type of a DType (the same bytes: common/dtype.h), and the DType that holds a ggml
// type's bytes as they are (false for the types without one: q5_1, q8_1, q2_k, q3_k, q8_k).
// The one table of the correspondence; whether a holder keeps a block format (the CPU, the
// device: every block format) is dtype_cpu_blocks.
GgmlType ggml_type_of(DType t);
bool dtype_of(GgmlType type, DType* out);

// Bytes taken by n elements (n must be a multiple of the block size; else error).
Result<uint64_t> ggml_nbytes(GgmlType type, int64_t n);

// The inverse for Q8_0, as ggml's quantize_row_q8_0_ref (and the `gguf` package's Q8_0)
// does it, bit for bit: per 32 values d = max|x| / 127 (in f32), id = d ? 1 / d : 0, q =
// round-half-away-from-zero(x * id), and d stored as f16 (nearest even). n is a multiple of
// 32; dst gets n / 32 blocks of 34 bytes (common/dtype.h). Used to quantize weights at load
// (LoadOptions::weight_dtype = q8_0). False, with dst partly written, if a value is NaN or
// infinite (no block format holds one).
bool quantize_q8_0(const float* src, void* dst, int64_t n);

// dst[0..n) = dequantized src. n must be a multiple of the type's block size.
// unimplemented for types we cannot dequantize (the message names the type).
Status dequantize(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace snap
