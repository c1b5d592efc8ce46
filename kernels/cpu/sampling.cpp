// Token sampling. Rng: splitmix64-seeded xoshiro256**, identical on every platform.
// Semantics shared by sample_ref and sample_cpu (they must return the same token):
//  - temperature ≤ 0: argmax, lowest id wins ties; consumes no random number.
//  - z_i = logit_i / T in f64 (NaN logits count as −inf); order = (z desc, id asc).
//  - top_k keeps the first k in that order; e_i = exp(z_i − z_max), Z = Σ e_i in id order.
//  - top_p keeps the shortest prefix (in order) whose Σ e_i ≥ top_p·Z (at least one token);
//    min_p keeps e_i ≥ min_p (e_max = 1), i.e. p_i ≥ min_p·p_max, and always the top token.
//  - one u = next_unit(); walk the kept tokens in id order, return the first whose running
//    Σ e_i exceeds u·Σ_kept e_i. Same sums in the same order ⇒ bit-identical decisions.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/kernels.h"

namespace snap::kernels {

// --- Rng ----------------------------------------------------------------------
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::next_unit() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

// --- shared pieces --------------------------------------------------------------
namespace {

int32_t argmax(const float* logits, int64_t vocab_size) {
  int64_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (logits[i] > best_v) {  // strict: the lowest id wins ties; NaN never wins
      best_v = logits[i];
      best = i;
    }
  }
  return static_cast<int32_t>(best);
}

std::vector<double> scaled_logits(const float* logits, int64_t vocab_size, float temperature) {
  std::vector<double> z(static_cast<size_t>(vocab_size));
  for (int64_t i = 0; i < vocab_size; ++i)
    z[i] = std::isnan(logits[i]) ? -std::numeric_limits<double>::infinity()
                                 : static_cast<double>(logits[i]) / temperature;
  return z;
}

// Strict order (z desc, id asc): a precedes b.
struct Before {
  const double* z;
  bool operator()(int32_t a, int32_t b) const { return z[a] > z[b] || (z[a] == z[b] && a < b); }
};

// Walk ids ascending over kept tokens (keep[i] or all when keep is empty).
int32_t draw(const std::vector<double>& e, const std::vector<uint8_t>& keep, Rng& rng) {
  const int64_t n = static_cast<int64_t>(e.size());
  double total = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (keep[i]) {
      total += e[i];
      last = i;
    }
  }
  const double target = static_cast<double>(rng.next_unit()) * total;
  double cum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!keep[i]) continue;
    cum += e[i];
    if (cum > target) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);
}

bool top_k_active(const SamplingParams& p, int64_t vocab_size) { return p.top_k > 0 && p.top_k < vocab_size; }

}  // namespace

// --- reference: full sort -------------------------------------------------------------
int32_t sample_ref(const float* logits, int64_t vocab_size, const SamplingParams& p, Rng& rng) {
  if (p.temperature <= 0.0f) return argmax(logits, vocab_size);
  const std::vector<double> z = scaled_logits(logits, vocab_size, p.temperature);
  std::vector<int32_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), Before{z.data()});
  const double z_max = z[order[0]];
  if (std::isinf(z_max) && z_max < 0) return argmax(logits, vocab_size);
  const int64_t num_cand = top_k_active(p, vocab_size) ? p.top_k : vocab_size;
  std::vector<uint8_t> keep(static_cast<size_t>(vocab_size), 0);
  for (int64_t r = 0; r < num_cand; ++r) keep[order[r]] = 1;
  std::vector<double> e(static_cast<size_t>(vocab_size), 0.0);
  double big_z = 0.0;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (!keep[i]) continue;
    e[i] = std::exp(z[i] - z_max);
    big_z += e[i];
  }
  int64_t prefix = num_cand;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (int64_t r = 0; r < num_cand; ++r) {
      cum += e[order[r]];
      if (cum >= static_cast<double>(p.top_p) * big_z) {
        prefix = r + 1;
        break;
      }
    }
  }
  for (int64_t r = 0; r < num_cand; ++r)
    keep[order[r]] = r < prefix && (r == 0 || p.min_p <= 0.0f || e[order[r]] >= static_cast<double>(p.min_p));
  return draw(e, keep, rng);
}

// --- fast: nth_element for top_k, a thresholded sort for top_p ----------------------------
// The same sums in the same order as the reference (so the same token), without its sort, and
// from buffers kept per thread (a vocabulary of 128K took ~2.6 MB of fresh allocations per draw,
// each page faulted in again). Without top_k and top_p every token is a candidate: the top one
// is found by one pass (the highest z, the lowest id among equals: the reference's order), and
// no candidate list is built.
int32_t sample_cpu(const float* logits, int64_t vocab_size, const SamplingParams& p, Rng& rng) {
  if (p.temperature <= 0.0f) return argmax(logits, vocab_size);
  thread_local std::vector<double> z, e;
  thread_local std::vector<int32_t> cand;
  thread_local std::vector<uint8_t> keep;
  const size_t n_vocab = static_cast<size_t>(vocab_size);
  z.resize(n_vocab);
  e.resize(n_vocab);
  const double temperature = p.temperature;
  for (int64_t i = 0; i < vocab_size; ++i)
    z[i] = std::isnan(logits[i]) ? -std::numeric_limits<double>::infinity() : static_cast<double>(logits[i]) / temperature;
  const Before before{z.data()};
  const bool all = !top_k_active(p, vocab_size) && p.top_p >= 1.0f;
  int32_t top = 0;
  if (all) {
    for (int64_t i = 1; i < vocab_size; ++i)
      if (z[i] > z[top]) top = static_cast<int32_t>(i);  // strict: the lowest id among equals
  } else {
    cand.resize(n_vocab);
    std::iota(cand.begin(), cand.end(), 0);
    if (top_k_active(p, vocab_size)) {
      std::nth_element(cand.begin(), cand.begin() + (p.top_k - 1), cand.end(), before);
      cand.resize(static_cast<size_t>(p.top_k));  // the k first in order, unsorted
    }
    top = *std::min_element(cand.begin(), cand.end(), before);
  }
  const double z_max = z[top];
  if (std::isinf(z_max) && z_max < 0) return argmax(logits, vocab_size);
  keep.assign(n_vocab, all ? 1 : 0);
  if (!all)
    for (int32_t i : cand) keep[i] = 1;
  double big_z = 0.0;
  for (int64_t i = 0; i < vocab_size; ++i) {  // id order, as in the reference
    if (!keep[i]) {
      e[i] = 0.0;
      continue;
    }
    e[i] = std::exp(z[i] - z_max);
    big_z += e[i];
  }
  if (p.top_p < 1.0f) {
    // The nucleus is a prefix of the order, and so is every {z_i > z_max - d}. Bucket the
    // candidates by z_max - z_i in quarters (256 buckets, the last one open), sum each bucket,
    // take the fewest top buckets whose sum, in this order, clears the goal by more than the
    // rounding of a sum of <= 2^17 terms in another order (1e-9 relative: the reference's
    // in-order sum then reaches the goal within them too), sort just those tokens, and walk
    // them in order as the reference walks.
    const int64_t n = static_cast<int64_t>(cand.size());
    const double goal = static_cast<double>(p.top_p) * big_z;
    constexpr int k_buckets = 256;
    const auto bucket = [&](int32_t i) {
      const double d = (z_max - z[i]) * 4.0;  // >= 0; +inf for -inf logits
      return d < k_buckets - 1 ? static_cast<int>(d) : k_buckets - 1;
    };
    double sums[k_buckets] = {};
    for (int32_t i : cand) sums[bucket(i)] += e[i];
    int last = k_buckets - 1;
    double sum = 0.0;
    for (int k = 0; k < k_buckets; ++k) {
      sum += sums[k];
      if (sum >= goal * (1.0 + 1e-9)) {
        last = k;
        break;
      }
    }
    thread_local std::vector<int32_t> head;
    head.clear();
    for (int32_t i : cand)
      if (bucket(i) <= last) head.push_back(i);
    std::sort(head.begin(), head.end(), before);
    int64_t prefix = n;
    double cum = 0.0;
    for (size_t r = 0; r < head.size(); ++r) {
      cum += e[head[r]];
      if (cum >= goal) {
        prefix = static_cast<int64_t>(r) + 1;
        break;
      }
    }
    std::fill(keep.begin(), keep.end(), 0);
    if (prefix == n) {  // the goal was not reached: every candidate stays, as in the reference
      for (int32_t i : cand) keep[i] = 1;
    } else {
      for (int64_t r = 0; r < prefix; ++r) keep[head[r]] = 1;
    }
  }
  if (p.min_p > 0.0f) {
    for (int64_t i = 0; i < vocab_size; ++i)
      if (keep[i] && i != top && e[i] < static_cast<double>(p.min_p)) keep[i] = 0;
  }
  return draw(e, keep, rng);
}

}  // namespace snap::kernels
