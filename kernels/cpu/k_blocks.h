// The K formats' packed sub-block scales, shared by the matvecs that decode them in registers
// (kernels/cpu/matmul.cpp's f32-activation tiles, matvec_q16act.cpp's integer tiles); the same
// unpacking as worker/model/dequant.cpp's, which the kernel layer does not link.
#pragma once

#include <cstdint>

namespace snap::kernels {

// Q4_K and Q5_K's eight 6-bit scales and mins of sub-block j in their 12 bytes.
inline void scale_min_k4(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 0x3f;
    *m = s[j + 4] & 0x3f;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K's 6-bit scale k of 16 (offset 32 taken off) in its 12 bytes: the low nibble of byte k % 8
// (k < 8) or its high nibble (k ≥ 8), and bits 2·(k/4) .. +1 of byte 8 + k % 4 above it.
inline int scale_k3(const uint8_t* s, int k) {
  const int lo = (s[k % 8] >> (4 * (k / 8))) & 0x0f, hi = (s[8 + k % 4] >> (2 * (k / 4))) & 0x03;
  return (lo | (hi << 4)) - 32;
}

}  // namespace snap::kernels
