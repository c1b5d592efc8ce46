// Prefill attention with and without the 4-row tiles (kernels/cpu/attention_ops.h), at
// SmolLM2's shape (9 query heads, 3 KV heads, head_dim 64): one layer's attention over a
// whole prompt of N tokens prefilled in chunks of 256 (each chunk's queries against every
// key up to it: the causal mask of the packed cache does the limiting), per KV dtype.
// Tiles on and off alternate run by run (the machine is shared: interleaved, medians).
// Usage: bench_attention_tiles [N ...]   (default 2048 8192); prints ms per layer and the ratio.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/attention_paged.h"
#include "kernels/cpu/attention_ops.h"
#include "kernels/kv_convert.h"

namespace {

using snap::DType;
namespace k = snap::kernels;

constexpr int k_heads = 9, k_kv_heads = 3, k_hd = 64, k_bs = 16;
constexpr int64_t k_chunk = 256;
constexpr int k_reps = 5;

// A packed paged store of n keys per KV head (blocks in order, as after a sequential prefill).
struct Store {
  std::vector<uint8_t> k, v;
  std::vector<int32_t> pos;
  std::vector<std::vector<int32_t>> tables;
  std::vector<k::PagedKvHead> heads;
  k::PagedKv view;
  Store(int64_t n, DType dtype) {
    const int64_t rb = k::kv_row_bytes(dtype, k_hd), blocks_per_head = (n + k_bs - 1) / k_bs;
    const int64_t blocks = blocks_per_head * k_kv_heads;
    k.resize(static_cast<size_t>(blocks * k_bs * rb));
    v.resize(k.size());
    pos.resize(static_cast<size_t>(blocks * k_bs));
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> row(k_hd);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t s = 0; s < k_bs; ++s) {
        for (float& x : row) x = dist(gen);
        k::kv_convert_cpu(row.data(), dtype, &k[static_cast<size_t>((b * k_bs + s) * rb)], k_hd);
        for (float& x : row) x = dist(gen);
        k::kv_convert_cpu(row.data(), dtype, &v[static_cast<size_t>((b * k_bs + s) * rb)], k_hd);
        pos[static_cast<size_t>(b * k_bs + s)] = static_cast<int32_t>((b % blocks_per_head) * k_bs + s);
      }
    }
    tables.resize(k_kv_heads);
    for (int g = 0; g < k_kv_heads; ++g) {
      for (int64_t b = 0; b < blocks_per_head; ++b) tables[g].push_back(static_cast<int32_t>(g * blocks_per_head + b));
      heads.push_back({tables[g].data(), n});
    }
    view.dtype = dtype;
    view.k_base = k.data();
    view.v_base = v.data();
    view.pos_base = pos.data();
    const int64_t stride = dtype == DType::q8_0 ? k_bs * rb : int64_t{k_bs} * k_hd;  // bytes for q8_0
    view.k_block_stride = view.v_block_stride = stride;
    view.pos_block_stride = k_bs;
    view.block_size = k_bs;
    view.heads = heads.data();
  }
};

double one_layer_ms(const Store& st, int64_t n, const std::vector<float>& q, std::vector<float>& out) {
  const k::AttentionParams p{k_heads, k_kv_heads, k_hd, 0.125f, 0};
  std::vector<int32_t> q_pos(k_chunk);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t start = 0; start < n; start += k_chunk) {
    const int64_t len = std::min(k_chunk, n - start);
    for (int64_t t = 0; t < len; ++t) q_pos[t] = static_cast<int32_t>(start + t);
    k::attention_paged_cpu(q.data(), q_pos.data(), len, st.view, p, out.data());
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths;
  for (int i = 1; i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
  if (lengths.empty()) lengths = {2048, 8192};
  for (int64_t n : lengths) {
    if (n < 1) {
      std::fprintf(stderr, "bench_attention_tiles: prompt length %lld must be positive\n", static_cast<long long>(n));
      return 2;
    }
  }
  std::vector<float> q(static_cast<size_t>(k_chunk * k_heads * k_hd));
  std::mt19937 gen(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : q) x = dist(gen);
  std::vector<float> out(q.size());
  std::printf("prefill attention, one layer, chunks of %lld, %d interleaved runs each (median ms)\n",
              static_cast<long long>(k_chunk), k_reps);
  for (int64_t n : lengths) {
    for (DType dtype : {DType::f32, DType::f16, DType::q8_0}) {
      const Store st(n, dtype);
      std::vector<double> rows, tiles;
      for (int r = 0; r < k_reps; ++r) {
        k::attention_tiles_override(false);
        rows.push_back(one_layer_ms(st, n, q, out));
        k::attention_tiles_override(true);
        tiles.push_back(one_layer_ms(st, n, q, out));
      }
      const double a = median(rows), b = median(tiles);
      std::printf("N %5lld %-5s  rows %8.1f ms  tiles %8.1f ms  ratio tiles/rows %.3f\n", static_cast<long long>(n),
                  snap::dtype_name(dtype), a, b, b / a);
    }
  }
  return 0;
}
