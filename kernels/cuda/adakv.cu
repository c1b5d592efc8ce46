// AdaKV selection on the device: the twin of adakv_select (worker/kv/selection.cpp) for one
// layer. Scores are SnapKV's (snapkv_scores_cuda: window queries × all keys, softmax, sum
// over the window, mean/max over the GQA group, pooling, NaN -> −inf); then
//   1. every head's prefix positions sorted by (score desc, position asc): one CUB
//      segmented radix sort (stable, values = g·prefix + j in ascending order);
//   2. the safeguard: the first floor(alpha·(B−W)) of each head's sorted list;
//   3. the rest of the layer's num_kv_heads·(B−W) slots: the remaining entries of every head,
//      concatenated head by head in their sorted order, through one stable global radix sort
//      by score desc — equal scores then keep (head asc, position asc), the CPU's tie rule;
//   4. the chosen ids (safeguards + the best `rest`) sorted ascending: per head in order.
// Heads differ in size; the window is kept by every head and left to the caller.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/kernels_cuda.h"

namespace snap::kernels {

__global__ void adakv_iota_kernel(int32_t* ids, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) ids[i] = static_cast<int32_t>(i);
}

__global__ void adakv_offsets_kernel(int num_segments, int64_t stride, int* begin, int* end) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= num_segments) return;
  begin[s] = static_cast<int>(s * stride);
  end[s] = static_cast<int>((s + 1) * stride);
}

// chosen[g·safeguard + m] = the m-th best id of head g (m < safeguard).
__global__ void adakv_safeguard_kernel(const int32_t* sorted_ids, int64_t prefix, int64_t safeguard, int num_kv_heads,
                                       int32_t* chosen) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= safeguard * num_kv_heads) return;
  const int64_t g = idx / safeguard, m = idx % safeguard;
  chosen[idx] = sorted_ids[g * prefix + m];
}

// The candidates after the safeguard, head by head in each head's sorted order.
__global__ void adakv_candidates_kernel(const float* sorted_scores, const int32_t* sorted_ids, int64_t prefix,
                                        int64_t safeguard, int num_kv_heads, float* cand_scores, int32_t* cand_ids) {
  const int64_t per_head = prefix - safeguard;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= per_head * num_kv_heads) return;
  const int64_t g = c / per_head, src = g * prefix + safeguard + c % per_head;
  cand_scores[c] = sorted_scores[src];
  cand_ids[c] = sorted_ids[src];
}

__global__ void adakv_copy_kernel(const int32_t* src, int64_t n, int32_t* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

namespace {
size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

struct Layout {
  size_t scores_ws, ids, keys_out, ids_out, cand_keys, cand_ids, cand_keys_out, cand_ids_out, chosen, offsets, cub,
      total;
  int64_t prefix, share, safeguard, ncand, rest;
};

bool valid(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp, double alpha) {
  return alpha >= 0.0 && alpha <= 1.0 && sp.budget > sp.window && num_tokens > sp.budget &&
         snapkv_scores_cuda_workspace_bytes(num_tokens, p, sp) > 0;
}

Layout layout(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp, double alpha) {
  Layout l{};
  const int nkv = p.num_kv_heads;
  l.prefix = num_tokens - sp.window;
  l.share = sp.budget - sp.window;
  l.safeguard = static_cast<int64_t>(std::floor(alpha * static_cast<double>(l.share)));  // as the CPU
  l.ncand = nkv * (l.prefix - l.safeguard);
  l.rest = nkv * (l.share - l.safeguard);
  const int64_t items = l.prefix * nkv;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  l.scores_ws = take(snapkv_scores_cuda_workspace_bytes(num_tokens, p, sp));
  l.ids = take(sizeof(int32_t) * items);
  l.keys_out = take(sizeof(float) * items);
  l.ids_out = take(sizeof(int32_t) * items);
  l.cand_keys = take(sizeof(float) * l.ncand);
  l.cand_ids = take(sizeof(int32_t) * l.ncand);
  l.cand_keys_out = take(sizeof(float) * l.ncand);
  l.cand_ids_out = take(sizeof(int32_t) * l.ncand);
  l.chosen = take(sizeof(int32_t) * nkv * l.share);
  l.offsets = take(sizeof(int) * 2 * nkv);
  size_t a = 0, b = 0, c = 0;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, a, static_cast<const float*>(nullptr),
                                                     static_cast<float*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<int>(items), nkv,
                                                     static_cast<const int*>(nullptr), static_cast<const int*>(nullptr));
  cub::DeviceRadixSort::SortPairsDescending(nullptr, b, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
                                            static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                            static_cast<int>(l.ncand));
  cub::DeviceRadixSort::SortKeys(nullptr, c, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                 static_cast<int>(nkv * l.share));
  l.cub = take(std::max({a, b, c}));
  l.total = off;
  return l;
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }
}  // namespace

size_t adakv_select_cuda_workspace_bytes(int64_t num_tokens, const AttentionParams& p, const SnapKvCudaParams& sp) {
  if (!valid(num_tokens, p, sp, 0.0)) return 0;
  // The safeguard only moves entries between the two candidate stages: alpha 0 has the most.
  return layout(num_tokens, p, sp, 0.0).total;
}

cudaError_t adakv_select_cuda(const float* q_window, const PagedKvCuda& kv, int64_t num_tokens,
                              const AttentionParams& p, const SnapKvCudaParams& sp, double alpha, float* scores,
                              int32_t* kept_ids, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!valid(num_tokens, p, sp, alpha)) return cudaErrorInvalidValue;
  const Layout l = layout(num_tokens, p, sp, alpha);
  if (workspace_bytes < l.total) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  auto* ids = reinterpret_cast<int32_t*>(ws + l.ids);
  auto* keys_out = reinterpret_cast<float*>(ws + l.keys_out);
  auto* ids_out = reinterpret_cast<int32_t*>(ws + l.ids_out);
  auto* cand_keys = reinterpret_cast<float*>(ws + l.cand_keys);
  auto* cand_ids = reinterpret_cast<int32_t*>(ws + l.cand_ids);
  auto* cand_keys_out = reinterpret_cast<float*>(ws + l.cand_keys_out);
  auto* cand_ids_out = reinterpret_cast<int32_t*>(ws + l.cand_ids_out);
  auto* chosen = reinterpret_cast<int32_t*>(ws + l.chosen);
  auto* offsets = reinterpret_cast<int*>(ws + l.offsets);
  void* cub_tmp = ws + l.cub;
  size_t cub_size = workspace_bytes - l.cub;
  const int nkv = p.num_kv_heads;
  const int64_t items = l.prefix * nkv;

  cudaError_t err = snapkv_scores_cuda(q_window, kv, num_tokens, p, sp, scores, ws + l.scores_ws,
                                       l.ids - l.scores_ws, stream);
  if (err != cudaSuccess) return err;
  adakv_iota_kernel<<<blocks(items), 256, 0, stream>>>(ids, items);
  adakv_offsets_kernel<<<(nkv + 127) / 128, 128, 0, stream>>>(nkv, l.prefix, offsets, offsets + nkv);
  err = cub::DeviceSegmentedRadixSort::SortPairsDescending(cub_tmp, cub_size, scores, keys_out, ids, ids_out,
                                                           static_cast<int>(items), nkv, offsets, offsets + nkv, 0,
                                                           static_cast<int>(sizeof(float) * 8), stream);
  if (err != cudaSuccess) return err;
  if (l.safeguard > 0)
    adakv_safeguard_kernel<<<blocks(l.safeguard * nkv), 256, 0, stream>>>(ids_out, l.prefix, l.safeguard, nkv, chosen);
  if (l.rest > 0) {
    adakv_candidates_kernel<<<blocks(l.ncand), 256, 0, stream>>>(keys_out, ids_out, l.prefix, l.safeguard, nkv,
                                                                 cand_keys, cand_ids);
    err = cub::DeviceRadixSort::SortPairsDescending(cub_tmp, cub_size, cand_keys, cand_keys_out, cand_ids, cand_ids_out,
                                                    static_cast<int>(l.ncand), 0, static_cast<int>(sizeof(float) * 8),
                                                    stream);
    if (err != cudaSuccess) return err;
    adakv_copy_kernel<<<blocks(l.rest), 256, 0, stream>>>(cand_ids_out, l.rest, chosen + l.safeguard * nkv);
  }
  err = cub::DeviceRadixSort::SortKeys(cub_tmp, cub_size, chosen, kept_ids, static_cast<int>(nkv * l.share), 0,
                                       static_cast<int>(sizeof(int32_t) * 8), stream);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace snap::kernels
