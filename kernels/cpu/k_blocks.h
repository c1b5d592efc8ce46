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

}  // namespace snap::kernels
