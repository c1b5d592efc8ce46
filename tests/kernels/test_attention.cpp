// attention: a tiny case against a naive full-softmax computed here (explicit score
// matrix, −inf mask), then attention_cpu at every SIMD level against attention_ref over a
// table of num_tokens × kv_len × GQA ratio × head_dim × sliding window, with a KV head
// stride larger than kv_len·head_dim; split-KV decode; NaN in V reaches only the queries
// that see it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/kernels.h"
#include "tests/kernels/kernel_test_util.h"

namespace snap::kernels {
namespace {

// Online softmax in f32 vs two-pass f64: each output is a convex combination of V rows
// (|v| ≤ 1), with weight errors ~1e-7 per rescale and the dot products' f32 rounding
// (hd 128 terms, ~1e-6 of a score ~1); 1e-5 normalized, while a missing or extra key
// shifts outputs by ≥ 1/kv_len·|v| ≈ 1e-3.
constexpr double k_tol = 1e-5;

struct Case {
  int64_t num_tokens, kv_len;
  int ratio, head_dim, window;
};

void run_case(const Case& c, int num_kv_heads = 2) {
  AttentionParams p;
  p.num_kv_heads = num_kv_heads;
  p.num_heads = num_kv_heads * c.ratio;
  p.head_dim = c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.sliding_window = c.window;
  const int64_t capacity = c.kv_len + 5;  // stride > kv_len·head_dim, as in a cache with room
  const int64_t stride = capacity * c.head_dim;
  const std::vector<float> q = test::random_floats(c.num_tokens * p.num_heads * c.head_dim, 1, -2.0f, 2.0f);
  const std::vector<float> k = test::random_floats(num_kv_heads * stride, 2, -2.0f, 2.0f);
  const std::vector<float> v = test::random_floats(num_kv_heads * stride, 3);
  std::vector<int32_t> pos(static_cast<size_t>(c.num_tokens));
  for (int64_t t = 0; t < c.num_tokens; ++t) pos[t] = static_cast<int32_t>(c.kv_len - c.num_tokens + t);
  std::vector<float> want(q.size());
  attention_ref(q.data(), pos.data(), c.num_tokens, k.data(), v.data(), stride, c.kv_len, p, want.data());
  for (SimdLevel level : test::supported_levels()) {
    test::LevelGuard guard(level);
    std::vector<float> got(q.size(), -7.0f);
    attention_cpu(q.data(), pos.data(), c.num_tokens, k.data(), v.data(), stride, c.kv_len, p, got.data());
    EXPECT_TRUE(test::all_close(got.data(), want.data(), static_cast<int64_t>(got.size()), k_tol))
        << test::level_name(level) << " tokens " << c.num_tokens << " kv_len " << c.kv_len << " ratio " << c.ratio
        << " head_dim " << c.head_dim << " window " << c.window << " kv_heads " << num_kv_heads;
  }
}

TEST(Attention, ReferenceAndCpuMatchNaiveFullSoftmax) {
  // 3 queries at positions 2..4 over 5 keys, 2 query heads sharing 1 KV head, head_dim 4.
  const int64_t num_tokens = 3, kv_len = 5;
  const int hd = 4, nh = 2;
  const std::vector<float> q = test::random_floats(num_tokens * nh * hd, 8, -2.0f, 2.0f);
  const std::vector<float> k = test::random_floats(kv_len * hd, 9, -2.0f, 2.0f);
  const std::vector<float> v = test::random_floats(kv_len * hd, 10);
  const int32_t pos[3] = {2, 3, 4};
  for (int window : {0, 2}) {
    std::vector<float> naive(q.size());
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int h = 0; h < nh; ++h) {
        double scores[kv_len];
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < kv_len; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[(t * nh + h) * hd + i] * k[j * hd + i];
          const bool masked = j > pos[t] || (window > 0 && pos[t] - j >= window);
          scores[j] = masked ? -std::numeric_limits<double>::infinity() : d * 0.5;
          m = std::max(m, scores[j]);
        }
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - m));
        for (int i = 0; i < hd; ++i) {
          double o = 0;
          for (int64_t j = 0; j < kv_len; ++j) o += scores[j] / sum * v[j * hd + i];
          naive[(t * nh + h) * hd + i] = static_cast<float>(o);
        }
      }
    }
    AttentionParams p{nh, 1, hd, 0.5f, window};
    std::vector<float> ref(q.size()), fast(q.size());
    attention_ref(q.data(), pos, num_tokens, k.data(), v.data(), kv_len * hd, kv_len, p, ref.data());
    attention_cpu(q.data(), pos, num_tokens, k.data(), v.data(), kv_len * hd, kv_len, p, fast.data());
    EXPECT_TRUE(test::all_close(ref.data(), naive.data(), static_cast<int64_t>(q.size()), 1e-6)) << "window " << window;
    EXPECT_TRUE(test::all_close(fast.data(), naive.data(), static_cast<int64_t>(q.size()), k_tol)) << "window " << window;
  }
}

TEST(Attention, CpuMatchesReferenceOverShapeTable) {
  for (int64_t kv_len : {1, 7, 300, 1000}) {
    for (int64_t num_tokens : {1, 3, 17, 128}) {
      if (num_tokens > kv_len) continue;
      for (int ratio : {1, 3, 4}) {
        for (int head_dim : {64, 128}) {
          for (int window : {0, 5, 100}) run_case({num_tokens, kv_len, ratio, head_dim, window});
        }
      }
    }
  }
}

TEST(Attention, SmolLm2ShapesAndLongDecodeSplit) {
  run_case({1, 8000, 3, 64, 0}, 3);    // SmolLM2 decode at 8K: KV split across threads
  run_case({1, 8000, 3, 64, 4096}, 3);
  run_case({200, 200, 3, 64, 0}, 3);   // SmolLM2 prefill
  run_case({1, 3000, 4, 128, 0}, 1);   // one KV head: every item is a split
}

TEST(Attention, OddHeadDimUsesScalarPathCorrectly) { run_case({5, 40, 2, 36, 0}); }

TEST(Attention, NanInValueReachesOnlyQueriesThatSeeIt) {
  const int64_t kv_len = 400, num_tokens = 400;
  const int hd = 64;
  AttentionParams p{3, 1, hd, 0.125f, 0};
  const std::vector<float> q = test::random_floats(num_tokens * 3 * hd, 11);
  const std::vector<float> k = test::random_floats(kv_len * hd, 12);
  std::vector<float> v = test::random_floats(kv_len * hd, 13);
  v[300 * hd + 7] = NAN;  // key 300
  std::vector<int32_t> pos(num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t) pos[t] = static_cast<int32_t>(t);
  for (SimdLevel level : test::supported_levels()) {
    test::LevelGuard guard(level);
    std::vector<float> out(q.size());
    attention_cpu(q.data(), pos.data(), num_tokens, k.data(), v.data(), kv_len * hd, kv_len, p, out.data());
    for (int64_t t : {0, 150, 299, 300, 301, 399}) {
      EXPECT_EQ(std::isnan(out[(t * 3 + 1) * hd + 7]), t >= 300) << test::level_name(level) << " query " << t;
    }
    // Decode over the same cache (split path): the last query sees key 300.
    std::vector<float> dec(3 * hd);
    const int32_t last = 399;
    attention_cpu(q.data(), &last, 1, k.data(), v.data(), kv_len * hd, kv_len, p, dec.data());
    EXPECT_TRUE(std::isnan(dec[7])) << test::level_name(level) << " decode";
  }
}

}  // namespace
}  // namespace snap::kernels
