// Dequantization of ggml block formats to f32, and the size table of every ggml type.
// Each block decoder mirrors the arithmetic order of the `gguf` Python reference
// (e.g. Q4_K: (d*sc)*q - dmin*m) so results are bit-exact. Every product is exact in f32
// (f16 scale: 11 significant bits, x <=7-bit sub-scale x <=6-bit quant = <=24 bits), so only
// the final add rounds and FMA contraction (-march=native) cannot change a result.
// Blocks are independent: dequantize() splits them over OpenMP threads.
#include "worker/model/dequant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "common/dtype.h"

namespace snap {

namespace {

constexpr int64_t k_qk = 32;    // elements per block of the legacy quants
constexpr int64_t k_qk_k = 256; // elements per K-quant super-block

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// --- legacy 32-element blocks ---------------------------------------------------------

// Q4_0: f16 d, 16 bytes of nibbles; element j (low nibbles) and j+16 (high): d * (q - 8).
void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles: d * q + m.
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5_0: f16 d, u32 high bits (bit j for element j), 16 bytes of nibbles: d * (q - 16).
void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

// Q5_1: f16 d, f16 m, u32 high bits, 16 bytes of nibbles: d * q + m.
void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

// Q8_0: f16 d, 32 int8: d * q.
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// --- K-quants: 256-element super-blocks -------------------------------------------------

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], f16 d, f16 dmin.
// Element 128*g + 32*s + l holds 2 bits (qs[32*g + l] >> 2s); sub-block of 16 = element/16.
void dequant_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = load_f16(b + 80);
  const float dmin = load_f16(b + 82);
  for (int g = 0; g < 2; ++g) {
    for (int s = 0; s < 4; ++s) {
      for (int half = 0; half < 2; ++half) {
        const int e0 = 128 * g + 32 * s + 16 * half;
        const uint8_t sc = scales[e0 / 16];
        const float dl = d * static_cast<float>(sc & 0x0f);
        const float ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
          const int q = (qs[32 * g + l] >> (2 * s)) & 3;
          y[128 * g + 32 * s + l] = dl * static_cast<float>(q) - ml;
        }
      }
    }
  }
}

// Q3_K: hmask[32], qs[64], scales[12] (16 6-bit scales, offset 32), f16 d.
// Low 2 bits as in Q2_K; element 32*j + l has high bit (hmask[l] >> j) & 1, and the
// value is q - 4 when that bit is clear.
void dequant_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = load_f16(b + 108);
  float dl[16];
  for (int s = 0; s < 16; ++s) {
    const int lo = (sc[s % 8] >> (4 * (s / 8))) & 0x0f;
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 0x03;
    dl[s] = d * static_cast<float>((lo | (hi << 4)) - 32);
  }
  for (int g = 0; g < 2; ++g) {
    for (int s = 0; s < 4; ++s) {
      const int j = 4 * g + s;  // index of the 32-element group, also the hmask bit
      for (int l = 0; l < 32; ++l) {
        const int e = 32 * j + l;
        const int lo = (qs[32 * g + l] >> (2 * s)) & 3;
        const int high_clear = ((hmask[l] >> j) & 1) ^ 1;
        y[e] = dl[e / 16] * static_cast<float>(lo - (high_clear << 2));
      }
    }
  }
}

// The 12-byte packing of eight 6-bit scales and eight 6-bit mins shared by Q4_K and Q5_K.
void unpack_scale_min_k4(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int i = 0; i < 4; ++i) {
    sc[i] = s[i] & 0x3f;
    mn[i] = s[4 + i] & 0x3f;
    sc[4 + i] = static_cast<uint8_t>((s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30));
    mn[4 + i] = static_cast<uint8_t>((s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30));
  }
}

// Q4_K: f16 d, f16 dmin, scales[12], qs[128]. Element 64*g + 32*h + l is nibble h of
// qs[32*g + l]; sub-block of 32 = element/32; value (d*sc)*q - dmin*m.
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  uint8_t sc[8], mn[8];
  unpack_scale_min_k4(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (int g = 0; g < 4; ++g) {
    for (int h = 0; h < 2; ++h) {
      const int sub = 2 * g + h;
      const float dl = d * static_cast<float>(sc[sub]);
      const float ml = dmin * static_cast<float>(mn[sub]);
      for (int l = 0; l < 32; ++l) {
        const int q = (qs[32 * g + l] >> (4 * h)) & 0x0f;
        y[32 * sub + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// Q5_K: f16 d, f16 dmin, scales[12], qh[32], qs[128]; as Q4_K plus a fifth bit:
// element 32*j + l has bit (qh[l] >> j) & 1.
void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  uint8_t sc[8], mn[8];
  unpack_scale_min_k4(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int g = 0; g < 4; ++g) {
    for (int h = 0; h < 2; ++h) {
      const int sub = 2 * g + h;
      const float dl = d * static_cast<float>(sc[sub]);
      const float ml = dmin * static_cast<float>(mn[sub]);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[32 * g + l] >> (4 * h)) & 0x0f) | (((qh[l] >> sub) & 1) << 4);
        y[32 * sub + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

// Q6_K: ql[128], qh[64], int8 scales[16], f16 d. Element 128*g + 64*h + l (l < 64) takes
// nibble h of ql[64*g + l]; element 128*g + 32*s + l (l < 32) takes 2 high bits
// (qh[32*g + l] >> 2s). Value (d*scale[e/16]) * (q - 32).
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  float dl[16];
  for (int s = 0; s < 16; ++s) dl[s] = d * static_cast<float>(scales[s]);
  for (int g = 0; g < 2; ++g) {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < 32; ++l) {
        const int e_local = 32 * s + l;  // 0..127 within the half-block g
        const int low = (ql[64 * g + (e_local % 64)] >> (4 * (e_local / 64))) & 0x0f;
        const int high = (qh[32 * g + l] >> (2 * s)) & 0x03;
        const int e = 128 * g + e_local;
        y[e] = dl[e / 16] * static_cast<float>((low | (high << 4)) - 32);
      }
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType type) {
  switch (type) {
    case GgmlType::q4_0: return dequant_q4_0;
    case GgmlType::q4_1: return dequant_q4_1;
    case GgmlType::q5_0: return dequant_q5_0;
    case GgmlType::q5_1: return dequant_q5_1;
    case GgmlType::q8_0: return dequant_q8_0;
    case GgmlType::q2_k: return dequant_q2_k;
    case GgmlType::q3_k: return dequant_q3_k;
    case GgmlType::q4_k: return dequant_q4_k;
    case GgmlType::q5_k: return dequant_q5_k;
    case GgmlType::q6_k: return dequant_q6_k;
    default: return nullptr;
  }
}

// Runs fn over num_blocks blocks; blocks are independent so the split is free. Below
// 64 blocks the thread start-up costs more than the work.
void for_each_block(BlockFn fn, const uint8_t* src, float* dst, int64_t num_blocks,
                    int64_t type_size, int64_t block_size) {
#pragma omp parallel for schedule(static) if (num_blocks >= 64)
  for (int64_t i = 0; i < num_blocks; ++i) fn(src + i * type_size, dst + i * block_size);
}

std::string type_label(GgmlType type) {
  const GgmlTypeInfo info = ggml_type_info(type);
  return std::string(info.name) + " (type " + std::to_string(static_cast<uint32_t>(type)) + ")";
}

}  // namespace

GgmlTypeInfo ggml_type_info(GgmlType type) {
  // {name, elements per block, bytes per block, dequantizable}; numbering and sizes are
  // ggml's (ggml.h / ggml-common.h). Unlisted numbers were removed or never assigned.
  switch (static_cast<uint32_t>(type)) {
    case 0: return {"f32", 1, 4, true};
    case 1: return {"f16", 1, 2, true};
    case 2: return {"q4_0", k_qk, 18, true};
    case 3: return {"q4_1", k_qk, 20, true};
    case 6: return {"q5_0", k_qk, 22, true};
    case 7: return {"q5_1", k_qk, 24, true};
    case 8: return {"q8_0", k_qk, 34, true};
    case 9: return {"q8_1", k_qk, 36, false};
    case 10: return {"q2_k", k_qk_k, 84, true};
    case 11: return {"q3_k", k_qk_k, 110, true};
    case 12: return {"q4_k", k_qk_k, 144, true};
    case 13: return {"q5_k", k_qk_k, 176, true};
    case 14: return {"q6_k", k_qk_k, 210, true};
    case 15: return {"q8_k", k_qk_k, 292, false};
    case 16: return {"iq2_xxs", k_qk_k, 66, false};
    case 17: return {"iq2_xs", k_qk_k, 74, false};
    case 18: return {"iq3_xxs", k_qk_k, 98, false};
    case 19: return {"iq1_s", k_qk_k, 50, false};
    case 20: return {"iq4_nl", k_qk, 18, false};
    case 21: return {"iq3_s", k_qk_k, 110, false};
    case 22: return {"iq2_s", k_qk_k, 82, false};
    case 23: return {"iq4_xs", k_qk_k, 136, false};
    case 24: return {"i8", 1, 1, false};
    case 25: return {"i16", 1, 2, false};
    case 26: return {"i32", 1, 4, false};
    case 27: return {"i64", 1, 8, false};
    case 28: return {"f64", 1, 8, false};
    case 29: return {"iq1_m", k_qk_k, 56, false};
    case 30: return {"bf16", 1, 2, true};
    case 34: return {"tq1_0", k_qk_k, 54, false};
    case 35: return {"tq2_0", k_qk_k, 66, false};
    case 39: return {"mxfp4", k_qk, 17, false};
    default: return {"unknown", 1, 0, false};
  }
}

namespace {
constexpr std::pair<DType, GgmlType> k_dtype_ggml[] = {
    {DType::f32, GgmlType::f32},   {DType::f16, GgmlType::f16},   {DType::bf16, GgmlType::bf16},
    {DType::q8_0, GgmlType::q8_0}, {DType::q4_0, GgmlType::q4_0}, {DType::q4_1, GgmlType::q4_1},
    {DType::q5_0, GgmlType::q5_0}, {DType::q5_1, GgmlType::q5_1}, {DType::q4_k, GgmlType::q4_k}, {DType::q6_k, GgmlType::q6_k},
    {DType::q5_k, GgmlType::q5_k}, {DType::q3_k, GgmlType::q3_k}, {DType::q2_k, GgmlType::q2_k},
};
}  // namespace

GgmlType ggml_type_of(DType t) {
  for (const auto& [d, g] : k_dtype_ggml)
    if (d == t) return g;
  CHECK(false) << "no ggml type for " << dtype_name(t);
  return GgmlType::f32;
}

bool dtype_of(GgmlType type, DType* out) {
  for (const auto& [d, g] : k_dtype_ggml) {
    if (g == type) {
      *out = d;
      return true;
    }
  }
  return false;
}

Result<uint64_t> ggml_nbytes(GgmlType type, int64_t n) {
  const GgmlTypeInfo info = ggml_type_info(type);
  if (info.type_size == 0) return unimplemented("unknown ggml type " + type_label(type));
  if (n < 0) return invalid_argument("negative element count " + std::to_string(n));
  if (n % info.block_size != 0) {
    return invalid_argument(std::to_string(n) + " elements is not a multiple of the " +
                            info.name + " block size " + std::to_string(info.block_size));
  }
  const uint64_t blocks = static_cast<uint64_t>(n / info.block_size);
  const uint64_t type_size = static_cast<uint64_t>(info.type_size);
  if (blocks > UINT64_MAX / type_size) {
    return invalid_argument(std::to_string(n) + " " + info.name + " elements overflow a byte count");
  }
  return blocks * type_size;
}

bool quantize_q8_0(const float* src, void* dst, int64_t n) {
  CHECK(n % k_qk == 0) << "quantize_q8_0: " << n << " values are not whole blocks of 32";
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / k_qk; ++b) {
    const float* x = src + b * k_qk;
    uint8_t* block = out + b * dtype_row_bytes(DType::q8_0, k_qk);
    float amax = 0.0f;
    for (int64_t j = 0; j < k_qk; ++j) {
      if (!std::isfinite(x[j])) return false;
      amax = std::max(amax, std::fabs(x[j]));
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = f32_to_f16(d);
    std::memcpy(block, &h, 2);
    for (int64_t j = 0; j < k_qk; ++j) {
      const float q = std::round(x[j] * id);  // half away from zero, as roundf
      block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
  return true;
}

Status dequantize(GgmlType type, const void* src, float* dst, int64_t n) {
  const GgmlTypeInfo info = ggml_type_info(type);
  if (!info.dequantizable) return unimplemented("cannot dequantize ggml type " + type_label(type));
  if (n < 0 || n % info.block_size != 0) {
    return invalid_argument("dequantize " + std::string(info.name) + ": " + std::to_string(n) +
                            " elements is not a multiple of the block size " +
                            std::to_string(info.block_size));
  }
  if (n == 0) return Status();
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::f32:
      std::memcpy(dst, s, static_cast<size_t>(n) * 4);
      return Status();
    case GgmlType::f16:
#pragma omp parallel for schedule(static) if (n >= 65536)
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return Status();
    case GgmlType::bf16:
#pragma omp parallel for schedule(static) if (n >= 65536)
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return Status();
    default: break;
  }
  const BlockFn fn = block_fn(type);
  CHECK(fn != nullptr) << "no block decoder for dequantizable type " << info.name;
  for_each_block(fn, s, dst, n / info.block_size, info.type_size, info.block_size);
  return Status();
}

}  // namespace snap
