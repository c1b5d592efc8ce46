// KV-cache selection (selection.h): SnapKV, AdaKV, H2O, StreamingLLM, PyramidKV budgets.
// Scores: per query head a [rows, N] block of q·kᵀ (own vectorized kernel), softmax rows,
// column sums. Parallel over query heads, one head per thread and no synchronization inside
// (see score_threads), so sums run in a fixed order whatever the thread count.
// Top-k uses a strict total order (score desc, position asc): deterministic under nth_element.
#include "worker/kv/selection.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>

namespace snap {

namespace {

// The load-time ifunc resolver of target_clones runs before ThreadSanitizer's runtime is up
// and crashes an instrumented binary; a TSan build keeps the default clone only.
#if defined(__SANITIZE_THREAD__)
#define SNAP_CLONES_V3_DEFAULT
#else
#define SNAP_CLONES_V3_DEFAULT __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif

constexpr int64_t k_h2o_tile = 64;      // H2O query rows per sgemm: [64, N] f32 = 5 MB at N=20K

// --- softmax pieces -----------------------------------------------------------------
// x[i] = e^(x[i] − shift), returns Σ x[i]. A polynomial exp the compiler vectorizes (glibc's
// expf is scalar: at N=8K, 9 heads, W=32 that is 2.3M calls ≈ 9 ms per layer; this ≈ 1 ms):
// e^v = 2^n · p(r), n = round(v·log2 e), r = v − n·ln 2 in two parts, p the degree-7 Taylor
// polynomial (|r| ≤ 0.35: relative error ~2 ulp). v ≤ 0 here (the row max is subtracted);
// it is clamped below at −87 by an unsigned compare of the bit patterns (negative floats
// order by their bits), because a float compare would block vectorization under the default
// -ftrapping-math. The avx2/fma clone is picked at load time by ifunc.
SNAP_CLONES_V3_DEFAULT
float exp_shifted_sum(float* x, int64_t n, float shift) {
  constexpr uint32_t k_minus_87_bits = 0xC2AE0000u;  // -87.0f
  constexpr float k_log2e = 1.44269504088896341f;
  constexpr float k_round = 12582912.0f;  // 1.5·2^23: (t + k_round) − k_round rounds t to an integer
  constexpr float k_ln2_hi = 0.693359375f;
  constexpr float k_ln2_lo = -2.12194440e-4f;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = std::bit_cast<uint32_t>(x[i] - shift);
    bits = bits > k_minus_87_bits ? k_minus_87_bits : bits;
    const float v = std::bit_cast<float>(bits);
    const float t = (v * k_log2e + k_round) - k_round;
    float r = v - t * k_ln2_hi;
    r = r - t * k_ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t e = (static_cast<int32_t>(t) + 127) << 23;
    const float y = p * std::bit_cast<float>(e);
    x[i] = y;
    sum += y;
  }
  return sum;
}

float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Row i of a [rows, ld] block sees columns [0, visible[i]): exponentiate that part in
// place (row max subtracted), zero the rest, and return 1/row-sum.
float softmax_row(float* row, int64_t ld, int64_t visible) {
  const float sum = exp_shifted_sum(row, visible, row_max(row, visible));
  std::fill(row + visible, row + ld, 0.0f);
  return 1.0f / sum;
}

// acc[j] += Σ_i block[i, j]·inv[i] for j in [j0, j1), rows summed in ascending order.
void accumulate_columns(const float* block, int64_t rows, int64_t ld, const float* inv, int64_t j0, int64_t j1,
                        float* acc) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = block + i * ld;
    const float w = inv[i];
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) acc[j] += row[j] * w;
  }
}

// One parallel region per call, over query heads. Measured on the 2 shared cores here: with a
// region (or barrier) per head or per query tile, H2O at N=20K took 6.5 s instead of 0.4 s,
// because each barrier waits for a thread the OS has descheduled; OpenBLAS's own spinning
// threads made it worse, hence the own q·kᵀ kernel below instead of cblas_sgemm.
constexpr int64_t k_key_tile = 64;

// out[i, j0 + jj] = scale · q_i · k_{j0+jj} for i < rows, jj < nk ≤ 64. kt: [head_dim, 64], the
// key tile transposed so that the inner loop runs over 64 contiguous keys: four 16-float
// accumulators per query, one broadcast of q_i[t] and four loads per t, no horizontal sums.
// The accumulators are GCC vector values, not a float[64]: under AddressSanitizer a local array
// lives in memory with redzones and every += was a checked load and store (this loop was a
// quarter of test_engine's time under ASan, 1% in Release); the loads of kt stay checked.
using F32x16 = float __attribute__((vector_size(64)));
static_assert(k_key_tile == 64, "qk_tile holds 64 keys in four F32x16");

SNAP_CLONES_V3_DEFAULT
void qk_tile(const float* q, int64_t q_stride, int64_t rows, const float* kt, int head_dim, float scale, float* out,
             int64_t ld, int64_t nk) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* qi = q + i * q_stride;
    F32x16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int t = 0; t < head_dim; ++t) {
      const float qv = qi[t];
      const float* kr = kt + t * k_key_tile;
      F32x16 k0, k1, k2, k3;
      std::memcpy(&k0, kr, sizeof k0);
      std::memcpy(&k1, kr + 16, sizeof k1);
      std::memcpy(&k2, kr + 32, sizeof k2);
      std::memcpy(&k3, kr + 48, sizeof k3);
      a0 += qv * k0;
      a1 += qv * k1;
      a2 += qv * k2;
      a3 += qv * k3;
    }
    float acc[k_key_tile];
    std::memcpy(acc, &a0, sizeof a0);
    std::memcpy(acc + 16, &a1, sizeof a1);
    std::memcpy(acc + 32, &a2, sizeof a2);
    std::memcpy(acc + 48, &a3, sizeof a3);
    float* o = out + i * ld;
    for (int64_t jj = 0; jj < nk; ++jj) o[jj] = acc[jj] * scale;
  }
}

// block[rows, cols] (row stride cols) = (q rows · K[0..cols)ᵀ)/√head_dim for query head h;
// q_rows points at the first row's head-h query, rows num_heads·head_dim apart. kt: scratch
// of head_dim·64 floats.
void score_block(const LayerQk& qk, int h, const float* q_rows, int64_t rows, int64_t cols, float* block, float* kt) {
  const int group = qk.num_heads / qk.num_kv_heads;
  const float* k = qk.k + static_cast<int64_t>(h / group) * qk.kv_head_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk.head_dim));
  const int d = qk.head_dim;
  for (int64_t j0 = 0; j0 < cols; j0 += k_key_tile) {
    const int64_t nk = std::min(k_key_tile, cols - j0);
    const float* kb = k + j0 * d;
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int t = 0; t < d; ++t) kt[t * k_key_tile + jj] = kb[jj * d + t];
    if (nk < k_key_tile)  // last, partial tile: the unused lanes compute harmless zeros
      for (int t = 0; t < d; ++t) std::fill(kt + t * k_key_tile + nk, kt + (t + 1) * k_key_tile, 0.0f);
    qk_tile(q_rows, static_cast<int64_t>(qk.num_heads) * d, rows, kt, d, scale, block + j0, cols, nk);
  }
}

// Threads for the per-head loops: heads are independent work items.
int score_threads(int num_heads) { return std::max(1, std::min(num_heads, omp_get_max_threads())); }

// --- validation -----------------------------------------------------------------------
Status validate_qk(const LayerQk& qk, const char* who) {
  const std::string w = std::string(who) + ": ";
  if (qk.num_heads < 1 || qk.num_kv_heads < 1 || qk.num_heads % qk.num_kv_heads != 0)
    return invalid_argument(w + "num_heads " + std::to_string(qk.num_heads) + " is not a positive multiple of num_kv_heads " +
                            std::to_string(qk.num_kv_heads));
  if (qk.head_dim < 1) return invalid_argument(w + "head_dim " + std::to_string(qk.head_dim) + " must be positive");
  if (qk.num_tokens < 0 || qk.num_tokens > std::numeric_limits<int32_t>::max())
    return invalid_argument(w + "num_tokens " + std::to_string(qk.num_tokens) + " out of range");
  if (qk.num_queries < 0 || qk.num_queries > qk.num_tokens)
    return invalid_argument(w + "num_queries " + std::to_string(qk.num_queries) + " not in [0, num_tokens " +
                            std::to_string(qk.num_tokens) + "]");
  if (qk.num_kv_heads > 1 && qk.kv_head_stride < qk.num_tokens * qk.head_dim)
    return invalid_argument(w + "kv_head_stride " + std::to_string(qk.kv_head_stride) + " is below num_tokens·head_dim " +
                            std::to_string(qk.num_tokens * qk.head_dim));
  if ((qk.num_tokens > 0 && qk.k == nullptr) || (qk.num_queries > 0 && qk.q == nullptr))
    return invalid_argument(w + "null q or k pointer");
  return Status::ok_status();
}

Status validate_aggregation(GqaAggregation a, const char* who) {
  if (a != GqaAggregation::mean && a != GqaAggregation::max)
    return invalid_argument(std::string(who) + ": unknown GQA aggregation " + std::to_string(static_cast<int>(a)));
  return Status::ok_status();
}

// --- selection helpers -----------------------------------------------------------------
// NaN (broken inputs) ranks below every finite score, keeping the order a strict total one.
void sanitize(std::vector<float>& s) {
  for (float& x : s)
    if (std::isnan(x)) x = -std::numeric_limits<float>::infinity();
}

// The m best of s[0..n) by (score desc, position asc), returned in ascending position order.
std::vector<int32_t> top_positions(const float* s, int64_t n, int64_t m) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  m = std::clamp<int64_t>(m, 0, n);
  auto better = [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
  std::nth_element(idx.begin(), idx.begin() + m, idx.end(), better);
  idx.resize(static_cast<size_t>(m));
  std::sort(idx.begin(), idx.end());
  return idx;
}

void append_range(std::vector<int32_t>& v, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) v.push_back(static_cast<int32_t>(j));
}

LayerSelection keep_everything(int64_t num_tokens, int num_kv_heads) {
  LayerSelection sel;
  sel.kept.assign(static_cast<size_t>(num_kv_heads), {});
  for (auto& k : sel.kept) append_range(k, 0, num_tokens);
  return sel;
}

// per_head: [num_heads][n] → [num_kv_heads][n] by mean or max over each group (heads in order).
std::vector<std::vector<float>> aggregate_groups(const std::vector<std::vector<float>>& per_head, int num_kv_heads,
                                                 int64_t n, GqaAggregation agg) {
  const int group = static_cast<int>(per_head.size()) / num_kv_heads;
  std::vector<std::vector<float>> out(static_cast<size_t>(num_kv_heads));
  for (int g = 0; g < num_kv_heads; ++g) {
    std::vector<float>& o = out[g];
    o.assign(per_head[g * group].begin(), per_head[g * group].begin() + n);
    for (int h = g * group + 1; h < (g + 1) * group; ++h) {
      const float* s = per_head[h].data();
      if (agg == GqaAggregation::max) {
        for (int64_t j = 0; j < n; ++j) o[j] = s[j] > o[j] ? s[j] : o[j];
      } else {
        for (int64_t j = 0; j < n; ++j) o[j] += s[j];
      }
    }
    if (agg == GqaAggregation::mean && group > 1) {
      const float inv = 1.0f / static_cast<float>(group);
      for (float& x : o) x *= inv;
    }
  }
  return out;
}

// "Same"-size 1-D pooling, stride 1, padding kernel/2. Max: padding never wins (PyTorch
// max_pool1d pads with −inf). Avg: PyTorch avg_pool1d defaults, count_include_pad=True,
// i.e. zero padding and always divided by kernel — what the official SnapKV code gets from
// F.avg_pool1d(x, kernel_size=k, padding=k//2, stride=1), so edge positions score lower.
std::vector<float> pool1d(const std::vector<float>& s, int kernel, KvPooling pooling) {
  const int64_t n = static_cast<int64_t>(s.size()), half = kernel / 2;
  std::vector<float> out(s.size());
  for (int64_t j = 0; j < n; ++j) {
    const int64_t lo = std::max<int64_t>(0, j - half), hi = std::min(n, j + half + 1);
    if (pooling == KvPooling::max) {
      float m = s[lo];
      for (int64_t i = lo + 1; i < hi; ++i) m = s[i] > m ? s[i] : m;
      out[j] = m;
    } else {
      float sum = 0.0f;
      for (int64_t i = lo; i < hi; ++i) sum += s[i];
      out[j] = sum / static_cast<float>(kernel);
    }
  }
  return out;
}

}  // namespace

int64_t LayerSelection::total_kept() const {
  int64_t t = 0;
  for (const auto& k : kept) t += static_cast<int64_t>(k.size());
  return t;
}

// --- SnapKV ---------------------------------------------------------------------------
Status snapkv_validate(const SnapKvParams& p) {
  if (p.window < 1) return invalid_argument("snapkv: window " + std::to_string(p.window) + " must be at least 1");
  if (p.budget <= p.window)
    return invalid_argument("snapkv: budget " + std::to_string(p.budget) + " must be larger than window " +
                            std::to_string(p.window));
  if (p.kernel < 1 || p.kernel % 2 == 0)
    return invalid_argument("snapkv: pooling kernel " + std::to_string(p.kernel) + " must be odd and at least 1");
  if (p.pooling != KvPooling::max && p.pooling != KvPooling::avg)
    return invalid_argument("snapkv: unknown pooling " + std::to_string(static_cast<int>(p.pooling)));
  return validate_aggregation(p.aggregation, "snapkv");
}

Result<std::vector<std::vector<float>>> snapkv_scores(const LayerQk& qk, const SnapKvParams& p) {
  SNAP_RETURN_IF_ERROR(snapkv_validate(p));
  SNAP_RETURN_IF_ERROR(validate_qk(qk, "snapkv"));
  const int64_t n = qk.num_tokens, w = p.window, prefix = n - w;
  if (prefix < 1)
    return invalid_argument("snapkv: num_tokens " + std::to_string(n) + " must exceed window " + std::to_string(w));
  if (qk.num_queries < w)
    return invalid_argument("snapkv: " + std::to_string(qk.num_queries) + " queries given, window needs " +
                            std::to_string(w));
  // Each thread takes whole heads: its [W, N] block (1 MB at N=8K), softmax rows, column
  // sums. Window row i sits at position N−W+i and sees keys 0..N−W+i; only the prefix
  // columns j < N−W are summed.
  const int threads = score_threads(qk.num_heads);
  std::vector<std::vector<float>> per_head(static_cast<size_t>(qk.num_heads));
  const float* q_window = qk.q + (qk.num_queries - w) * qk.num_heads * qk.head_dim;
#pragma omp parallel num_threads(threads) if (threads > 1 && w * n >= 16384)
  {
    std::vector<float> block(static_cast<size_t>(w * n)), inv(static_cast<size_t>(w));
    std::vector<float> kt(static_cast<size_t>(qk.head_dim * k_key_tile));
#pragma omp for schedule(dynamic, 1)
    for (int h = 0; h < qk.num_heads; ++h) {
      score_block(qk, h, q_window + static_cast<int64_t>(h) * qk.head_dim, w, n, block.data(), kt.data());
      for (int64_t i = 0; i < w; ++i) inv[i] = softmax_row(block.data() + i * n, n, prefix + i + 1);
      per_head[h].assign(static_cast<size_t>(prefix), 0.0f);
      accumulate_columns(block.data(), w, n, inv.data(), 0, prefix, per_head[h].data());
    }
  }
  auto grouped = aggregate_groups(per_head, qk.num_kv_heads, prefix, p.aggregation);
  for (auto& s : grouped) {
    s = pool1d(s, p.kernel, p.pooling);
    sanitize(s);
  }
  return grouped;
}

Result<LayerSelection> snapkv_select(const LayerQk& qk, const SnapKvParams& p) {
  SNAP_RETURN_IF_ERROR(snapkv_validate(p));
  SNAP_RETURN_IF_ERROR(validate_qk(qk, "snapkv"));
  if (qk.num_tokens <= p.budget) return keep_everything(qk.num_tokens, qk.num_kv_heads);
  SNAP_ASSIGN_OR_RETURN(auto scores, snapkv_scores(qk, p));
  const int64_t prefix = qk.num_tokens - p.window;
  LayerSelection sel;
  for (const auto& s : scores) {
    sel.kept.push_back(top_positions(s.data(), prefix, p.budget - p.window));
    append_range(sel.kept.back(), prefix, qk.num_tokens);
  }
  if (p.keep_scores) sel.scores = std::move(scores);
  return sel;
}

// --- AdaKV ----------------------------------------------------------------------------
Result<LayerSelection> adakv_select(const LayerQk& qk, const AdaKvParams& p) {
  SNAP_RETURN_IF_ERROR(snapkv_validate(p.snap));
  SNAP_RETURN_IF_ERROR(validate_qk(qk, "adakv"));
  if (!(p.alpha >= 0.0 && p.alpha <= 1.0))
    return invalid_argument("adakv: alpha " + std::to_string(p.alpha) + " must be in [0, 1]");
  if (qk.num_tokens <= p.snap.budget) return keep_everything(qk.num_tokens, qk.num_kv_heads);
  SNAP_ASSIGN_OR_RETURN(auto scores, snapkv_scores(qk, p.snap));
  const int num_kv = qk.num_kv_heads;
  const int64_t prefix = qk.num_tokens - p.snap.window, share = p.snap.budget - p.snap.window;
  const int64_t safeguard = static_cast<int64_t>(std::floor(p.alpha * static_cast<double>(share)));

  LayerSelection sel;
  sel.kept.resize(static_cast<size_t>(num_kv));
  std::vector<std::vector<char>> taken(static_cast<size_t>(num_kv), std::vector<char>(static_cast<size_t>(prefix), 0));
  for (int g = 0; g < num_kv; ++g) {
    sel.kept[g] = top_positions(scores[g].data(), prefix, safeguard);
    for (int32_t j : sel.kept[g]) taken[g][j] = 1;
  }
  // The rest of the layer's num_kv·share slots go to the best remaining (head, position).
  struct Candidate {
    float score;
    int32_t head, pos;
  };
  std::vector<Candidate> cand;
  cand.reserve(static_cast<size_t>(num_kv * (prefix - safeguard)));
  for (int g = 0; g < num_kv; ++g)
    for (int64_t j = 0; j < prefix; ++j)
      if (!taken[g][j]) cand.push_back({scores[g][j], g, static_cast<int32_t>(j)});
  const int64_t rest = num_kv * (share - safeguard);
  auto better = [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.head != b.head ? a.head < b.head : a.pos < b.pos;
  };
  std::nth_element(cand.begin(), cand.begin() + rest, cand.end(), better);
  for (int64_t c = 0; c < rest; ++c) sel.kept[cand[c].head].push_back(cand[c].pos);
  for (auto& k : sel.kept) {
    std::sort(k.begin(), k.end());
    append_range(k, prefix, qk.num_tokens);
  }
  if (p.snap.keep_scores) sel.scores = std::move(scores);
  return sel;
}

// --- StreamingLLM ---------------------------------------------------------------------
Result<LayerSelection> streaming_select(int64_t num_tokens, int num_kv_heads, const StreamingParams& p) {
  if (p.num_sink < 0) return invalid_argument("streaming: num_sink " + std::to_string(p.num_sink) + " is negative");
  if (p.budget <= p.num_sink)
    return invalid_argument("streaming: budget " + std::to_string(p.budget) + " must be larger than num_sink " +
                            std::to_string(p.num_sink));
  if (num_tokens < 0 || num_tokens > std::numeric_limits<int32_t>::max() || num_kv_heads < 1)
    return invalid_argument("streaming: bad shape num_tokens " + std::to_string(num_tokens) + ", num_kv_heads " +
                            std::to_string(num_kv_heads));
  if (num_tokens <= p.budget) return keep_everything(num_tokens, num_kv_heads);
  LayerSelection sel;
  sel.kept.assign(static_cast<size_t>(num_kv_heads), {});
  for (auto& k : sel.kept) {
    append_range(k, 0, p.num_sink);
    append_range(k, num_tokens - (p.budget - p.num_sink), num_tokens);
  }
  return sel;
}

// --- H2O ------------------------------------------------------------------------------
H2oAccumulator::H2oAccumulator(int num_heads, int num_kv_heads, int head_dim)
    : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim),
      scores_(static_cast<size_t>(std::max(num_heads, 0))) {}

Status H2oAccumulator::add(const LayerQk& qk, int64_t first_position) {
  SNAP_RETURN_IF_ERROR(validate_qk(qk, "h2o"));
  if (qk.num_heads != num_heads_ || qk.num_kv_heads != num_kv_heads_ || qk.head_dim != head_dim_)
    return invalid_argument("h2o: chunk shape (" + std::to_string(qk.num_heads) + ", " + std::to_string(qk.num_kv_heads) +
                            ", " + std::to_string(qk.head_dim) + ") differs from the accumulator's");
  if (first_position != num_tokens_)
    return invalid_argument("h2o: chunk starts at position " + std::to_string(first_position) + ", expected " +
                            std::to_string(num_tokens_));
  const int64_t end = first_position + qk.num_queries;
  if (qk.num_tokens < end)
    return invalid_argument("h2o: chunk queries reach position " + std::to_string(end - 1) + " but only " +
                            std::to_string(qk.num_tokens) + " keys are given");
  for (auto& s : scores_) s.resize(static_cast<size_t>(end), 0.0f);
  // Each thread takes whole heads and walks its query tiles of ≤ 64 rows; a tile's block is
  // [rows, keys 0 .. the tile's last position] (5 MB at N=20K).
  const int threads = score_threads(num_heads_);
  const int64_t tile_rows = std::min(k_h2o_tile, qk.num_queries);
#pragma omp parallel num_threads(threads) if (threads > 1 && qk.num_queries * end >= 65536)
  {
    std::vector<float> block(static_cast<size_t>(tile_rows * end)), inv(static_cast<size_t>(k_h2o_tile));
    std::vector<float> kt(static_cast<size_t>(head_dim_ * k_key_tile));
#pragma omp for schedule(dynamic, 1)
    for (int h = 0; h < num_heads_; ++h) {
      for (int64_t t0 = 0; t0 < qk.num_queries; t0 += k_h2o_tile) {
        const int64_t rows = std::min(k_h2o_tile, qk.num_queries - t0);
        const int64_t cols = first_position + t0 + rows;
        score_block(qk, h, qk.q + (t0 * num_heads_ + h) * head_dim_, rows, cols, block.data(), kt.data());
        for (int64_t i = 0; i < rows; ++i)
          inv[i] = softmax_row(block.data() + i * cols, cols, first_position + t0 + i + 1);
        accumulate_columns(block.data(), rows, cols, inv.data(), 0, cols, scores_[h].data());
      }
    }
  }
  num_tokens_ = end;
  return Status::ok_status();
}

Result<LayerSelection> H2oAccumulator::select(const H2oParams& p) const {
  SNAP_RETURN_IF_ERROR(validate_aggregation(p.aggregation, "h2o"));
  if (p.budget < 1) return invalid_argument("h2o: budget " + std::to_string(p.budget) + " must be positive");
  const int64_t recent = p.recent < 0 ? p.budget / 2 : p.recent;
  if (recent > p.budget)
    return invalid_argument("h2o: recent " + std::to_string(recent) + " exceeds budget " + std::to_string(p.budget));
  if (num_heads_ < 1 || num_kv_heads_ < 1 || num_heads_ % num_kv_heads_ != 0)
    return invalid_argument("h2o: num_heads " + std::to_string(num_heads_) + " is not a positive multiple of num_kv_heads " +
                            std::to_string(num_kv_heads_));
  const int64_t n = num_tokens_;
  if (n <= p.budget) return keep_everything(n, num_kv_heads_);
  auto grouped = aggregate_groups(scores_, num_kv_heads_, n, p.aggregation);
  LayerSelection sel;
  for (auto& s : grouped) {
    sanitize(s);
    sel.kept.push_back(top_positions(s.data(), n - recent, p.budget - recent));
    append_range(sel.kept.back(), n - recent, n);
  }
  if (p.keep_scores) sel.scores = std::move(grouped);
  return sel;
}

Result<LayerSelection> h2o_select(const LayerQk& qk, const H2oParams& p) {
  SNAP_RETURN_IF_ERROR(validate_qk(qk, "h2o"));
  if (qk.num_queries != qk.num_tokens)
    return invalid_argument("h2o: needs every prompt query: num_queries " + std::to_string(qk.num_queries) +
                            " != num_tokens " + std::to_string(qk.num_tokens));
  H2oAccumulator acc(qk.num_heads, qk.num_kv_heads, qk.head_dim);
  SNAP_RETURN_IF_ERROR(acc.add(qk, 0));
  return acc.select(p);
}

// --- PyramidKV ------------------------------------------------------------------------
Result<std::vector<int64_t>> pyramid_budgets(int num_layers, int64_t avg_budget, int window, int beta) {
  if (num_layers < 1) return invalid_argument("pyramidkv: num_layers " + std::to_string(num_layers) + " must be positive");
  if (window < 0) return invalid_argument("pyramidkv: window " + std::to_string(window) + " is negative");
  if (avg_budget <= window)
    return invalid_argument("pyramidkv: budget " + std::to_string(avg_budget) + " must be larger than window " +
                            std::to_string(window));
  if (beta < 1) return invalid_argument("pyramidkv: beta " + std::to_string(beta) + " must be at least 1");
  const int64_t share = avg_budget - window;
  if (num_layers == 1) return std::vector<int64_t>{avg_budget};
  const int64_t lo = std::max<int64_t>(1, share / beta), hi = 2 * share - lo, spread = hi - lo;
  const int64_t den = num_layers - 1;
  // p_l = ⌊r_l⌋ = hi − ⌈l·spread/den⌉, then +1 for the first R layers, R = L·share − Σ⌊r_l⌋ < L:
  // non-increasing, within 1 of r_l, and the total exactly L·share.
  std::vector<int64_t> budgets(static_cast<size_t>(num_layers));
  int64_t total = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    budgets[l] = hi - (l * spread + den - 1) / den;
    total += budgets[l];
  }
  const int64_t extra = num_layers * share - total;
  CHECK(extra >= 0 && extra < num_layers) << "pyramidkv: rounding remainder " << extra;
  for (int64_t l = 0; l < num_layers; ++l) budgets[l] += window + (l < extra ? 1 : 0);
  return budgets;
}

}  // namespace snap
