// The KV policies that select by attention, on the device against worker/kv/selection.cpp on
// the same keys (bf16, read back as f32 for the CPU) and the same queries, over one table of
// shapes (GQA groups 1..7, head_dim 64..256, awkward lengths and chunk sizes):
//   adakv_select_cuda vs adakv_select (alpha 0, 0.2, 0.5, 1; max/avg pooling, mean/max groups):
//     pooled scores within 1e-5 of each head's max; kept positions equal, except positions
//     whose CPU score lies within 1e-5 of a cut-off (the head's safeguard cut or the layer's
//     global cut): a floating-point near-tie;
//   h2o_accumulate_cuda chunk by chunk + h2o_select_cuda vs H2oAccumulator fed the same
//     chunks: grouped scores within 1e-5 of each head's max; kept positions as above (cut-off
//     = the head's (B − recent)-th score);
//   exact ties (every key the same vector, so every score in a head is equal): the kept
//     positions must equal the CPU's with no exception — lower position wins, and AdaKV's
//     global stage gives the lower KV head the slot first.
// Scores differ from the CPU's only through exp and the softmax sum's order (~1e-7 relative),
// hence 1e-5. Without a usable GPU the binary prints why and exits 77 (ctest: skipped).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/cuda/kernels_cuda.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"
#include "worker/kv/selection.h"

namespace snap::kernels {
namespace {

using namespace cuda_test;  // NOLINT: the shared test pieces (cuda_test_util.h)

constexpr double k_score_tol = 1e-5;

// One layer: a paged cache of n keys per KV head on the device, the same keys contiguous
// per head for the CPU ([num_kv_heads, n, head_dim] f32 of the bf16 values).
struct Layer {
  PagedFixture fixture;
  DevicePaged device;
  std::vector<float> keys;
  Layer(int num_heads, int num_kv_heads, int head_dim, int64_t n, bool same_keys, uint32_t seed)
      : fixture(make_fixture(num_heads, num_kv_heads, head_dim, n, same_keys, seed)), device(fixture, head_dim) {
    keys.resize(static_cast<size_t>(num_kv_heads * n * head_dim));
    for (int g = 0; g < num_kv_heads; ++g)
      for (int64_t j = 0; j < n; ++j)
        for (int d = 0; d < head_dim; ++d)
          keys[(g * n + j) * head_dim + d] =
              fixture.kf[(fixture.tables[g][j / k_block] * k_block + j % k_block) * head_dim + d];
  }
  static PagedFixture make_fixture(int num_heads, int num_kv_heads, int head_dim, int64_t n, bool same_keys,
                                   uint32_t seed) {
    const AttnShape a{"", num_heads, num_kv_heads, head_dim, std::vector<int64_t>(static_cast<size_t>(num_kv_heads), n),
                      1, true, false, 0};
    PagedFixture f(a, seed);
    if (same_keys) {  // every key of every head the same vector: all scores of a head tie
      const int64_t rows = static_cast<int64_t>(f.kf.size()) / head_dim;
      for (int64_t r = 1; r < rows; ++r)
        for (int d = 0; d < head_dim; ++d) f.k[r * head_dim + d] = f.k[d];
      f.kf = from_bf16(f.k);
    }
    return f;
  }
  LayerQk qk(const float* q, int64_t num_queries, int num_heads, int num_kv_heads, int head_dim, int64_t n) const {
    LayerQk r;
    r.q = q;
    r.num_queries = num_queries;
    r.k = keys.data();
    r.kv_head_stride = n * head_dim;
    r.num_tokens = n;
    r.num_heads = num_heads;
    r.num_kv_heads = num_kv_heads;
    r.head_dim = head_dim;
    return r;
  }
};

// Per KV head: |got − want| <= tol · max|want|; got is [heads][stride], the first len compared.
AssertionResult scores_close(const std::vector<float>& got, int64_t stride, const std::vector<std::vector<float>>& want,
                             double tol) {
  for (size_t g = 0; g < want.size(); ++g) {
    double norm = 0.0;
    for (float x : want[g])
      if (std::isfinite(x)) norm = std::max(norm, std::fabs(static_cast<double>(x)));
    for (size_t j = 0; j < want[g].size(); ++j) {
      const float a = got[g * stride + j], b = want[g][j];
      if (std::isnan(a) || !(std::fabs(static_cast<double>(a) - b) <= tol * norm))
        return AssertionFailure() << "KV head " << g << " position " << j << ": got " << a << " want " << b
                                  << " (head max " << norm << ", tol " << tol << ")";
    }
  }
  return AssertionSuccess();
}

// ids (g·stride + j, ascending) + the tail [tail, n) of every head, as per-head lists.
std::vector<std::vector<int32_t>> lists_of(const std::vector<int32_t>& ids, int num_kv_heads, int64_t stride,
                                           int64_t tail, int64_t n) {
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(num_kv_heads));
  for (int32_t id : ids)
    if (id >= 0 && id / stride < num_kv_heads) out[id / stride].push_back(static_cast<int32_t>(id % stride));
  for (auto& h : out)
    for (int64_t j = tail; j < n; ++j) h.push_back(static_cast<int32_t>(j));
  return out;
}

// got vs want per head: equal, or differing only at positions j < tail whose CPU score is
// within tol·(head max) of one of `cuts(g)` (exact: no difference allowed at all).
AssertionResult selections_match(const std::vector<std::vector<int32_t>>& got,
                                 const std::vector<std::vector<int32_t>>& want,
                                 const std::vector<std::vector<float>>& scores, int64_t tail,
                                 const std::function<std::vector<double>(int)>& cuts, bool exact, int64_t total) {
  int64_t got_total = 0;
  for (size_t g = 0; g < want.size(); ++g) {
    got_total += static_cast<int64_t>(got[g].size());
    if (!std::is_sorted(got[g].begin(), got[g].end()) ||
        std::adjacent_find(got[g].begin(), got[g].end()) != got[g].end())
      return AssertionFailure() << "KV head " << g << ": kept positions not strictly ascending";
    if (got[g] == want[g]) continue;
    if (exact)
      return AssertionFailure() << "KV head " << g << ": kept " << got[g].size() << " positions, CPU " << want[g].size()
                                << "; they differ, with exact ties (lower position / lower head must win)";
    double norm = 0.0;
    for (float x : scores[g])
      if (std::isfinite(x)) norm = std::max(norm, std::fabs(static_cast<double>(x)));
    std::vector<int32_t> diff;
    std::set_symmetric_difference(got[g].begin(), got[g].end(), want[g].begin(), want[g].end(),
                                  std::back_inserter(diff));
    const std::vector<double> c = cuts(static_cast<int>(g));
    for (int32_t j : diff) {
      bool near = false;
      for (double cut : c) near = near || (j < tail && std::fabs(scores[g][j] - cut) <= k_score_tol * norm);
      if (!near)
        return AssertionFailure() << "KV head " << g << ": position " << j << " (score "
                                  << (j < tail ? scores[g][j] : 0.0f) << ") differs from the CPU's selection and is no near-tie";
    }
  }
  if (got_total != total) return AssertionFailure() << "kept " << got_total << " entries in all, want " << total;
  return AssertionSuccess();
}

// The k-th largest of v (1-based), or -inf when k is 0.
double kth_largest(std::vector<float> v, int64_t k) {
  if (k <= 0 || v.empty()) return -INFINITY;
  std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<float>());
  return v[k - 1];
}

// --- the table ------------------------------------------------------------------------------

struct PolicyCase {
  std::string name;
  std::function<AssertionResult()> run;
};

struct AdaShape {
  const char* name;
  int num_heads, num_kv_heads, head_dim;
  int64_t num_tokens, budget;
  int window, kernel;
  bool max_pooling, max_aggregation;
  double alpha;
  bool same_keys;
};

AssertionResult run_adakv(const AdaShape& s) {
  const int64_t n = s.num_tokens, prefix = n - s.window, share = s.budget - s.window;
  const int nkv = s.num_kv_heads;
  const Layer layer(s.num_heads, nkv, s.head_dim, n, s.same_keys, 61);
  const auto qw = test::random_floats(s.window * s.num_heads * s.head_dim, 63, -2.0f, 2.0f);
  const LayerQk qk = layer.qk(qw.data(), s.window, s.num_heads, nkv, s.head_dim, n);
  AdaKvParams cp;
  cp.snap.budget = s.budget;
  cp.snap.window = s.window;
  cp.snap.kernel = s.kernel;
  cp.snap.pooling = s.max_pooling ? KvPooling::max : KvPooling::avg;
  cp.snap.aggregation = s.max_aggregation ? GqaAggregation::max : GqaAggregation::mean;
  cp.alpha = s.alpha;
  auto want_scores = snapkv_scores(qk, cp.snap);
  auto want = adakv_select(qk, cp);
  if (!want_scores.ok() || !want.ok()) return AssertionFailure() << "CPU adakv failed";

  const AttentionParams p{s.num_heads, nkv, s.head_dim, 0.0f, 0};
  const SnapKvCudaParams sp{s.budget, s.window, s.kernel, s.max_pooling, s.max_aggregation};
  const size_t ws = adakv_select_cuda_workspace_bytes(n, p, sp);
  if (ws == 0) return AssertionFailure() << "workspace size 0 for a valid shape";
  DeviceBuffer<float> dq(qw), dscores(static_cast<size_t>(prefix * nkv));
  DeviceBuffer<int32_t> dids(static_cast<size_t>(share * nkv));
  DeviceBuffer<char> dws(ws);
  CUDA_TRY(adakv_select_cuda(dq.ptr, layer.device.view, n, p, sp, s.alpha, dscores.ptr, dids.ptr, dws.ptr, ws, nullptr));
  if (auto r = sync_ok(); !r) return r;
  if (auto c = scores_close(dscores.to_host(), prefix, *want_scores, k_score_tol); !c) return c;
  const auto ids = dids.to_host();
  if (!std::is_sorted(ids.begin(), ids.end())) return AssertionFailure() << "kept ids not ascending";
  const auto got = lists_of(ids, nkv, prefix, prefix, n);
  // Cut-offs: the head's safeguard cut, and the layer's global cut over what the safeguards left.
  const int64_t safeguard = static_cast<int64_t>(std::floor(s.alpha * static_cast<double>(share)));
  std::vector<float> rest_scores;
  std::vector<double> head_cut(static_cast<size_t>(nkv));
  for (int g = 0; g < nkv; ++g) {
    const std::vector<float>& sc = (*want_scores)[g];
    head_cut[g] = kth_largest(sc, safeguard);
    std::vector<int32_t> order(sc.size());
    for (size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int32_t>(j);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sc[a] > sc[b]; });
    for (size_t m = static_cast<size_t>(safeguard); m < order.size(); ++m) rest_scores.push_back(sc[order[m]]);
  }
  const double global_cut = kth_largest(rest_scores, nkv * (share - safeguard));
  return selections_match(
      got, want->kept, *want_scores, prefix, [&](int g) { return std::vector<double>{head_cut[g], global_cut}; },
      s.same_keys, nkv * s.budget);
}

struct H2oShape {
  const char* name;
  int num_heads, num_kv_heads, head_dim;
  int64_t num_tokens, budget;
  int64_t chunk;  // prefill chunk: the accumulation runs chunk by chunk
  bool max_aggregation;
  bool same_keys;
};

AssertionResult run_h2o(const H2oShape& s) {
  const int64_t n = s.num_tokens, recent = s.budget / 2, keep = s.budget - recent;
  const int nkv = s.num_kv_heads;
  const Layer layer(s.num_heads, nkv, s.head_dim, n, s.same_keys, 71);
  const int64_t row = static_cast<int64_t>(s.num_heads) * s.head_dim;
  const auto q = test::random_floats(n * row, 73, -2.0f, 2.0f);
  // CPU: the accumulator fed chunk by chunk; each chunk sees the keys up to its last position.
  H2oAccumulator acc(s.num_heads, nkv, s.head_dim);
  const AttentionParams p{s.num_heads, nkv, s.head_dim, 0.0f, 0};
  DeviceBuffer<float> dq(q), dacc(static_cast<size_t>(s.num_heads * n));
  DeviceBuffer<char> dstats(h2o_accumulate_cuda_workspace_bytes(s.chunk, p));
  for (int64_t first = 0; first < n; first += s.chunk) {
    const int64_t m = std::min(s.chunk, n - first);
    if (!acc.add(layer.qk(q.data() + first * row, m, s.num_heads, nkv, s.head_dim, n), first).ok())
      return AssertionFailure() << "CPU H2oAccumulator::add failed at " << first;
    CUDA_TRY(h2o_accumulate_cuda(dq.ptr + first * row, m, first, layer.device.view, p, dacc.ptr, n, dstats.ptr,
                                 dstats.n, nullptr));
  }
  H2oParams hp;
  hp.budget = s.budget;
  hp.aggregation = s.max_aggregation ? GqaAggregation::max : GqaAggregation::mean;
  hp.keep_scores = true;
  auto want = acc.select(hp);
  if (!want.ok()) return AssertionFailure() << "CPU h2o select failed: " << want.status().to_string();
  const size_t ws = h2o_select_cuda_workspace_bytes(n, p, s.budget, recent);
  if (ws == 0) return AssertionFailure() << "workspace size 0 for a valid shape";
  DeviceBuffer<float> dscores(static_cast<size_t>(n * nkv));
  DeviceBuffer<int32_t> dids(static_cast<size_t>(std::max<int64_t>(keep * nkv, 1)));
  DeviceBuffer<char> dws(ws);
  CUDA_TRY(h2o_select_cuda(dacc.ptr, n, n, p, s.budget, recent, s.max_aggregation, dscores.ptr, dids.ptr, dws.ptr, ws,
                           nullptr));
  if (auto r = sync_ok(); !r) return r;
  if (auto c = scores_close(dscores.to_host(), n, want->scores, k_score_tol); !c) return c;
  auto ids = dids.to_host();
  ids.resize(static_cast<size_t>(keep * nkv));
  if (!std::is_sorted(ids.begin(), ids.end())) return AssertionFailure() << "kept ids not ascending";
  const auto got = lists_of(ids, nkv, n, n - recent, n);
  return selections_match(
      got, want->kept, want->scores, n - recent,
      [&](int g) {
        std::vector<float> older(want->scores[g].begin(), want->scores[g].begin() + (n - recent));
        return std::vector<double>{kth_largest(older, keep)};
      },
      s.same_keys, nkv * s.budget);
}

std::vector<PolicyCase> all_cases() {
  std::vector<PolicyCase> t;
  const std::vector<AdaShape> ada = {
      {"smollm2_b256_a02", 9, 3, 64, 1000, 256, 32, 7, true, false, 0.2, false},
      {"llama3_b300_k31", 32, 8, 128, 1500, 300, 16, 31, true, false, 0.2, false},
      {"qwen2_group7_k1_avg_a0", 28, 4, 128, 513, 200, 8, 1, false, false, 0.0, false},
      {"avgpool_maxagg_a1", 8, 2, 64, 777, 100, 16, 5, false, true, 1.0, false},
      {"d256_a05", 4, 1, 256, 400, 128, 32, 7, true, false, 0.5, false},
      {"d96_w24_a02", 6, 2, 96, 301, 64, 24, 3, true, false, 0.2, false},
      {"ties_same_keys", 9, 3, 64, 600, 100, 16, 5, true, false, 0.2, true},
      {"ties_same_keys_a0", 8, 4, 64, 300, 50, 8, 1, false, false, 0.0, true},
  };
  for (const AdaShape& s : ada) t.push_back({std::string("adakv_") + s.name, [=] { return run_adakv(s); }});
  const std::vector<H2oShape> h2o = {
      {"smollm2_b128_chunk64", 9, 3, 64, 700, 128, 64, false, false},
      {"llama3_b256_chunk300", 32, 8, 128, 1100, 256, 300, false, false},
      {"qwen2_group7_maxagg_chunk100", 28, 4, 128, 333, 64, 100, true, false},
      {"d256_chunk77", 4, 1, 256, 300, 64, 77, false, false},
      {"d96_b199_one_chunk", 6, 2, 96, 200, 199, 200, false, false},
      {"budget1_recent0", 8, 2, 64, 90, 1, 17, false, false},
      {"ties_same_keys", 9, 3, 64, 250, 64, 50, false, true},
  };
  for (const H2oShape& s : h2o) t.push_back({std::string("h2o_") + s.name, [=] { return run_h2o(s); }});
  t.push_back({"refuses_bad_params", []() -> AssertionResult {
                 const AttentionParams p{4, 2, 64, 0.0f, 0};
                 const PagedKvCuda kv;
                 const SnapKvCudaParams sp{100, 16, 7, true, false};
                 if (adakv_select_cuda_workspace_bytes(100, p, sp) != 0)
                   return AssertionFailure() << "adakv over N = B must be refused";
                 if (adakv_select_cuda(nullptr, kv, 500, p, sp, 1.5, nullptr, nullptr, nullptr, 1 << 20, nullptr) !=
                     cudaErrorInvalidValue)
                   return AssertionFailure() << "adakv alpha 1.5 must be refused";
                 if (h2o_select_cuda_workspace_bytes(500, p, 100, 101) != 0 || h2o_select_cuda_workspace_bytes(100, p, 100, 50) != 0)
                   return AssertionFailure() << "h2o recent > budget, or N = B, must be refused";
                 if (h2o_accumulate_cuda(nullptr, 10, 5, kv, p, nullptr, 14, nullptr, 1 << 20, nullptr) != cudaErrorInvalidValue)
                   return AssertionFailure() << "h2o accumulation past acc_stride must be refused";
                 const AttentionParams bad{4, 3, 64, 0.0f, 0};
                 if (h2o_accumulate_cuda_workspace_bytes(10, bad) != 0)
                   return AssertionFailure() << "4 heads over 3 KV heads must be refused";
                 return AssertionSuccess();
               }});
  return t;
}

void PrintTo(const PolicyCase& c, std::ostream* os) { *os << c.name; }

class CudaPolicy : public ::testing::TestWithParam<PolicyCase> {};

TEST_P(CudaPolicy, MatchesCpu) { EXPECT_TRUE(GetParam().run()); }

INSTANTIATE_TEST_SUITE_P(Table, CudaPolicy, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<PolicyCase>& info) { return info.param.name; });

}  // namespace
}  // namespace snap::kernels

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();  // the table's names, no GPU needed
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("test_cuda_policies: no usable GPU (%s); skipping\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  return RUN_ALL_TESTS();
}
