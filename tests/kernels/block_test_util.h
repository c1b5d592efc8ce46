// Shared helpers for the tests of the block-format matvecs (q8_0 / q4_0 / q4_1 / q5_0 / q5_1 and the K formats' weights):
// seeded random blocks, one element decoded from the ggml layout on its own, and a guard that
// restores the process-wide matvec mode (kernels/matvec_act.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/matvec_act.h"

namespace snap::kernels::test {

// Random quants (uniform bytes, so q8_0 holds −128 too, and the K formats' sub-scales take every
// value) with scales so |w| ≲ 1, like the float tests: q8_0 d ≤ 1/127, q4_0 d ≤ 1/8, q4_1 d ≤ 2/15
// and m around −0.5, q5_0 d ≤ 1/16, q5_1 d ≤ 2/31 and m as q4_1's; q4_k d ≤ 1/(63·15) and dmin ≤ 1/126 (w = (d·sc)·q − dmin·m, sc, m ≤ 63);
// q5_k d ≤ 1/(63·31), dmin as q4_k's; q6_k d ≤ 1/4096 (w = (d·sc)·(q − 32), |sc| ≤ 128); q3_k d ≤ 1/128
// (w = (d·(sc − 32))·q, |sc − 32| ≤ 32, |q| ≤ 4); q2_k d ≤ 1/45 and dmin ≤ 1/30 (sc, m ≤ 15, q ≤ 3);
// d, m and dmin are f16.
inline std::vector<uint8_t> make_blocks(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> data(static_cast<size_t>(rows * dtype_row_bytes(dtype, cols)));
  for (uint8_t& b : data) b = static_cast<uint8_t>(gen());
  std::uniform_real_distribution<float> unit(0.5f, 1.0f);
  const float d_max = dtype == DType::q8_0   ? 1.0f / 127
                      : dtype == DType::q4_0 ? 1.0f / 8
                      : dtype == DType::q5_0 ? 1.0f / 16
                      : dtype == DType::q5_1 ? 2.0f / 31
                      : dtype == DType::q4_k ? 1.0f / (63 * 15)
                      : dtype == DType::q5_k ? 1.0f / (63 * 31)
                      : dtype == DType::q6_k ? 1.0f / 4096
                      : dtype == DType::q3_k ? 1.0f / 128
                      : dtype == DType::q2_k ? 1.0f / 45
                                             : 2.0f / 15;
  const size_t d_at = dtype == DType::q6_k ? 208 : dtype == DType::q3_k ? 108 : dtype == DType::q2_k ? 80 : 0;
  for (size_t off = 0; off < data.size(); off += static_cast<size_t>(dtype_block_bytes(dtype))) {
    const uint16_t d = f32_to_f16(d_max * unit(gen));
    std::memcpy(&data[off + d_at], &d, 2);
    if (dtype == DType::q4_1 || dtype == DType::q5_1) {
      const uint16_t m = f32_to_f16(-unit(gen) + 0.5f * unit(gen) - 0.25f);
      std::memcpy(&data[off + 2], &m, 2);
    }
    if (dtype == DType::q4_k || dtype == DType::q5_k || dtype == DType::q2_k) {
      const uint16_t dmin = f32_to_f16(unit(gen) / (dtype == DType::q2_k ? 30 : 126));
      std::memcpy(&data[off + d_at + 2], &dmin, 2);
    }
  }
  return data;
}

// Element j of one block, decoded here from the ggml layout (common/dtype.h) on its own.
inline double block_value(DType dtype, const uint8_t* b, int j) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  const double d = f16_to_f32(h);
  if (dtype == DType::q8_0) return d * static_cast<int8_t>(b[2 + j]);
  const bool has_m = dtype == DType::q4_1 || dtype == DType::q5_1, q5 = dtype == DType::q5_0 || dtype == DType::q5_1;
  const int qs = 2 + (has_m ? 2 : 0) + (q5 ? 4 : 0);  // q5: the 32 fifth bits (qh) just before qs
  const uint8_t byte = b[qs + j % 16];
  int n = j < 16 ? byte & 0x0f : byte >> 4;
  if (q5) n |= ((b[qs - 4 + j / 8] >> (j % 8)) & 1) << 4;
  if (!has_m) return d * (n - (q5 ? 16 : 8));
  std::memcpy(&h, b + 2, 2);
  return d * n + f16_to_f32(h);
}

// Sets the process-wide matvec mode for the scope; restores the previous choice on exit.
struct ActGuard {
  MatvecAct saved = matvec_act();
  explicit ActGuard(MatvecAct a) { matvec_act_set(a); }
  ~ActGuard() { matvec_act_set(saved); }
};

}  // namespace snap::kernels::test
