// weight_tiles4_pack / _unpack_rows (kernels/weight_tiles.h): the byte moves between the
// row-major block layout and the 4-row tiles, written once as one address map (tile_offsets)
// used in both directions, so packing and unpacking cannot disagree.
#include "kernels/weight_tiles.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/matvec_q8x3act.h"
#include "kernels/matvec_act.h"

namespace snap::kernels {

namespace {

constexpr int k_rows = 4;    // rows per tile
constexpr int k_blocks = 4;  // blocks per group

struct Format {
  int64_t bb = 0;  // block bytes
  int64_t qb = 0;  // quant bytes per block
  int fields = 0;  // f16 header fields: d (and q4_1's m)
};

Format format_of(DType d) {
  switch (d) {
    case DType::q8_0: return {34, 32, 1};
    case DType::q4_0: return {18, 16, 1};
    case DType::q4_1: return {20, 16, 2};
    default: CHECK(false) << "weight tiles4: " << dtype_name(d) << " is not a block format"; return {};
  }
}

// Calls move(tiled_offset, rowmajor_offset, bytes) for every piece of one 4-row tile: offsets
// relative to the tile's first byte in the tiled layout and to row 0 of the 4 rows in the
// row-major layout (both spans are 4 · row_bytes).
template <class Move>
void tile_offsets(const Format& f, int64_t nb, Move move) {
  const int64_t row_bytes = nb * f.bb;
  const int64_t hb = f.bb - f.qb;
  for (int64_t b0 = 0; b0 < nb; b0 += k_blocks) {
    const int64_t nblk = std::min<int64_t>(k_blocks, nb - b0);
    const int64_t group = k_rows * b0 * f.bb;  // the group's first byte in the tile
    const int64_t quants = group + k_rows * nblk * hb;
    for (int k = 0; k < k_rows; ++k) {
      for (int64_t j = 0; j < nblk; ++j) {
        const int64_t src = k * row_bytes + (b0 + j) * f.bb;  // block (row k, 4g + j), row-major
        for (int field = 0; field < f.fields; ++field) {
          move(group + field * k_rows * nblk * 2 + (4 * j + k) * 2, src + 2 * field, 2);
        }
        const int64_t q = quants + k * nblk * f.qb;
        move(q + 16 * j, src + hb, 16);                                        // elements 0..15 (q4: all 32)
        if (f.qb == 32) move(q + 16 * nblk + 16 * j, src + hb + 16, 16);  // q8_0: elements 16..31
      }
    }
  }
}

}  // namespace

void weight_tiles4_pack(DType dtype, void* data, int64_t rows, int64_t cols) {
  const Format f = format_of(dtype);
  CHECK(cols % 32 == 0 && rows >= 0) << "weight tiles4: " << rows << "x" << cols;
  const int64_t nb = cols / 32, row_bytes = nb * f.bb, tile_bytes = k_rows * row_bytes;
  std::vector<uint8_t> rowmajor(static_cast<size_t>(tile_bytes));
  auto* base = static_cast<uint8_t*>(data);
  for (int64_t r = 0; r + k_rows <= rows; r += k_rows) {
    uint8_t* tile = base + r * row_bytes;
    std::memcpy(rowmajor.data(), tile, static_cast<size_t>(tile_bytes));
    tile_offsets(f, nb, [&](int64_t tiled, int64_t src, int64_t n) {
      std::memcpy(tile + tiled, rowmajor.data() + src, static_cast<size_t>(n));
    });
  }
}

void weight_tiles4_unpack_rows(const WeightView& w, int64_t r0, int64_t n, void* dst) {
  CHECK(r0 >= 0 && n >= 0 && r0 + n <= w.rows) << "weight tiles4: rows " << r0 << "+" << n << " of " << w.rows;
  const auto* base = static_cast<const uint8_t*>(w.data);
  auto* out = static_cast<uint8_t*>(dst);
  const int64_t row_bytes = dtype_row_bytes(w.dtype, w.cols);
  if (w.layout == WeightLayout::rows) {
    std::memcpy(out, base + r0 * row_bytes, static_cast<size_t>(n * row_bytes));
    return;
  }
  const Format f = format_of(w.dtype);
  const int64_t nb = w.cols / 32, tiled_rows = w.rows / k_rows * k_rows;
  thread_local std::vector<uint8_t> rowmajor;
  for (int64_t r = r0; r < r0 + n;) {
    if (r >= tiled_rows) {  // the row-major tail
      std::memcpy(out + (r - r0) * row_bytes, base + r * row_bytes, static_cast<size_t>((r0 + n - r) * row_bytes));
      return;
    }
    const int64_t t0 = r / k_rows * k_rows;
    const uint8_t* tile = base + t0 * row_bytes;
    rowmajor.resize(static_cast<size_t>(k_rows * row_bytes));
    tile_offsets(f, nb, [&](int64_t tiled, int64_t src, int64_t len) {
      std::memcpy(rowmajor.data() + src, tile + tiled, static_cast<size_t>(len));
    });
    const int64_t end = std::min(t0 + k_rows, r0 + n);
    std::memcpy(out + (r - r0) * row_bytes, rowmajor.data() + (r - t0) * row_bytes,
                static_cast<size_t>((end - r) * row_bytes));
    r = end;
  }
}

bool weight_tiles4_wanted(DType dtype) {
  static const bool off = [] {
    const char* e = std::getenv("SNAP_WEIGHT_TILES");
    return e != nullptr && std::string(e) == "0";
  }();
  return !off && dtype_cpu_int_blocks(dtype) && matvec_act() == MatvecAct::q8x3 && q8x3act_vector_tiles();
}

}  // namespace snap::kernels
