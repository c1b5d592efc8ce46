// attention_paged: the paged kernels against the contiguous attention_ref on the same data
// (num_tokens × kv_len × GQA ratio × head_dim × block size × window), with block ids
// shuffled across heads and padded strides, or packed with mostly adjacent blocks, and NaN
// in every slot past a head's length;
// a compacted cache (heads of different lengths, non-contiguous positions, an empty head)
// against a naive full softmax computed here; NaN in a visible value is not hidden. K/V
// stored in bf16, f16 and q8_0: the kernels against the same references over the rounded
// values (the kernel's conversion is exact, so only the f32 accumulation differs: same
// tolerance); q8_0 also over head_dim 80 (a short last scale group) and byte strides that
// leave rows unaligned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/attention_paged.h"
#include "kernels/cpu/attention_ops.h"
#include "kernels/kv_convert.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

// Same budget as test_attention.cpp: a missing or extra key moves outputs by ~1/kv_len ≥ 1e-3.
constexpr double k_tol = 1e-5;
constexpr float k_nan = std::numeric_limits<float>::quiet_NaN();

// x (rows of hd values) rounded to `dtype` and back: the values a cache of that type holds.
std::vector<float> rounded(const std::vector<float>& x, DType dtype, int64_t hd) {
  std::vector<float> out(x.size());
  if (dtype == DType::f32) return x;
  std::vector<uint8_t> row(static_cast<size_t>(kv_row_bytes(dtype, hd)));
  for (size_t r = 0; r * hd < x.size(); ++r) {
    kv_convert_ref(x.data() + r * hd, dtype, row.data(), hd);
    kv_to_f32_ref(row.data(), dtype, out.data() + r * hd, hd);
  }
  return out;
}

std::vector<std::vector<float>> rounded(const std::vector<std::vector<float>>& rows, DType dtype, int64_t hd) {
  std::vector<std::vector<float>> out;
  for (const auto& r : rows) out.push_back(rounded(r, dtype, hd));
  return out;
}

// A hand-built paged store: per head the (key, value, position) entries given, in blocks of
// block_size; unused slots hold NaN. Scattered: ids shuffled, strides padded. Packed (as the
// BlockPool lays them out): strides exact, ids mostly consecutive with some pairs swapped, so
// runs of physically adjacent blocks both merge and break.
struct PagedStore {
  int block_size = 0, head_dim = 0;
  DType dtype = DType::f32;
  int64_t k_stride = 0, v_stride = 0, pos_stride = 0;
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;  // bf16/f16 stores: k and v converted (NaN slots stay NaN)
  std::vector<uint8_t> k8, v8;     // q8_0 stores: each row quantized (NaN slots read NaN)
  int64_t k8_stride = 0, v8_stride = 0;  // bytes; padded by 20 / 44 when scattered
  std::vector<int32_t> pos;
  std::vector<std::vector<int32_t>> tables;
  std::vector<PagedKvHead> heads;

  // k_rows/v_rows[g]: [len_g, head_dim]; positions[g]: [len_g].
  PagedStore(int bs, int hd, const std::vector<std::vector<float>>& k_rows,
             const std::vector<std::vector<float>>& v_rows, const std::vector<std::vector<int32_t>>& positions,
             uint32_t seed, bool packed = false, DType kv_dtype = DType::f32)
      : block_size(bs),
        head_dim(hd),
        dtype(kv_dtype),
        k_stride(int64_t{bs} * hd + (packed ? 0 : 8)),
        v_stride(int64_t{bs} * hd + (packed ? 0 : 24)),
        pos_stride(bs + (packed ? 0 : 3)) {
    const size_t num_kv_heads = positions.size();
    int64_t num_blocks = 0;
    for (const auto& p : positions) num_blocks += (static_cast<int64_t>(p.size()) + bs - 1) / bs;
    num_blocks += 2;  // spare blocks that no head uses
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    if (packed) {
      for (size_t i = 0; i + 1 < ids.size(); i += 5) std::swap(ids[i], ids[i + 1]);
    } else {
      std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    }
    k.assign(static_cast<size_t>(num_blocks * k_stride), k_nan);
    v.assign(static_cast<size_t>(num_blocks * v_stride), k_nan);
    pos.assign(static_cast<size_t>(num_blocks * pos_stride), -1);
    tables.resize(num_kv_heads);
    size_t next = 0;
    for (size_t g = 0; g < num_kv_heads; ++g) {
      const int64_t len = static_cast<int64_t>(positions[g].size());
      for (int64_t j = 0; j < len; ++j) {
        if (j % bs == 0) tables[g].push_back(ids[next++]);
        const int64_t b = tables[g].back(), s = j % bs;
        std::copy_n(&k_rows[g][j * hd], hd, &k[b * k_stride + s * hd]);
        std::copy_n(&v_rows[g][j * hd], hd, &v[b * v_stride + s * hd]);
        pos[b * pos_stride + s] = positions[g][j];
      }
    }
    for (size_t g = 0; g < num_kv_heads; ++g)
      heads.push_back({tables[g].data(), static_cast<int64_t>(positions[g].size())});
    if (dtype != DType::f32) {
      k16.resize(k.size());
      v16.resize(v.size());
      kv_convert_ref(k.data(), dtype, k16.data(), static_cast<int64_t>(k.size()));
      kv_convert_ref(v.data(), dtype, v16.data(), static_cast<int64_t>(v.size()));
    }
    if (dtype == DType::q8_0) {
      k16.clear();
      v16.clear();
      const int64_t rb = kv_row_bytes(dtype, hd);
      k8_stride = bs * rb + (packed ? 0 : 20);
      v8_stride = bs * rb + (packed ? 0 : 44);
      k8.assign(static_cast<size_t>(num_blocks * k8_stride), 0);
      v8.assign(static_cast<size_t>(num_blocks * v8_stride), 0);
      for (int64_t b = 0; b < num_blocks; ++b) {
        for (int64_t sl = 0; sl < bs; ++sl) {
          kv_convert_ref(&k[b * k_stride + sl * hd], dtype, &k8[b * k8_stride + sl * rb], hd);
          kv_convert_ref(&v[b * v_stride + sl * hd], dtype, &v8[b * v8_stride + sl * rb], hd);
        }
      }
    }
  }

  PagedKv view() const {
    PagedKv kv;
    kv.dtype = dtype;
    kv.k_base = dtype == DType::f32 ? static_cast<const void*>(k.data()) : k16.data();
    kv.v_base = dtype == DType::f32 ? static_cast<const void*>(v.data()) : v16.data();
    kv.pos_base = pos.data();
    kv.k_block_stride = k_stride;
    kv.v_block_stride = v_stride;
    if (dtype == DType::q8_0) {  // strides in bytes
      kv.k_base = k8.data();
      kv.v_base = v8.data();
      kv.k_block_stride = k8_stride;
      kv.v_block_stride = v8_stride;
    }
    kv.pos_block_stride = pos_stride;
    kv.block_size = block_size;
    kv.heads = heads.data();
    return kv;
  }
};

struct Case {
  int64_t num_tokens, kv_len;
  int ratio, head_dim, block_size, window;
};

std::string describe(const Case& c) {
  return "tokens " + std::to_string(c.num_tokens) + " kv_len " + std::to_string(c.kv_len) + " ratio " +
         std::to_string(c.ratio) + " head_dim " + std::to_string(c.head_dim) + " block " +
         std::to_string(c.block_size) + " window " + std::to_string(c.window);
}

// Paged (ref and every SIMD level of cpu) vs attention_ref over contiguous K/V, keys at
// 0..kv_len−1; with a 16-bit dtype the reference sees the rounded K/V the store holds.
void run_case(const Case& c, int num_kv_heads = 2, DType dtype = DType::f32) {
  AttentionParams p;
  p.num_kv_heads = num_kv_heads;
  p.num_heads = num_kv_heads * c.ratio;
  p.head_dim = c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.sliding_window = c.window;
  const int64_t hd = c.head_dim, stride = c.kv_len * hd;
  const std::vector<float> q = test::random_floats(c.num_tokens * p.num_heads * hd, 1, -2.0f, 2.0f);
  const std::vector<float> k = rounded(test::random_floats(num_kv_heads * stride, 2, -2.0f, 2.0f), dtype, hd);
  const std::vector<float> v = rounded(test::random_floats(num_kv_heads * stride, 3), dtype, hd);
  std::vector<int32_t> q_pos(static_cast<size_t>(c.num_tokens));
  const int64_t first = std::max<int64_t>(0, c.kv_len - c.num_tokens);
  for (int64_t t = 0; t < c.num_tokens; ++t) q_pos[t] = static_cast<int32_t>(first + t);

  std::vector<std::vector<float>> k_rows, v_rows;
  std::vector<std::vector<int32_t>> positions;
  for (int g = 0; g < num_kv_heads; ++g) {
    k_rows.emplace_back(k.begin() + g * stride, k.begin() + (g + 1) * stride);
    v_rows.emplace_back(v.begin() + g * stride, v.begin() + (g + 1) * stride);
    positions.emplace_back(static_cast<size_t>(c.kv_len));
    std::iota(positions.back().begin(), positions.back().end(), 0);
  }
  std::vector<float> want(q.size());
  attention_ref(q.data(), q_pos.data(), c.num_tokens, k.data(), v.data(), stride, c.kv_len, p, want.data());
  for (bool packed : {false, true}) {
    const PagedStore store(c.block_size, c.head_dim, k_rows, v_rows, positions, 4, packed, dtype);
    const std::string layout = std::string(packed ? " packed " : " scattered ") + dtype_name(dtype);
    std::vector<float> got(q.size(), -7.0f);
    attention_paged_ref(q.data(), q_pos.data(), c.num_tokens, store.view(), p, got.data());
    EXPECT_TRUE(test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-6))
        << "paged ref " << describe(c) << layout;
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      std::fill(got.begin(), got.end(), -7.0f);
      attention_paged_cpu(q.data(), q_pos.data(), c.num_tokens, store.view(), p, got.data());
      EXPECT_TRUE(test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), k_tol))
          << "paged cpu " << test::level_name(level) << " " << describe(c) << layout;
    }
  }
}

TEST(AttentionPaged, MatchesContiguousReferenceOverShapeTable) {
  for (int64_t num_tokens : {1, 5, 37}) {
    for (int64_t kv_len : {1, 15, 16, 17, 300}) {
      for (int ratio : {1, 3, 4}) {
        for (int head_dim : {64, 128}) {
          for (int block_size : {1, 16, 32}) run_case({num_tokens, kv_len, ratio, head_dim, block_size, 0});
        }
      }
    }
  }
}

TEST(AttentionPaged, SlidingWindowMatchesContiguousReference) {
  for (int64_t num_tokens : {1, 5, 37}) {
    for (int64_t kv_len : {17, 300}) {
      for (int window : {1, 5, 100}) run_case({num_tokens, kv_len, 3, 64, 16, window});
    }
  }
}

TEST(AttentionPaged, LongDecodeSplitsAcrossThreads) {
  run_case({1, 4000, 3, 64, 16, 0}, 3);  // SmolLM2 decode: KV split across threads, merged after
  run_case({1, 3000, 4, 128, 32, 0}, 1);
  run_case({1, 3000, 3, 64, 16, 1000}, 3);
  run_case({200, 200, 3, 64, 16, 0}, 3);  // SmolLM2 prefill chunk
}

TEST(AttentionPaged, OddHeadDimUsesScalarPathCorrectly) { run_case({5, 40, 2, 36, 16, 0}); }

// 16-bit K/V: every SIMD level converts in registers; a conversion slip (wrong lane order,
// a bf16 shift by 8, f16 read as bf16) moves outputs by far more than 1e-5.
TEST(AttentionPaged, Bf16AndF16KvMatchReferenceOverShapeTable) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int64_t num_tokens : {1, 5, 37}) {
      for (int64_t kv_len : {1, 17, 300}) {
        for (int ratio : {1, 3}) {
          for (int head_dim : {64, 128}) {
            for (int block_size : {1, 16}) run_case({num_tokens, kv_len, ratio, head_dim, block_size, 0}, 2, dtype);
          }
        }
      }
    }
    run_case({5, 300, 3, 64, 16, 100}, 2, dtype);  // sliding window
    run_case({1, 4000, 3, 64, 16, 0}, 3, dtype);   // SmolLM2 decode, KV split across threads
    run_case({200, 200, 3, 64, 16, 0}, 3, dtype);  // SmolLM2 prefill chunk
    run_case({5, 40, 2, 36, 16, 0}, 2, dtype);     // odd head_dim: scalar path
    run_case({3, 50, 2, 24, 16, 0}, 2, dtype);     // head_dim 24: AVX2's 8-wide tail, not AVX-512
  }
}

// q8_0 K/V (one f16 scale per 32 values of a row): head_dim 80 has a 16-value last group,
// 36 runs the scalar path; lengths that are not multiples of 16; GQA; sliding window; the
// decode split and a prefill chunk. A scale applied to the wrong group or a sign-extension
// slip (int8 read as uint8) moves outputs by far more than 1e-5.
TEST(AttentionPaged, Q8KvMatchesReferenceOverShapeTable) {
  for (int64_t num_tokens : {1, 5, 37}) {
    for (int64_t kv_len : {1, 17, 300}) {
      for (int ratio : {1, 3}) {
        for (int head_dim : {64, 80, 128}) {
          for (int block_size : {1, 16}) run_case({num_tokens, kv_len, ratio, head_dim, block_size, 0}, 2, DType::q8_0);
        }
      }
    }
  }
  run_case({5, 300, 3, 80, 16, 100}, 2, DType::q8_0);  // sliding window
  run_case({1, 4000, 3, 64, 16, 0}, 3, DType::q8_0);   // SmolLM2 decode, KV split across threads
  run_case({200, 203, 3, 64, 16, 0}, 3, DType::q8_0);  // SmolLM2 prefill chunk at an offset
  run_case({5, 40, 2, 36, 16, 0}, 2, DType::q8_0);     // head_dim 36: scalar path, groups 32 + 4
}

// Naive reference for arbitrary per-head entries: explicit scores, −inf mask, full softmax.
std::vector<float> naive_attention(const std::vector<float>& q, const std::vector<int32_t>& q_pos,
                                   const std::vector<std::vector<float>>& k_rows,
                                   const std::vector<std::vector<float>>& v_rows,
                                   const std::vector<std::vector<int32_t>>& positions, const AttentionParams& p) {
  const int64_t num_tokens = static_cast<int64_t>(q_pos.size());
  const int hd = p.head_dim, group = p.num_heads / p.num_kv_heads;
  std::vector<float> out(q.size(), 0.0f);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < p.num_heads; ++h) {
      const int g = h / group;
      const size_t len = positions[g].size();
      std::vector<double> s(len);
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < len; ++j) {
        double d = 0.0;
        for (int i = 0; i < hd; ++i)
          d += static_cast<double>(q[(t * p.num_heads + h) * hd + i]) * k_rows[g][j * hd + i];
        const int32_t kp = positions[g][j];
        const bool masked = kp > q_pos[t] || (p.sliding_window > 0 && q_pos[t] - kp >= p.sliding_window);
        s[j] = masked ? -std::numeric_limits<double>::infinity() : d * p.scale;
        m = std::max(m, s[j]);
      }
      if (m == -std::numeric_limits<double>::infinity()) continue;  // nothing visible: zeros
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - m));
      for (int i = 0; i < hd; ++i) {
        double o = 0.0;
        for (size_t j = 0; j < len; ++j) o += s[j] / sum * v_rows[g][j * hd + i];
        out[(t * p.num_heads + h) * hd + i] = static_cast<float>(o);
      }
    }
  }
  return out;
}

// Prefill rows, and a decode token's GQA group, run 2-4 at a time through the AVX2 / AVX-512
// tile ops (attention_ops.h) where they share keys; the tiles must give every row the bits of
// the row-at-a-time path (so a row's output does not depend on which rows share its tile:
// batch invariance), over prompt lengths that are not multiples of the tile (tails of 2 and 3
// rows), decode tokens, GQA groups of 1/2/3/4 (tiles spanning tokens), sliding
// windows (rows of a tile with different first keys), chunks starting at an offset, heads of
// different lengths and every KV dtype. Against the reference too (run_case covers the rest).
TEST(AttentionPaged, TiledPrefillEqualsRowPathBitForBit) {
  struct Shape {
    int64_t num_tokens, offset;
    int ratio, head_dim, window;
  };
  const Shape shapes[] = {{4, 0, 1, 64, 0},    {5, 0, 1, 64, 0},    {13, 0, 3, 64, 0},  {37, 11, 3, 64, 0},
                          {37, 0, 4, 128, 0},  {29, 100, 3, 80, 0}, {66, 0, 3, 64, 7},  {70, 40, 1, 64, 100},
                          {19, 0, 2, 24, 0},   {200, 57, 3, 64, 0}, {130, 0, 3, 64, 50},
                          // decode: one token whose GQA group of 3 or 2 rows runs as a tile
                          {1, 300, 3, 64, 0},  {1, 77, 2, 128, 0},  {2, 500, 3, 80, 0}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::q8_0}) {
    for (const Shape& sh : shapes) {
      const int num_kv_heads = 2, hd = sh.head_dim;
      AttentionParams p{num_kv_heads * sh.ratio, num_kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd)), sh.window};
      const int64_t total = sh.offset + sh.num_tokens;
      // Head 1 lost every 5th of its first keys to compression: heads of different lengths.
      std::vector<std::vector<int32_t>> positions(num_kv_heads);
      for (int32_t x = 0; x < total; ++x) {
        positions[0].push_back(x);
        if (x >= sh.offset || x % 5 != 0) positions[1].push_back(x);
      }
      std::vector<std::vector<float>> k_rows, v_rows;
      for (int g = 0; g < num_kv_heads; ++g) {
        const int64_t n = static_cast<int64_t>(positions[g].size()) * hd;
        k_rows.push_back(rounded(test::random_floats(n, 70 + g, -2.0f, 2.0f), dtype, hd));
        v_rows.push_back(rounded(test::random_floats(n, 80 + g), dtype, hd));
      }
      std::vector<int32_t> q_pos(static_cast<size_t>(sh.num_tokens));
      std::iota(q_pos.begin(), q_pos.end(), static_cast<int32_t>(sh.offset));
      const std::vector<float> q = test::random_floats(sh.num_tokens * p.num_heads * hd, 90, -2.0f, 2.0f);
      const std::string what = std::string(dtype_name(dtype)) + " tokens " + std::to_string(sh.num_tokens) +
                               " offset " + std::to_string(sh.offset) + " ratio " + std::to_string(sh.ratio) +
                               " head_dim " + std::to_string(hd) + " window " + std::to_string(sh.window);
      const std::vector<float> want = naive_attention(q, q_pos, k_rows, v_rows, positions, p);
      for (bool packed : {false, true}) {
        const PagedStore store(16, hd, k_rows, v_rows, positions, 9, packed, dtype);
        for (SimdLevel level : test::supported_levels()) {
          test::LevelGuard guard(level);
          std::vector<float> tiled(q.size(), -7.0f), rows(q.size(), -7.0f);
          attention_tiles_override(false);
          attention_paged_cpu(q.data(), q_pos.data(), sh.num_tokens, store.view(), p, rows.data());
          attention_tiles_override(true);
          attention_paged_cpu(q.data(), q_pos.data(), sh.num_tokens, store.view(), p, tiled.data());
          EXPECT_EQ(std::memcmp(tiled.data(), rows.data(), tiled.size() * sizeof(float)), 0)
              << test::level_name(level) << " " << what << (packed ? " packed" : " scattered");
          EXPECT_TRUE(test::all_close(tiled.data(), want.data(), static_cast<int64_t>(want.size()), k_tol))
              << test::level_name(level) << " " << what;
        }
      }
    }
  }
}

TEST(AttentionPaged, CompactedHeadsWithDifferentLengthsMatchNaive) {
  // 4 KV heads after compression: 700 of 1200 positions, 1 position, none, every 3rd, as
  // SnapKV leaves them; queries are a decode token and a 5-token chunk at the end.
  const int hd = 64, num_kv_heads = 4, ratio = 3;
  const int32_t seq_len = 1200;
  std::mt19937 gen(21);
  std::vector<std::vector<int32_t>> positions(num_kv_heads);
  for (int32_t x = 0; x < seq_len; ++x)
    if (gen() % 12 < 7) positions[0].push_back(x);
  positions[1] = {seq_len - 1};
  for (int32_t x = 0; x < seq_len; x += 3) positions[3].push_back(x);
  std::vector<std::vector<float>> k_rows, v_rows;
  for (int g = 0; g < num_kv_heads; ++g) {
    const int64_t n = static_cast<int64_t>(positions[g].size()) * hd;
    k_rows.push_back(test::random_floats(n, 30 + g, -2.0f, 2.0f));
    v_rows.push_back(test::random_floats(n, 40 + g));
  }
  AttentionParams p{num_kv_heads * ratio, num_kv_heads, hd, 0.125f, 0};
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::q8_0}) {
    const std::vector<std::vector<float>> kd = rounded(k_rows, dtype, hd), vd = rounded(v_rows, dtype, hd);
    for (const std::vector<int32_t>& q_pos :
         {std::vector<int32_t>{seq_len}, std::vector<int32_t>{1195, 1196, 1197, 1198, 1199}}) {
      for (int window : {0, 50}) {
        p.sliding_window = window;
        const std::vector<float> q = test::random_floats(static_cast<int64_t>(q_pos.size()) * p.num_heads * hd, 50);
        const std::vector<float> want = naive_attention(q, q_pos, kd, vd, positions, p);
        for (int block_size : {1, 16, 32}) {
          const PagedStore store(block_size, hd, kd, vd, positions, 5, block_size == 16, dtype);
          const std::string what = "tokens " + std::to_string(q_pos.size()) + " window " + std::to_string(window) +
                                   " block " + std::to_string(block_size) + " " + dtype_name(dtype);
          std::vector<float> got(q.size(), -7.0f);
          attention_paged_ref(q.data(), q_pos.data(), static_cast<int64_t>(q_pos.size()), store.view(), p, got.data());
          EXPECT_TRUE(test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-6)) << "ref " << what;
          for (SimdLevel level : test::supported_levels()) {
            test::LevelGuard guard(level);
            std::fill(got.begin(), got.end(), -7.0f);
            attention_paged_cpu(q.data(), q_pos.data(), static_cast<int64_t>(q_pos.size()), store.view(), p, got.data());
            EXPECT_TRUE(test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), k_tol))
                << "cpu " << test::level_name(level) << " " << what;
          }
        }
      }
    }
  }
}

TEST(AttentionPaged, NanInVisibleValueIsNotHidden) {
  const int hd = 64;
  const int64_t len = 600;  // long enough for the decode split
  std::vector<std::vector<int32_t>> positions(1, std::vector<int32_t>(len));
  std::iota(positions[0].begin(), positions[0].end(), 0);
  std::vector<std::vector<float>> k_rows{test::random_floats(len * hd, 60)}, v_rows{test::random_floats(len * hd, 61)};
  v_rows[0][300 * hd + 5] = k_nan;
  AttentionParams p{3, 1, hd, 0.125f, 0};
  const std::vector<float> q = test::random_floats(2 * 3 * hd, 62);
  const std::vector<int32_t> q_pos{200, 599};  // the first query does not see key 300
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::q8_0}) {
    const PagedStore store(16, hd, k_rows, v_rows, positions, 6, false, dtype);
    for (SimdLevel level : test::supported_levels()) {
      test::LevelGuard guard(level);
      std::vector<float> got(q.size(), 0.0f);
      attention_paged_cpu(q.data(), q_pos.data(), 2, store.view(), p, got.data());
      for (int h = 0; h < 3; ++h) {
        EXPECT_FALSE(std::isnan(got[h * hd + 5])) << test::level_name(level) << " " << dtype_name(dtype) << " head " << h << " query 0";
        EXPECT_TRUE(std::isnan(got[(3 + h) * hd + 5])) << test::level_name(level) << " " << dtype_name(dtype) << " head " << h << " query 1";
      }
    }
  }
}

}  // namespace
}  // namespace snap::kernels
