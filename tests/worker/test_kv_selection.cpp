// KV-cache selection (worker/kv/selection.h) against the numpy reference: every case of
// tests/fixtures/kv_selection/manifest.json (written by tools/kv_selection_reference.py)
// must keep exactly the same positions per KV head (SnapKV, AdaKV, H2O whole and chunked,
// StreamingLLM) and give the same PyramidKV budgets. Also: tie-breaks with constant scores,
// N <= budget keeps everything, bad parameters give a Status, AdaKV/PyramidKV totals, H2O
// at N=20000 finds planted heavy hitters without an N×N buffer.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "worker/kv/selection.h"

namespace snap {
namespace {

const std::string k_dir = std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/kv_selection/";

nlohmann::json manifest() {
  std::ifstream in(k_dir + "manifest.json");
  EXPECT_TRUE(in.good()) << "cannot open " << k_dir << "manifest.json";
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
}

std::vector<float> read_floats(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open fixture " << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(bytes.size(), count * 4) << path;
  std::vector<float> out(count, 0.0f);
  std::memcpy(out.data(), bytes.data(), std::min(bytes.size(), count * 4));
  return out;
}

// One input set of the manifest: keys [num_kv_heads, N, head_dim], queries of the last
// num_queries positions [num_queries, num_heads, head_dim].
struct InputSet {
  std::vector<float> q, k;
  LayerQk qk;
};

std::map<std::string, InputSet> load_sets(const nlohmann::json& m) {
  std::map<std::string, InputSet> sets;
  for (const auto& s : m["sets"]) {
    const std::string name = s["name"];
    InputSet& in = sets[name];
    LayerQk& qk = in.qk;
    qk.num_tokens = s["num_tokens"];
    qk.num_heads = s["num_heads"];
    qk.num_kv_heads = s["num_kv_heads"];
    qk.head_dim = s["head_dim"];
    qk.num_queries = s["num_queries"];
    qk.kv_head_stride = qk.num_tokens * qk.head_dim;
    in.k = read_floats(k_dir + name + ".k.bin", static_cast<size_t>(qk.num_kv_heads * qk.kv_head_stride));
    in.q = read_floats(k_dir + name + ".q.bin", static_cast<size_t>(qk.num_queries * qk.num_heads * qk.head_dim));
  }
  for (auto& [name, in] : sets) {  // pointers only once the map no longer moves
    in.qk.k = in.k.data();
    in.qk.q = in.q.data();
  }
  return sets;
}

KvPooling pooling_of(const std::string& s) { return s == "avg" ? KvPooling::avg : KvPooling::max; }
GqaAggregation aggregation_of(const std::string& s) { return s == "max" ? GqaAggregation::max : GqaAggregation::mean; }

SnapKvParams snap_params(const nlohmann::json& p) {
  SnapKvParams s;
  s.budget = p["budget"];
  s.window = p["window"];
  s.kernel = p["kernel"];
  s.pooling = pooling_of(p["pooling"]);
  s.aggregation = aggregation_of(p["aggregation"]);
  return s;
}

H2oParams h2o_params(const nlohmann::json& p) {
  H2oParams h;
  h.budget = p["budget"];
  h.recent = p["recent"];
  h.aggregation = aggregation_of(p["aggregation"]);
  return h;
}

// Reports the first differing KV head and position.
void expect_same_kept(const LayerSelection& got, const std::vector<std::vector<int32_t>>& want, const std::string& what) {
  ASSERT_EQ(got.kept.size(), want.size()) << what << ": number of KV heads";
  for (size_t g = 0; g < want.size(); ++g) {
    const auto& a = got.kept[g];
    const auto& b = want[g];
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    if (i < n) {
      ADD_FAILURE() << what << ": KV head " << g << ", entry " << i << ": got position " << a[i] << ", want " << b[i];
      return;
    }
    EXPECT_EQ(a.size(), b.size()) << what << ": KV head " << g << " keeps a different number of positions";
  }
}

std::string case_name(const nlohmann::json& c, size_t index) {
  return "case " + std::to_string(index) + " (set " + c["set"].get<std::string>() + ", " +
         c["kind"].get<std::string>() + ", " + c["params"].dump() + ")";
}

// --- against the reference -----------------------------------------------------------
TEST(KvSelection, EveryFixtureCaseMatchesReference) {
  const auto m = manifest();
  auto sets = load_sets(m);
  ASSERT_GE(m["cases"].size(), 20u);
  std::map<std::string, int> kinds;
  for (size_t i = 0; i < m["cases"].size(); ++i) {
    const auto& c = m["cases"][i];
    const std::string kind = c["kind"], what = case_name(c, i);
    const LayerQk& qk = sets.at(c["set"]).qk;
    const auto want = c["kept"].get<std::vector<std::vector<int32_t>>>();
    Result<LayerSelection> got = invalid_argument("unknown kind " + kind);
    if (kind == "snapkv") {
      got = snapkv_select(qk, snap_params(c["params"]));
    } else if (kind == "adakv") {
      got = adakv_select(qk, AdaKvParams{snap_params(c["params"]), c["params"]["alpha"].get<double>()});
    } else if (kind == "h2o") {
      got = h2o_select(qk, h2o_params(c["params"]));
    } else if (kind == "streaming") {
      got = streaming_select(qk.num_tokens, qk.num_kv_heads,
                             StreamingParams{c["params"]["budget"].get<int64_t>(), c["params"]["num_sink"].get<int>()});
    }
    ASSERT_TRUE(got.ok()) << what << ": " << got.status().to_string();
    expect_same_kept(*got, want, what);
    ++kinds[kind];
  }
  for (const char* k : {"snapkv", "adakv", "h2o", "streaming"}) EXPECT_GE(kinds[k], 2) << "fixtures lack " << k << " cases";
}

TEST(KvSelection, H2oChunkedMatchesReference) {
  const auto m = manifest();
  auto sets = load_sets(m);
  int checked = 0;
  for (size_t i = 0; i < m["cases"].size(); ++i) {
    const auto& c = m["cases"][i];
    if (c["kind"] != "h2o") continue;
    const LayerQk& whole = sets.at(c["set"]).qk;
    H2oAccumulator acc(whole.num_heads, whole.num_kv_heads, whole.head_dim);
    // Chunks of 7, 70, the rest (crossing the 64-query tile); keys: exactly those seen so far.
    int64_t pos = 0;
    for (int64_t len : {int64_t{7}, int64_t{70}, whole.num_tokens}) {
      LayerQk chunk = whole;
      chunk.num_queries = std::min(len, whole.num_tokens - pos);
      if (chunk.num_queries == 0) break;
      chunk.q = whole.q + pos * whole.num_heads * whole.head_dim;
      chunk.num_tokens = pos + chunk.num_queries;
      ASSERT_TRUE(acc.add(chunk, pos).ok());
      pos += chunk.num_queries;
    }
    ASSERT_EQ(acc.num_tokens(), whole.num_tokens);
    auto got = acc.select(h2o_params(c["params"]));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    expect_same_kept(*got, c["kept"].get<std::vector<std::vector<int32_t>>>(), "chunked " + case_name(c, i));
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(KvSelection, PyramidBudgetsMatchReferenceAndKeepTheTotal) {
  const auto m = manifest();
  ASSERT_GE(m["pyramid"].size(), 5u);
  for (const auto& p : m["pyramid"]) {
    const int layers = p["num_layers"], window = p["window"], beta = p["beta"];
    const int64_t avg = p["avg_budget"];
    auto got = pyramid_budgets(layers, avg, window, beta);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, p["budgets"].get<std::vector<int64_t>>()) << p.dump();
    EXPECT_EQ(std::accumulate(got->begin(), got->end(), int64_t{0}), avg * layers) << p.dump();
    for (size_t l = 0; l < got->size(); ++l) {
      EXPECT_GT((*got)[l], window) << "layer " << l << " of " << p.dump();
      if (l > 0) {
        EXPECT_LE((*got)[l], (*got)[l - 1]) << "layer " << l << " of " << p.dump();
      }
    }
    if (layers > 2) {
      EXPECT_GT(got->front(), got->back()) << p.dump();
    }
  }
}

TEST(KvSelection, AdaKvKeepsTheUniformTotalAndTheSafeguard) {
  const auto m = manifest();
  auto sets = load_sets(m);
  int checked = 0;
  for (const auto& c : m["cases"]) {
    if (c["kind"] != "adakv") continue;
    const LayerQk& qk = sets.at(c["set"]).qk;
    const AdaKvParams p{snap_params(c["params"]), c["params"]["alpha"].get<double>()};
    if (qk.num_tokens <= p.snap.budget) continue;
    auto got = adakv_select(qk, p);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got->total_kept(), qk.num_kv_heads * p.snap.budget) << c["params"].dump();
    const int64_t safeguard = static_cast<int64_t>(p.alpha * static_cast<double>(p.snap.budget - p.snap.window));
    for (const auto& kept : got->kept) {
      EXPECT_GE(static_cast<int64_t>(kept.size()), safeguard + p.snap.window) << c["params"].dump();
      EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
      EXPECT_EQ(std::adjacent_find(kept.begin(), kept.end()), kept.end()) << "duplicate position";
      // the window is always kept
      for (int64_t j = qk.num_tokens - p.snap.window; j < qk.num_tokens; ++j)
        EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), static_cast<int32_t>(j))) << "window position " << j;
    }
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(KvSelection, ScoresAreReturnedWhenAsked) {
  const auto m = manifest();
  auto sets = load_sets(m);
  const LayerQk& qk = sets.at("c").qk;
  SnapKvParams p;
  p.budget = 100;
  p.window = 32;
  p.keep_scores = true;
  auto sel = snapkv_select(qk, p);
  ASSERT_TRUE(sel.ok()) << sel.status().to_string();
  auto scores = snapkv_scores(qk, p);
  ASSERT_TRUE(scores.ok());
  ASSERT_EQ(sel->scores.size(), static_cast<size_t>(qk.num_kv_heads));
  for (int g = 0; g < qk.num_kv_heads; ++g) {
    ASSERT_EQ(sel->scores[g].size(), static_cast<size_t>(qk.num_tokens - p.window));
    EXPECT_EQ(sel->scores[g], (*scores)[g]);
    // every kept prefix position scores at least as high as every dropped one
    std::vector<char> kept(sel->scores[g].size(), 0);
    for (int32_t j : sel->kept[g])
      if (j < qk.num_tokens - p.window) kept[j] = 1;
    float min_kept = 1e30f, max_dropped = -1e30f;
    for (size_t j = 0; j < kept.size(); ++j) {
      if (kept[j]) min_kept = std::min(min_kept, sel->scores[g][j]);
      else max_dropped = std::max(max_dropped, sel->scores[g][j]);
    }
    EXPECT_GE(min_kept, max_dropped);
  }
}

// --- ties, no compression, errors -------------------------------------------------------
// All keys zero: every logit is 0, so every prefix position gets exactly the same score.
struct ZeroKeys {
  std::vector<float> q, k;
  LayerQk qk;
  ZeroKeys(int64_t n, int heads, int kv, int dim, int64_t queries) : q(queries * heads * dim, 0.5f), k(kv * n * dim, 0.0f) {
    qk = LayerQk{q.data(), queries, k.data(), n * dim, n, heads, kv, dim};
  }
};

std::vector<int32_t> range_then_window(int64_t begin, int64_t end, int64_t n, int64_t window) {
  std::vector<int32_t> v;
  for (int64_t j = begin; j < end; ++j) v.push_back(static_cast<int32_t>(j));
  for (int64_t j = n - window; j < n; ++j) v.push_back(static_cast<int32_t>(j));
  return v;
}

TEST(KvSelection, EqualScoresKeepTheLowestPositions) {
  ZeroKeys z(200, 6, 2, 8, 16);
  SnapKvParams p;
  p.budget = 40;
  p.window = 16;
  p.kernel = 7;
  p.pooling = KvPooling::max;
  auto got = snapkv_select(z.qk, p);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  for (const auto& kept : got->kept) EXPECT_EQ(kept, range_then_window(0, 24, 200, 16));
  // Avg pooling divides by k at the edges too (zero padding), so positions 0..2 score
  // 4/7, 5/7, 6/7 of the rest: the plateau starts at k/2 = 3.
  p.pooling = KvPooling::avg;
  got = snapkv_select(z.qk, p);
  ASSERT_TRUE(got.ok());
  for (const auto& kept : got->kept) EXPECT_EQ(kept, range_then_window(3, 27, 200, 16));
  // H2O with zero keys: position j collects Σ_{i>=j} 1/(i+1), so the earliest positions are
  // the heavy hitters, then the 15 most recent.
  H2oParams h;
  h.budget = 30;
  ZeroKeys all(120, 2, 1, 4, 120);
  auto h2o = h2o_select(all.qk, h);
  ASSERT_TRUE(h2o.ok()) << h2o.status().to_string();
  EXPECT_EQ(h2o->kept[0], range_then_window(0, 15, 120, 15));
}

TEST(KvSelection, AdaKvEqualScoresFavourLowerHeadThenPosition) {
  ZeroKeys z(100, 4, 4, 8, 8);
  AdaKvParams p;
  p.snap.budget = 28;  // share 20, safeguard floor(0.2·20) = 4 per head, 4·16 = 64 global slots
  p.snap.window = 8;
  p.snap.kernel = 1;
  auto got = adakv_select(z.qk, p);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  // Head 0 takes the 64 global slots first (positions 4..67 after its safeguard 0..3).
  EXPECT_EQ(got->kept[0], range_then_window(0, 68, 100, 8));
  for (int g = 1; g < 4; ++g) EXPECT_EQ(got->kept[g], range_then_window(0, 4, 100, 8)) << "head " << g;
  EXPECT_EQ(got->total_kept(), 4 * 28);
}

TEST(KvSelection, ShortPromptKeepsEverything) {
  ZeroKeys z(50, 4, 2, 8, 50);
  std::vector<int32_t> all(50);
  std::iota(all.begin(), all.end(), 0);
  SnapKvParams p;
  p.budget = 50;
  p.window = 32;
  auto s = snapkv_select(z.qk, p);
  ASSERT_TRUE(s.ok());
  auto a = adakv_select(z.qk, AdaKvParams{p, 0.2});
  ASSERT_TRUE(a.ok());
  H2oParams hp;
  hp.budget = 64;
  auto h = h2o_select(z.qk, hp);
  ASSERT_TRUE(h.ok());
  auto st = streaming_select(50, 2, StreamingParams{50, 4});
  ASSERT_TRUE(st.ok());
  for (const LayerSelection* sel : {&*s, &*a, &*h, &*st}) {
    ASSERT_EQ(sel->kept.size(), 2u);
    for (const auto& kept : sel->kept) EXPECT_EQ(kept, all);
  }
}

TEST(KvSelection, StreamingKeepsSinksAndRecent) {
  auto got = streaming_select(1000, 3, StreamingParams{64, 4});
  ASSERT_TRUE(got.ok());
  for (const auto& kept : got->kept) {
    ASSERT_EQ(kept.size(), 64u);
    EXPECT_EQ(kept[3], 3);
    EXPECT_EQ(kept[4], 1000 - 60);
    EXPECT_EQ(kept.back(), 999);
  }
}

void expect_error(const Status& s, const std::string& fragment) {
  EXPECT_FALSE(s.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "message is not one line: " << s.message();
}

TEST(KvSelection, BadParametersGiveStatus) {
  ZeroKeys z(100, 4, 2, 8, 32);
  SnapKvParams p;
  p.budget = 16;
  p.window = 32;
  expect_error(snapkv_select(z.qk, p).status(), "budget 16 must be larger than window 32");
  p = SnapKvParams{};
  p.budget = 64;
  p.kernel = 4;
  expect_error(snapkv_select(z.qk, p).status(), "kernel 4 must be odd");
  p.kernel = 7;
  p.window = 0;
  expect_error(snapkv_select(z.qk, p).status(), "window 0");
  p.window = 33;
  expect_error(snapkv_select(z.qk, p).status(), "window needs 33");  // only 32 queries given
  p.window = 32;
  LayerQk bad = z.qk;
  bad.num_kv_heads = 3;
  expect_error(snapkv_select(bad, p).status(), "not a positive multiple of num_kv_heads 3");
  bad = z.qk;
  bad.kv_head_stride = 10;
  expect_error(snapkv_select(bad, p).status(), "kv_head_stride 10");
  expect_error(adakv_select(z.qk, AdaKvParams{p, 1.5}).status(), "alpha");
  expect_error(streaming_select(100, 2, StreamingParams{4, 4}).status(), "budget 4 must be larger than num_sink 4");
  H2oParams h;
  h.budget = 10;
  h.recent = 11;
  ZeroKeys all(40, 2, 1, 4, 40);
  expect_error(h2o_select(all.qk, h).status(), "recent 11 exceeds budget 10");
  expect_error(h2o_select(z.qk, H2oParams{}).status(), "needs every prompt query");
  H2oAccumulator acc(2, 1, 4);
  LayerQk chunk = all.qk;
  chunk.num_queries = 5;
  expect_error(acc.add(chunk, 3), "chunk starts at position 3, expected 0");
  expect_error(pyramid_budgets(30, 32, 32).status(), "budget 32 must be larger than window 32");
  expect_error(pyramid_budgets(0, 128, 32).status(), "num_layers 0");
}

// --- scale ------------------------------------------------------------------------------
long peak_rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

TEST(KvSelection, H2oAtTwentyThousandTokensFindsHeavyHittersInLinearMemory) {
  const int64_t n = 20000;
  const int dim = 4;
  std::mt19937 gen(7);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> q(n * dim), k(n * dim);
  for (int64_t i = 0; i < n; ++i) {
    q[i * dim] = 3.0f;  // every query looks along axis 0
    for (int d = 1; d < dim; ++d) q[i * dim + d] = noise(gen);
    for (int d = 0; d < dim; ++d) k[i * dim + d] = noise(gen);
  }
  const std::vector<int32_t> planted = {7, 5000, 12345};
  for (int32_t j : planted) k[j * dim] = 4.0f;  // logit 6 vs ~0: each later query attends there
  const long before = peak_rss_kib();
  auto got = h2o_select(LayerQk{q.data(), n, k.data(), n * dim, n, 1, 1, dim}, H2oParams{64, 32});
  const long after = peak_rss_kib();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->kept[0].size(), 64u);
  for (int32_t j : planted)
    EXPECT_TRUE(std::binary_search(got->kept[0].begin(), got->kept[0].end(), j)) << "heavy hitter " << j << " dropped";
  ASSERT_GT(before, 0);
  // An N×N f32 matrix would be 1.6 GB; the 64-row tiles are 5 MB.
  EXPECT_LT(after - before, 64 * 1024) << "peak RSS grew by " << (after - before) << " KiB";
}

}  // namespace
}  // namespace snap
