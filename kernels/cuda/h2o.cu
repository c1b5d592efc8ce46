// H2O on the device: the twins of H2oAccumulator::add and ::select (worker/kv/selection.cpp)
// for one layer. The score of key j for query head h is the attention every prompt query at
// a position >= j paid it: Σ_i softmax_i(j), causal, accumulated chunk by chunk during prefill.
//   accumulate, per prefill chunk:
//     1. row statistics: one warp per (query row, head) walks the row's visible keys 0..pos_i
//        of the paged cache with an online max/sum -> (M_i, 1/L_i);
//     2. columns: block = (64-key tile, query head), K tile in shared memory, one thread per
//        key adds e^(s_ij − M_i)·(1/L_i) over the chunk's rows in ascending order onto the
//        running score (the CPU adds row by row onto the same running value).
//   select: mean/max over each GQA group (heads in order, mean = sum · 1/group as the CPU),
//     NaN -> −inf, then the top B − recent of positions < N − recent by (score desc,
//     position asc): a stable CUB segmented radix sort, the first B − recent ids of each head,
//     sorted ascending.
// Dots are formed as the CPU forms them (selection_common.cuh); exp and the softmax sum's
// order differ (~1e-7 relative), so selections agree except at such near-ties.
// Cost: the N×N attention of the prompt once more, on CUDA cores (H2O is the baseline policy).
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/selection_common.cuh"

namespace snap::kernels {

using selection::dot_as_cpu;
using selection::k_qrows;
using selection::k_tile;
using selection::load_key_tile;
using selection::paged_key;
using selection::warp_max;
using selection::warp_sum;

namespace {
constexpr int k_stats_warps = 8;
}

// stats[i·num_heads + h] = (M, 1/L) of query row i, head h, over keys 0 .. first + i.
__global__ void h2o_row_stats_kernel(const float* q, int64_t num_queries, int64_t first, PagedKvCuda kv, int num_heads,
                                     int num_kv_heads, int hd, float scale, float2* stats) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * k_stats_warps + (threadIdx.x >> 5);
  if (r >= num_queries * num_heads) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = r / num_heads;
  const int h = static_cast<int>(r % num_heads), g = h / (num_heads / num_kv_heads);
  const PagedKvHead head = kv.heads[g];
  const float* qi = q + r * hd;  // rows [i][h] are contiguous: r = i·num_heads + h
  const int64_t visible = first + i + 1;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = lane; j < visible; j += 32) {
    float acc = 0.0f;
    for (int d = 0; d < hd; ++d) acc = __fadd_rn(acc, __fmul_rn(qi[d], paged_key(kv, head, j, hd, d)));
    const float s = __fmul_rn(acc, scale);
    if (s > m) {
      l = l * expf(m - s) + 1.0f;
      m = s;
    } else {
      l += expf(s - m);
    }
  }
  const float mm = warp_max(m);
  const float ll = warp_sum(m > -INFINITY ? l * expf(m - mm) : 0.0f);
  if (lane == 0) stats[r] = make_float2(mm, 1.0f / ll);
}

// Grid (key tiles over 0 .. first + num_queries − 1, num_heads), k_tile threads.
__global__ void h2o_columns_kernel(const float* q, int64_t num_queries, int64_t first, PagedKvCuda kv, int num_heads,
                                   int num_kv_heads, int hd, float scale, const float2* stats, float* acc,
                                   int64_t acc_stride) {
  extern __shared__ float smem[];
  float* k_s = smem;                     // [k_tile][hd + 1]
  float* q_s = k_s + k_tile * (hd + 1);  // [k_qrows][hd]
  const int h = blockIdx.y, g = h / (num_heads / num_kv_heads);
  const int64_t end = first + num_queries;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * k_tile;
  const int n = static_cast<int>(end - j0 < k_tile ? end - j0 : k_tile);
  const PagedKvHead head = kv.heads[g];
  load_key_tile(kv, head, j0, n, hd, k_s);
  const int jj = threadIdx.x;
  const int64_t j = j0 + jj;
  float* out = acc + static_cast<int64_t>(h) * acc_stride + j;
  float local = jj < n ? *out : 0.0f;
  // Rows whose position (first + i) is below j0 see none of this tile's keys.
  const int64_t i_begin = j0 > first ? j0 - first : 0;
  for (int64_t i0 = i_begin; i0 < num_queries; i0 += k_qrows) {
    const int nrows = static_cast<int>(num_queries - i0 < k_qrows ? num_queries - i0 : k_qrows);
    __syncthreads();  // the previous chunk's rows are done (first time: the key tile is loaded)
    for (int idx = threadIdx.x; idx < nrows * hd; idx += blockDim.x) {
      const int rr = idx / hd, d = idx % hd;
      q_s[idx] = q[((i0 + rr) * num_heads + h) * hd + d];
    }
    __syncthreads();
    if (jj >= n) continue;
    for (int rr = 0; rr < nrows; ++rr) {
      const int64_t i = i0 + rr;
      if (first + i < j) continue;  // causal: key j is after this query
      const float2 st = stats[i * num_heads + h];
      const float s = __fmul_rn(dot_as_cpu(q_s + rr * hd, k_s + jj * (hd + 1), hd), scale);
      local = __fadd_rn(local, __fmul_rn(expf(s - st.x), st.y));
    }
  }
  if (jj < n) *out = local;
}

// scores[g·N + j] = mean/max over group g's heads of acc[h·stride + j], NaN -> −inf; ids = index.
__global__ void h2o_group_kernel(const float* acc, int64_t acc_stride, int64_t num_tokens, int num_heads,
                                 int num_kv_heads, bool max_aggregation, float* scores, int32_t* ids) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= num_tokens * num_kv_heads) return;
  const int64_t g = idx / num_tokens, j = idx % num_tokens;
  const int group = num_heads / num_kv_heads;
  float o = acc[g * group * acc_stride + j];
  for (int hl = 1; hl < group; ++hl) {
    const float s = acc[(g * group + hl) * acc_stride + j];
    o = max_aggregation ? (s > o ? s : o) : __fadd_rn(o, s);
  }
  if (!max_aggregation && group > 1) o = __fmul_rn(o, 1.0f / static_cast<float>(group));
  scores[idx] = isnan(o) ? -INFINITY : o;
  ids[idx] = static_cast<int32_t>(idx);
}

__global__ void h2o_offsets_kernel(int num_segments, int64_t stride, int64_t len, int* begin, int* end) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= num_segments) return;
  begin[s] = static_cast<int>(s * stride);
  end[s] = static_cast<int>(s * stride + len);
}

// top[g·keep + m] = the m-th best id of head g's segment (which starts at g·N).
__global__ void h2o_first_kernel(const int32_t* sorted_ids, int64_t num_tokens, int64_t keep, int num_kv_heads,
                                 int32_t* top) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= keep * num_kv_heads) return;
  top[idx] = sorted_ids[(idx / keep) * num_tokens + idx % keep];
}

namespace {
size_t align_up(size_t x) { return (x + 255) / 256 * 256; }
unsigned blocks(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

bool shape_ok(const AttentionParams& p) {
  return p.num_kv_heads > 0 && p.num_heads > 0 && p.num_heads % p.num_kv_heads == 0 && p.head_dim > 0 &&
         p.head_dim <= 256;
}

struct SelectLayout {
  size_t ids, keys_out, ids_out, top, offsets, cub, total;
};

SelectLayout select_layout(int64_t num_tokens, const AttentionParams& p, int64_t keep) {
  const int nkv = p.num_kv_heads;
  const int64_t items = num_tokens * nkv;
  SelectLayout l{};
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  l.ids = take(sizeof(int32_t) * items);
  l.keys_out = take(sizeof(float) * items);
  l.ids_out = take(sizeof(int32_t) * items);
  l.top = take(sizeof(int32_t) * keep * nkv);
  l.offsets = take(sizeof(int) * 2 * nkv);
  size_t a = 0, b = 0;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, a, static_cast<const float*>(nullptr),
                                                     static_cast<float*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<int>(items), nkv,
                                                     static_cast<const int*>(nullptr), static_cast<const int*>(nullptr));
  cub::DeviceRadixSort::SortKeys(nullptr, b, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                 static_cast<int>(keep * nkv));
  l.cub = take(std::max(a, b));
  l.total = off;
  return l;
}

bool select_valid(int64_t num_tokens, const AttentionParams& p, int64_t budget, int64_t recent) {
  return shape_ok(p) && budget >= 1 && recent >= 0 && recent <= budget && num_tokens > budget &&
         num_tokens * p.num_kv_heads < (int64_t{1} << 31);  // CUB's int item counts
}
}  // namespace

size_t h2o_accumulate_cuda_workspace_bytes(int64_t num_queries, const AttentionParams& p) {
  if (!shape_ok(p) || num_queries < 1) return 0;
  return sizeof(float2) * static_cast<size_t>(num_queries) * p.num_heads;
}

cudaError_t h2o_accumulate_cuda(const float* q, int64_t num_queries, int64_t first_position, const PagedKvCuda& kv,
                                const AttentionParams& p, float* acc, int64_t acc_stride, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream) {
  if (!shape_ok(p) || num_queries < 1 || first_position < 0 || acc_stride < first_position + num_queries ||
      workspace_bytes < h2o_accumulate_cuda_workspace_bytes(num_queries, p))
    return cudaErrorInvalidValue;
  const int hd = p.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));  // as the CPU computes it
  auto* stats = static_cast<float2*>(workspace);
  const int64_t rows = num_queries * p.num_heads;
  h2o_row_stats_kernel<<<static_cast<unsigned>((rows + k_stats_warps - 1) / k_stats_warps), k_stats_warps * 32, 0,
                         stream>>>(q, num_queries, first_position, kv, p.num_heads, p.num_kv_heads, hd, scale, stats);
  const size_t smem = selection::tile_smem_bytes(hd);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(h2o_columns_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const int64_t end = first_position + num_queries;
  h2o_columns_kernel<<<dim3(static_cast<unsigned>((end + k_tile - 1) / k_tile), p.num_heads), k_tile, smem, stream>>>(
      q, num_queries, first_position, kv, p.num_heads, p.num_kv_heads, hd, scale, stats, acc, acc_stride);
  return cudaGetLastError();
}

size_t h2o_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, int64_t budget, int64_t recent) {
  if (!select_valid(num_tokens, p, budget, recent)) return 0;
  return select_layout(num_tokens, p, budget - recent).total;
}

cudaError_t h2o_select_cuda(const float* acc, int64_t acc_stride, int64_t num_tokens, const AttentionParams& p,
                            int64_t budget, int64_t recent, bool max_aggregation, float* scores, int32_t* kept_ids,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!select_valid(num_tokens, p, budget, recent) || acc_stride < num_tokens) return cudaErrorInvalidValue;
  const int64_t keep = budget - recent;
  const SelectLayout l = select_layout(num_tokens, p, keep);
  if (workspace_bytes < l.total) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  auto* ids = reinterpret_cast<int32_t*>(ws + l.ids);
  auto* keys_out = reinterpret_cast<float*>(ws + l.keys_out);
  auto* ids_out = reinterpret_cast<int32_t*>(ws + l.ids_out);
  auto* top = reinterpret_cast<int32_t*>(ws + l.top);
  auto* offsets = reinterpret_cast<int*>(ws + l.offsets);
  void* cub_tmp = ws + l.cub;
  size_t cub_size = workspace_bytes - l.cub;
  const int nkv = p.num_kv_heads;
  const int64_t items = num_tokens * nkv;
  h2o_group_kernel<<<blocks(items), 256, 0, stream>>>(acc, acc_stride, num_tokens, p.num_heads, nkv, max_aggregation,
                                                     scores, ids);
  if (keep == 0) return cudaGetLastError();  // only the recent positions
  h2o_offsets_kernel<<<(nkv + 127) / 128, 128, 0, stream>>>(nkv, num_tokens, num_tokens - recent, offsets,
                                                            offsets + nkv);
  cudaError_t err = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      cub_tmp, cub_size, scores, keys_out, ids, ids_out, static_cast<int>(items), nkv, offsets, offsets + nkv, 0,
      static_cast<int>(sizeof(float) * 8), stream);
  if (err != cudaSuccess) return err;
  h2o_first_kernel<<<blocks(keep * nkv), 256, 0, stream>>>(ids_out, num_tokens, keep, nkv, top);
  err = cub::DeviceRadixSort::SortKeys(cub_tmp, cub_size, top, kept_ids, static_cast<int>(keep * nkv), 0,
                                       static_cast<int>(sizeof(int32_t) * 8), stream);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace snap::kernels
