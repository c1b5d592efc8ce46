// Element types (f32, f16 = IEEE binary16, bf16) and the ggml block formats a weight
// matrix may keep in memory (q8_0, q4_0, q4_1, q5_0, q5_1: 32 elements per block; q4_k, q5_k, q6_k, q3_k,
// q2_k: 256;
// rows are whole blocks), with their sizes, and scalar conversions between f32, f16 and bf16.
// Conversions are exact where the target can represent the value; f32->f16/bf16
// rounds to nearest even. Vectorized conversions live in the kernels.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/check.h"

namespace snap {

// Block layouts (ggml's, byte-identical to the GGUF file; little-endian):
//   q8_0: f16 d, int8 q[32]             w[j] = d·q[j]                      34 bytes
//   q4_0: f16 d, u8 qs[16]              w[j] = d·(nib − 8)                 18 bytes
//   q4_1: f16 d, f16 m, u8 qs[16]       w[j] = d·nib + m                   20 bytes
// where for j < 16 nib = qs[j] & 15 and for j ≥ 16 nib = qs[j − 16] >> 4.
//   q5_0: f16 d, u8 qh[4], u8 qs[16]    w[j] = d·((nib | bit j of qh << 4) − 16)   22 bytes
//   q5_1: f16 d, f16 m, u8 qh[4], u8 qs[16]   w[j] = d·(nib | bit j of qh << 4) + m  24 bytes
//   q4_k: 256 weights (worker/model/dequant.cpp)                       144 bytes
//   q6_k: 256 weights (worker/model/dequant.cpp)                       210 bytes
//   q5_k: 256 weights (worker/model/dequant.cpp)                       176 bytes
//   q3_k: 256 weights (worker/model/dequant.cpp)                       110 bytes
//   q2_k: 256 weights (worker/model/dequant.cpp)                        84 bytes
// The CPU's matmul kernels (kernels/cpu/matmul.cpp) and the device's (kernels/cuda/kernels_cuda.h) read
// every one of them in its blocks (dtype_cpu_blocks), so every format of a Q2_K .. Q8_0 GGUF stays in the
// file's blocks; only the integer-activation matvecs are narrower (dtype_cpu_int_blocks).
enum class DType : uint8_t { f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k, q5_k, q3_k, q2_k };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::q8_0: return "q8_0";
    case DType::q4_0: return "q4_0";
    case DType::q4_1: return "q4_1";
    case DType::q5_0: return "q5_0";
    case DType::q5_1: return "q5_1";
    case DType::q4_k: return "q4_k";
    case DType::q6_k: return "q6_k";
    case DType::q5_k: return "q5_k";
    case DType::q3_k: return "q3_k";
    case DType::q2_k: return "q2_k";
  }
  return "?";
}

// True for the block formats, which have no per-element size.
constexpr bool dtype_is_quantized(DType t) { return t >= DType::q8_0; }
// The block formats the CPU's kernels read: all of them (the K formats since Q2_K .. Q6_K decoding in
// the f32-activation tiles; before, some were kept only for the device).
constexpr bool dtype_cpu_blocks(DType t) { return dtype_is_quantized(t); }
// Those of them that the integer-activation matvecs (q8act, q16act, q8x3act: kernels/matvec_act.h)
// and the 4-row tiles (kernels/weight_tiles.h) read too; Q5_0, Q5_1 and the K formats run f32 activations.
constexpr bool dtype_cpu_int_blocks(DType t) { return t == DType::q8_0 || t == DType::q4_0 || t == DType::q4_1; }

// Elements per block: 32 or 256 for the block formats, 1 for element types.
constexpr int64_t dtype_block_elems(DType t) {
  return t >= DType::q4_k ? 256 : dtype_is_quantized(t) ? 32 : 1;
}

// Bytes per block (per element for element types).
constexpr int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::q8_0: return 34;
    case DType::q4_0: return 18;
    case DType::q4_1: return 20;
    case DType::q5_0: return 22;
    case DType::q5_1: return 24;
    case DType::q4_k: return 144;
    case DType::q6_k: return 210;
    case DType::q5_k: return 176;
    case DType::q3_k: return 110;
    case DType::q2_k: return 84;
  }
  return 0;
}

// Bytes of one element; element types only (a block format has no element size).
inline int dtype_size(DType t) {
  CHECK(!dtype_is_quantized(t)) << "dtype_size of block format " << dtype_name(t) << "; use dtype_row_bytes";
  return static_cast<int>(dtype_block_bytes(t));
}

// Bytes of a row of `cols` elements; for a block format cols must be whole blocks.
inline int64_t dtype_row_bytes(DType t, int64_t cols) {
  const int64_t block = dtype_block_elems(t);
  CHECK(cols % block == 0) << dtype_name(t) << " row of " << cols << " elements is not whole " << block
                           << "-element blocks";
  return cols / block * dtype_block_bytes(t);
}

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_to_f32(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
  return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (u < 0x38800000u) {                                               // subnormal or zero
    float v = bits_to_f32(u) * 16777216.0f;  // scale to units of 2^-24
    uint32_t m = static_cast<uint32_t>(v);
    float rem = v - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = u & 0x7fffffu;
  uint32_t exp = (u >> 23) - 112u;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace snap
