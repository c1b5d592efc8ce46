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

// --- fast: nth_element for top_k, growing partial sorts for top_p ---------------------
int32_t sample_cpu(const float* logits, int64_t vocab_size, const SamplingParams& p, Rng& rng) {
  if (p.temperature <= 0.0f) return argmax(logits, vocab_size);
  const std::vector<double> z = scaled_logits(logits, vocab_size, p.temperature);
  const Before before{z.data()};
  std::vector<int32_t> cand(static_cast<size_t>(vocab_size));
  std::iota(cand.begin(), cand.end(), 0);
  if (top_k_active(p, vocab_size)) {
    std::nth_element(cand.begin(), cand.begin() + (p.top_k - 1), cand.end(), before);
    cand.resize(static_cast<size_t>(p.top_k));  // the k first in order, unsorted
  }
  const int32_t top = *std::min_element(cand.begin(), cand.end(), before);
  const double z_max = z[top];
  if (std::isinf(z_max) && z_max < 0) return argmax(logits, vocab_size);
  std::vector<uint8_t> keep(static_cast<size_t>(vocab_size), 0);
  for (int32_t i : cand) keep[i] = 1;
  std::vector<double> e(static_cast<size_t>(vocab_size), 0.0);
  double big_z = 0.0;
  for (int64_t i = 0; i < vocab_size; ++i) {  // id order, as in the reference
    if (!keep[i]) continue;
    e[i] = std::exp(z[i] - z_max);
    big_z += e[i];
  }
  if (p.top_p < 1.0f) {
    // Sort only as much of the order as the nucleus needs: 64, 256, 1024, ... entries.
    const int64_t n = static_cast<int64_t>(cand.size());
    const double goal = static_cast<double>(p.top_p) * big_z;
    int64_t sorted = 0, prefix = n;
    double cum = 0.0;
    for (int64_t want = std::min<int64_t>(64, n); sorted < n; want = std::min(n, want * 4)) {
      std::partial_sort(cand.begin() + sorted, cand.begin() + want, cand.end(), before);
      for (; sorted < want; ++sorted) {
        cum += e[cand[sorted]];
        if (cum >= goal) break;
      }
      if (sorted < want) {
        prefix = sorted + 1;
        break;
      }
    }
    std::fill(keep.begin(), keep.end(), 0);
    for (int64_t r = 0; r < prefix; ++r) keep[cand[r]] = 1;
  }
  if (p.min_p > 0.0f) {
    for (int64_t i = 0; i < vocab_size; ++i)
      if (keep[i] && i != top && e[i] < static_cast<double>(p.min_p)) keep[i] = 0;
  }
  return draw(e, keep, rng);
}

}  // namespace snap::kernels
