// SnapKV selection on the device: the twin of snapkv_scores / snapkv_select (worker/kv/
// selection.cpp) for one layer, reading K from the paged per-head cache (bf16) and the
// window queries (f32) from the device, writing per KV head the pooled scores and the kept
// positions. Same definition as the CPU: window row i (position N−W+i) softmaxes over keys
// 0..N−W+i, its probabilities summed over the W rows for each prefix position j < N−W, then
// mean/max over the GQA group, 1-D pooling (kernel k, padding k/2; avg divides by k), NaN ->
// −inf, top (B−W) by (score desc, position asc) plus the window.
//   1. partials: block = (64-key tile, KV head); K tile in shared memory, each warp scores
//      its rows (query head, window row) against the tile -> per (row, tile) max and Σexp.
//   2. row stats: per row, the tiles merged in tile order -> max M and sum L.
//   3. scores: one thread per key recomputes the dots, p = e^(s−M)·(1/L), summed over window
//      rows in ascending order and over the group's heads in order, as the CPU does.
//   4. pooling + NaN -> −inf; 5. CUB segmented radix sorts (stable: equal scores keep the
//      lower position first) pick the top B−W per head and put them in ascending order.
// Dots are formed as the CPU forms them (d ascending, separately rounded × and +, then ×
// scale), so the scores differ from the CPU's only through exp and the order of the
// softmax sum (~1e-7 relative): selections agree except at such near-ties.
#include <cub/device/device_segmented_radix_sort.cuh>

#include <cmath>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/selection_common.cuh"

namespace snap::kernels {

using selection::dot_as_cpu;
using selection::k_qrows;
using selection::k_tile;
using selection::load_key_tile;
using selection::warp_max;
using selection::warp_sum;

namespace {
constexpr int k_part_warps = 4;  // warps of the partials kernel

// Query row r of KV head g: query head g·group + r / W, window row r % W; into q_s[rr][hd].
__device__ void load_query_rows(const float* q_window, int g, int group, int window, int num_heads, int hd,
                                int r0, int nrows, float* q_s) {
  for (int idx = threadIdx.x; idx < nrows * hd; idx += blockDim.x) {
    const int rr = idx / hd, d = idx % hd;
    const int r = r0 + rr;
    const int h = g * group + r / window, i = r % window;
    q_s[idx] = q_window[(static_cast<int64_t>(i) * num_heads + h) * hd + d];
  }
}
}  // namespace

// Grid (tiles, num_kv_heads), k_part_warps warps. part[(h·W + i)·tiles + tile] = (max, Σexp)
// over the tile's keys visible to window row i (j <= N−W+i); (−inf, 0) when none are.
__global__ void snapkv_partials_kernel(const float* q_window, PagedKvCuda kv, int64_t num_tokens, int num_heads,
                                       int num_kv_heads, int hd, int window, float scale, int64_t tiles,
                                       float2* part) {
  extern __shared__ float smem[];
  float* k_s = smem;                      // [k_tile][hd + 1]
  float* q_s = k_s + k_tile * (hd + 1);   // [k_qrows][hd]
  const int g = blockIdx.y, group = num_heads / num_kv_heads;
  const int64_t tile = blockIdx.x, j0 = tile * k_tile;
  const int n = static_cast<int>(num_tokens - j0 < k_tile ? num_tokens - j0 : k_tile);
  const PagedKvHead head = kv.heads[g];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t prefix = num_tokens - window;
  load_key_tile(kv, head, j0, n, hd, k_s);
  const int rows = group * window;
  for (int r0 = 0; r0 < rows; r0 += k_qrows) {
    const int nrows = rows - r0 < k_qrows ? rows - r0 : k_qrows;
    __syncthreads();  // the previous chunk's rows are done (and, first time, nothing pending)
    load_query_rows(q_window, g, group, window, num_heads, hd, r0, nrows, q_s);
    __syncthreads();
    for (int rr = warp; rr < nrows; rr += k_part_warps) {
      const int r = r0 + rr;
      const int h = g * group + r / window, i = r % window;
      const int64_t visible = prefix + i + 1;
      float s[2];
      for (int u = 0; u < 2; ++u) {
        const int jj = lane + 32 * u;
        s[u] = jj < n && j0 + jj < visible ? __fmul_rn(dot_as_cpu(q_s + rr * hd, k_s + jj * (hd + 1), hd), scale)
                                           : -INFINITY;
      }
      const float m = warp_max(fmaxf(s[0], s[1]));
      float l = 0.0f;
      if (m > -INFINITY) l = warp_sum((s[0] > -INFINITY ? expf(s[0] - m) : 0.0f) + (s[1] > -INFINITY ? expf(s[1] - m) : 0.0f));
      if (lane == 0) part[(static_cast<int64_t>(h) * window + i) * tiles + tile] = make_float2(m, l);
    }
  }
}

// One thread per row (h, i): stats[row] = (M, 1/L), tiles merged in order.
__global__ void snapkv_row_stats_kernel(const float2* part, int64_t rows, int64_t tiles, float2* stats) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float2* p = part + row * tiles;
  float m = -INFINITY;
  for (int64_t t = 0; t < tiles; ++t) m = fmaxf(m, p[t].x);
  float l = 0.0f;
  for (int64_t t = 0; t < tiles; ++t)
    if (p[t].x > -INFINITY) l += p[t].y * expf(p[t].x - m);
  stats[row] = make_float2(m, 1.0f / l);
}

// Grid (prefix tiles, num_kv_heads), k_tile threads, one per prefix key j < N−W:
// agg[g·prefix + j] = mean/max over the group of Σ_i e^(s_hij − M_hi)·inv_hi.
__global__ void snapkv_scores_kernel(const float* q_window, PagedKvCuda kv, int64_t num_tokens, int num_heads,
                                     int num_kv_heads, int hd, int window, float scale, const float2* stats,
                                     bool max_aggregation, float* agg) {
  extern __shared__ float smem[];
  float* k_s = smem;
  float* q_s = k_s + k_tile * (hd + 1);
  const int g = blockIdx.y, group = num_heads / num_kv_heads;
  const int64_t prefix = num_tokens - window;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * k_tile;
  const int n = static_cast<int>(prefix - j0 < k_tile ? prefix - j0 : k_tile);
  const PagedKvHead head = kv.heads[g];
  load_key_tile(kv, head, j0, n, hd, k_s);
  const int jj = threadIdx.x;
  const int64_t j = j0 + jj;
  float o = 0.0f, per_head = 0.0f;
  const int rows = group * window;
  for (int r0 = 0; r0 < rows; r0 += k_qrows) {
    const int nrows = rows - r0 < k_qrows ? rows - r0 : k_qrows;
    __syncthreads();
    load_query_rows(q_window, g, group, window, num_heads, hd, r0, nrows, q_s);
    __syncthreads();
    if (jj >= n) continue;
    for (int rr = 0; rr < nrows; ++rr) {
      const int r = r0 + rr;
      const int hl = r / window, i = r % window;  // rows run (head, window row) in order
      const float2 st = stats[static_cast<int64_t>(g * group + hl) * window + i];
      // Every prefix key j < N−W is visible to every window row.
      const float s = __fmul_rn(dot_as_cpu(q_s + rr * hd, k_s + jj * (hd + 1), hd), scale);
      per_head = __fadd_rn(per_head, __fmul_rn(expf(s - st.x), st.y));
      if (i == window - 1) {  // head hl complete: fold into the group score, heads in order
        if (hl == 0)
          o = per_head;
        else
          o = max_aggregation ? (per_head > o ? per_head : o) : __fadd_rn(o, per_head);
        per_head = 0.0f;
      }
    }
  }
  if (jj < n) {
    if (!max_aggregation && group > 1) o = __fmul_rn(o, 1.0f / static_cast<float>(group));
    agg[g * prefix + j] = o;
  }
}

// pooled[g·prefix + j] over [j − k/2, j + k/2] ∩ [0, prefix); NaN -> −inf. Also the
// positions 0..prefix−1 of each segment, the sort's values.
__global__ void snapkv_pool_kernel(const float* agg, int64_t prefix, int num_kv_heads, int kernel, bool max_pooling,
                                   float* pooled, int32_t* positions) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= prefix * num_kv_heads) return;
  const int64_t g = idx / prefix, j = idx % prefix, half = kernel / 2;
  const float* s = agg + g * prefix;
  const int64_t lo = j - half > 0 ? j - half : 0, hi = j + half + 1 < prefix ? j + half + 1 : prefix;
  float v;
  if (max_pooling) {
    v = s[lo];
    for (int64_t i = lo + 1; i < hi; ++i) v = s[i] > v ? s[i] : v;
  } else {
    float sum = 0.0f;
    for (int64_t i = lo; i < hi; ++i) sum = __fadd_rn(sum, s[i]);
    v = __fdiv_rn(sum, static_cast<float>(kernel));
  }
  pooled[idx] = isnan(v) ? -INFINITY : v;
  if (positions) positions[idx] = static_cast<int32_t>(j);
}

// kept[g·budget + m] for m < keep: the first keep sorted positions; then the window.
__global__ void snapkv_gather_kernel(const int32_t* sorted_positions, int64_t prefix, int64_t keep, int64_t budget,
                                     int num_kv_heads, int32_t* top, int32_t* kept_window) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= budget * num_kv_heads) return;
  const int64_t g = idx / budget, m = idx % budget;
  if (m < keep)
    top[g * keep + m] = sorted_positions[g * prefix + m];
  else
    kept_window[idx] = static_cast<int32_t>(prefix + (m - keep));
}

__global__ void snapkv_offsets_kernel(int num_segments, int64_t stride, int64_t len, int* begin, int* end) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= num_segments) return;
  begin[s] = static_cast<int>(s * stride);
  end[s] = static_cast<int>(s * stride + len);
}

__global__ void snapkv_copy_top_kernel(const int32_t* top_sorted, int64_t keep, int64_t budget, int num_kv_heads,
                                       int32_t* kept) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= keep * num_kv_heads) return;
  const int64_t g = idx / keep, m = idx % keep;
  kept[g * budget + m] = top_sorted[idx];
}

namespace {
// The workspace, carved in this order; every piece 256-byte aligned. The first three pieces
// (part, stats, agg) are all that snapkv_scores_cuda needs.
struct Layout {
  size_t part, stats, agg, pos_in, keys_out, pos_out, top, top_sorted, offsets, cub, total, scores_total;
};
size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

size_t cub_bytes(int64_t items, int segments, int64_t keep) {
  size_t a = 0, b = 0;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, a, static_cast<const float*>(nullptr),
                                                     static_cast<float*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<int>(items), segments,
                                                     static_cast<const int*>(nullptr), static_cast<const int*>(nullptr));
  cub::DeviceSegmentedRadixSort::SortKeys(nullptr, b, static_cast<const int32_t*>(nullptr),
                                          static_cast<int32_t*>(nullptr), static_cast<int>(keep * segments), segments,
                                          static_cast<const int*>(nullptr), static_cast<const int*>(nullptr));
  return a > b ? a : b;
}

Layout layout(int64_t num_tokens, int num_heads, int num_kv_heads, const SnapKvCudaParams& sp) {
  const int64_t prefix = num_tokens - sp.window, keep = sp.budget - sp.window;
  const int64_t tiles = (num_tokens + k_tile - 1) / k_tile;
  const int64_t rows = static_cast<int64_t>(num_heads) * sp.window;
  const int64_t items = prefix * num_kv_heads;
  Layout l{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  l.part = take(sizeof(float2) * rows * tiles);
  l.stats = take(sizeof(float2) * rows);
  l.agg = take(sizeof(float) * items);
  l.scores_total = off;
  l.pos_in = take(sizeof(int32_t) * items);
  l.keys_out = take(sizeof(float) * items);
  l.pos_out = take(sizeof(int32_t) * items);
  l.top = take(sizeof(int32_t) * keep * num_kv_heads);
  l.top_sorted = take(sizeof(int32_t) * keep * num_kv_heads);
  l.offsets = take(sizeof(int) * 4 * num_kv_heads);
  l.cub = take(cub_bytes(items, num_kv_heads, keep));
  l.total = off;
  return l;
}

bool common_valid(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp) {
  return p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0 && p.head_dim > 0 && p.head_dim <= 256 &&
         sp.window >= 1 && num_tokens > sp.window && sp.kernel >= 1 && sp.kernel % 2 == 1 &&
         num_tokens * p.num_kv_heads < (int64_t{1} << 31);  // CUB's int item counts
}
bool valid(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp) {
  return common_valid(num_tokens, p, sp) && sp.budget > sp.window && num_tokens > sp.budget;
}
// The scores need no budget: any B with W < B < N gives the same layout's first pieces.
SnapKvCudaParams scores_only(int64_t num_tokens, SnapKvCudaParams sp) {
  sp.budget = num_tokens - 1;
  return sp;
}

// Steps 1-4: partials, row stats, group scores, pooling -> scores [nkv][N−W] (NaN -> −inf)
// and, when positions is not null, positions[g·prefix + j] = j (the sort's values).
void launch_scores(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens, const AttentionParams& p,
                   const SnapKvCudaParams& sp, char* ws, const Layout& l, float* scores, int32_t* positions,
                   cudaStream_t stream) {
  auto* part = reinterpret_cast<float2*>(ws + l.part);
  auto* stats = reinterpret_cast<float2*>(ws + l.stats);
  auto* agg = reinterpret_cast<float*>(ws + l.agg);
  const int hd = p.head_dim, nkv = p.num_kv_heads;
  const int64_t prefix = num_tokens - sp.window;
  const int64_t tiles = (num_tokens + k_tile - 1) / k_tile;
  const int64_t rows = static_cast<int64_t>(p.num_heads) * sp.window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));  // as the CPU computes it
  const size_t smem = selection::tile_smem_bytes(hd);
  if (smem > 48 * 1024) {  // head_dim > 96 needs the opt-in (at most 99 KB at head_dim 256)
    cudaFuncSetAttribute(snapkv_partials_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    cudaFuncSetAttribute(snapkv_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  }
  snapkv_partials_kernel<<<dim3(static_cast<unsigned>(tiles), nkv), k_part_warps * 32, smem, stream>>>(
      q_window, kv, num_tokens, p.num_heads, nkv, hd, sp.window, scale, tiles, part);
  snapkv_row_stats_kernel<<<static_cast<unsigned>((rows + 127) / 128), 128, 0, stream>>>(part, rows, tiles, stats);
  snapkv_scores_kernel<<<dim3(static_cast<unsigned>((prefix + k_tile - 1) / k_tile), nkv), k_tile, smem, stream>>>(
      q_window, kv, num_tokens, p.num_heads, nkv, hd, sp.window, scale, stats, sp.max_aggregation, agg);
  const int64_t items = prefix * nkv;
  snapkv_pool_kernel<<<static_cast<unsigned>((items + 255) / 256), 256, 0, stream>>>(agg, prefix, nkv, sp.kernel,
                                                                                   sp.max_pooling, scores, positions);
}
}  // namespace

size_t snapkv_scores_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp) {
  if (!common_valid(num_tokens, p, sp)) return 0;
  return layout(num_tokens, p.num_heads, p.num_kv_heads, scores_only(num_tokens, sp)).scores_total;
}

cudaError_t snapkv_scores_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                               const AttentionParams& p, const SnapKvCudaParams& sp, float* scores, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream) {
  if (!common_valid(num_tokens, p, sp)) return cudaErrorInvalidValue;
  const Layout l = layout(num_tokens, p.num_heads, p.num_kv_heads, scores_only(num_tokens, sp));
  if (workspace_bytes < l.scores_total) return cudaErrorInvalidValue;
  launch_scores(q_window, kv, num_tokens, p, sp, static_cast<char*>(workspace), l, scores, nullptr, stream);
  return cudaGetLastError();
}

size_t snapkv_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp) {
  if (!valid(num_tokens, p, sp)) return 0;
  return layout(num_tokens, p.num_heads, p.num_kv_heads, sp).total;
}

cudaError_t snapkv_select_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                               const AttentionParams& p, const SnapKvCudaParams& sp, float* scores, int32_t* kept,
                               void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!valid(num_tokens, p, sp)) return cudaErrorInvalidValue;
  const Layout l = layout(num_tokens, p.num_heads, p.num_kv_heads, sp);
  if (workspace_bytes < l.total) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  auto* pos_in = reinterpret_cast<int32_t*>(ws + l.pos_in);
  auto* keys_out = reinterpret_cast<float*>(ws + l.keys_out);
  auto* pos_out = reinterpret_cast<int32_t*>(ws + l.pos_out);
  auto* top = reinterpret_cast<int32_t*>(ws + l.top);
  auto* top_sorted = reinterpret_cast<int32_t*>(ws + l.top_sorted);
  auto* offsets = reinterpret_cast<int*>(ws + l.offsets);
  void* cub_tmp = ws + l.cub;
  size_t cub_size = workspace_bytes - l.cub;

  const int nkv = p.num_kv_heads;
  const int64_t prefix = num_tokens - sp.window, keep = sp.budget - sp.window;
  launch_scores(q_window, kv, num_tokens, p, sp, ws, l, scores, pos_in, stream);
  const int64_t items = prefix * nkv;
  int* seg_begin = offsets;
  int* seg_end = offsets + nkv;
  int* top_begin = offsets + 2 * nkv;
  int* top_end = offsets + 3 * nkv;
  snapkv_offsets_kernel<<<(nkv + 127) / 128, 128, 0, stream>>>(nkv, prefix, prefix, seg_begin, seg_end);
  snapkv_offsets_kernel<<<(nkv + 127) / 128, 128, 0, stream>>>(nkv, keep, keep, top_begin, top_end);
  cudaError_t err = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      cub_tmp, cub_size, scores, keys_out, pos_in, pos_out, static_cast<int>(items), nkv, seg_begin, seg_end, 0,
      static_cast<int>(sizeof(float) * 8), stream);
  if (err != cudaSuccess) return err;
  snapkv_gather_kernel<<<static_cast<unsigned>((sp.budget * nkv + 255) / 256), 256, 0, stream>>>(
      pos_out, prefix, keep, sp.budget, nkv, top, kept);
  err = cub::DeviceSegmentedRadixSort::SortKeys(cub_tmp, cub_size, top, top_sorted, static_cast<int>(keep * nkv), nkv,
                                                top_begin, top_end, 0, static_cast<int>(sizeof(int32_t) * 8), stream);
  if (err != cudaSuccess) return err;
  snapkv_copy_top_kernel<<<static_cast<unsigned>((keep * nkv + 255) / 256), 256, 0, stream>>>(top_sorted, keep,
                                                                                            sp.budget, nkv, kept);
  return cudaGetLastError();
}

}  // namespace snap::kernels
