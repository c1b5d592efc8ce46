// Tokenizer encode/decode: added-token matching, normalizers, pre-tokenizer pipeline
// (PCRE2 regex splits, ByteLevel, Metaspace), BPE merges by rank with a heap over a linked
// list of symbols (O(n log n) per word), byte fallback, and UTF-8-safe (stream) decoding.
#include "coordinator/tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <queue>

#include "coordinator/tokenizer/tokenizer_impl.h"

namespace snap {

// --- UTF-8 and byte-level helpers -------------------------------------------------------

const std::array<uint32_t, 256>& byte_to_codepoint() {
  // GPT-2: printable bytes map to themselves, the other 68 to 256, 257, ... in byte order.
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? static_cast<uint32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Length of the valid UTF-8 sequence at s[i]; 0 when invalid. *incomplete is set when the
// bytes present are a valid prefix cut off by the end of s. *valid_prefix gets how many
// bytes form the maximal valid prefix (at least 1), used for U+FFFD substitution.
size_t utf8_valid_len(std::string_view s, size_t i, bool* incomplete, size_t* valid_prefix) {
  *incomplete = false;
  *valid_prefix = 1;
  auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) {
      *incomplete = true;
      *valid_prefix = k;
      return 0;
    }
    auto b = static_cast<uint8_t>(s[i + k]);
    uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *valid_prefix = k;
      return 0;
    }
  }
  return need;
}

constexpr std::string_view k_replacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t utf8_char_len(std::string_view s, size_t i) {
  bool incomplete;
  size_t prefix;
  size_t n = utf8_valid_len(s, i, &incomplete, &prefix);
  return n == 0 ? 1 : n;
}

std::string utf8_sanitize(std::string_view bytes, bool hold_incomplete_tail, size_t* held) {
  std::string out;
  out.reserve(bytes.size());
  if (held) *held = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    bool incomplete;
    size_t prefix;
    size_t n = utf8_valid_len(bytes, i, &incomplete, &prefix);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else if (incomplete && hold_incomplete_tail) {
      if (held) *held = bytes.size() - i;
      break;
    } else {
      out.append(k_replacement);
      i += prefix;
    }
  }
  return out;
}

void TokenizerData::finalize() {
  const auto& b2c = byte_to_codepoint();
  std::unordered_map<uint32_t, uint8_t> c2b;
  for (int b = 0; b < 256; ++b) c2b[b2c[b]] = static_cast<uint8_t>(b);
  std::vector<uint8_t> is_added(id_to_token.size(), 0);
  for (const auto& a : added) is_added[a.id] = 1;

  id_to_bytes.assign(id_to_token.size(), std::string());
  for (size_t id = 0; id < id_to_token.size(); ++id) {
    const std::string& t = id_to_token[id];
    std::string& out = id_to_bytes[id];
    if (is_added[id]) {
      out = t;
    } else if (byte_level) {
      // Code points outside the table (not produced by byte-level training) pass through.
      for (size_t i = 0; i < t.size();) {
        size_t n = utf8_char_len(t, i);
        uint32_t cp = 0;
        if (n == 1) {
          cp = static_cast<uint8_t>(t[i]);
        } else {
          cp = static_cast<uint8_t>(t[i]) & (0xFF >> (n + 1));
          for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(t[i + k]) & 0x3F);
        }
        auto it = c2b.find(cp);
        if (it != c2b.end()) {
          out += static_cast<char>(it->second);
        } else {
          out.append(t, i, n);
        }
        i += n;
      }
    } else if (byte_fallback && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
               std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
      // "<0xAB>": one raw byte. (Anything else shaped like it, e.g. "<0xZZ>" in a corrupt
      // vocabulary, is ordinary text below; found by fuzz_gguf.)
      auto hex = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10); };
      out += static_cast<char>(hex(t[3]) * 16 + hex(t[4]));
    } else {
      // SentencePiece: "▁" stands for a space.
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, 3, "\u2581") == 0) {
          out += ' ';
          i += 3;
        } else {
          out += t[i++];
        }
      }
    }
  }

  for (auto& v : added_by_first_byte) v.clear();
  for (size_t k = 0; k < added.size(); ++k) {
    if (added[k].content.empty()) continue;
    added_by_first_byte[static_cast<uint8_t>(added[k].content[0])].push_back(static_cast<int32_t>(k));
  }
  for (auto& v : added_by_first_byte) {
    std::stable_sort(v.begin(), v.end(), [&](int32_t a, int32_t b) {
      return added[a].content.size() > added[b].content.size();
    });
  }

  eos_ids.clear();
  if (eos_id >= 0) eos_ids.push_back(eos_id);
  for (const char* name : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
                           "<|endoftext|>", "<end_of_turn>", "<|end|>", "</s>"}) {
    auto it = token_to_id.find(std::string_view(name));
    if (it == token_to_id.end() || !special[it->second]) continue;
    if (std::find(eos_ids.begin(), eos_ids.end(), it->second) == eos_ids.end()) {
      eos_ids.push_back(it->second);
    }
  }
}

// --- Pre-tokenization ------------------------------------------------------------------

namespace {

struct MatchData {
  pcre2_match_data* md = pcre2_match_data_create(8, nullptr);
  ~MatchData() { pcre2_match_data_free(md); }
};

// Appends the pieces of `text` split by `re` with HF SplitDelimiterBehavior semantics.
void split_regex(const CompiledRegex& re, SplitBehavior behavior, const std::string& text,
                 std::vector<std::string>& out) {
  thread_local MatchData match;
  std::vector<std::pair<size_t, size_t>> matches;
  size_t offset = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (offset < text.size()) {
    int rc = pcre2_match(re.code, subject, text.size(), offset, 0, match.md, nullptr);
    if (rc < 0) break;  // no more matches (PCRE2_ERROR_NOMATCH) or a matching limit
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.md);
    if (ov[1] == ov[0]) {  // empty match: step over one character
      offset = ov[0] + utf8_char_len(text, ov[0]);
      continue;
    }
    matches.emplace_back(ov[0], ov[1]);
    offset = ov[1];
  }
  // Walk gaps and matches in order.
  size_t pos = 0;
  std::string carry;  // merged_with_next: a delimiter waiting for the following gap
  auto emit = [&](std::string piece) {
    if (!piece.empty()) out.push_back(std::move(piece));
  };
  for (size_t k = 0; k < matches.size(); ++k) {
    auto [b, e] = matches[k];
    std::string gap = text.substr(pos, b - pos);
    std::string delim = text.substr(b, e - b);
    switch (behavior) {
      case SplitBehavior::isolated:
        emit(std::move(gap));
        emit(std::move(delim));
        break;
      case SplitBehavior::removed:
        emit(std::move(gap));
        break;
      case SplitBehavior::merged_with_previous:
        emit(gap + delim);
        break;
      case SplitBehavior::merged_with_next:
        emit(carry + gap);
        carry = std::move(delim);
        break;
      case SplitBehavior::contiguous:
        emit(std::move(gap));
        if (b == pos && k > 0 && !out.empty() && matches[k - 1].second == b) {
          out.back() += delim;
        } else {
          emit(std::move(delim));
        }
        break;
    }
    pos = e;
  }
  emit(carry + text.substr(pos));
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

void apply_pre_step(const PreTokenizerStep& step, bool at_text_start, std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  out.reserve(pieces.size() * 2);
  for (size_t k = 0; k < pieces.size(); ++k) {
    std::string& piece = pieces[k];
    switch (step.kind) {
      case PreTokenizerStep::Kind::split:
        split_regex(*step.regex, step.behavior, piece, out);
        break;
      case PreTokenizerStep::Kind::byte_level:
        if (step.add_prefix_space && !piece.empty() && piece[0] != ' ') piece.insert(0, " ");
        if (step.regex) {
          split_regex(*step.regex, SplitBehavior::isolated, piece, out);
        } else {
          out.push_back(std::move(piece));
        }
        break;
      case PreTokenizerStep::Kind::metaspace: {
        replace_all(piece, " ", step.replacement);
        bool prepend = step.prepend == PrependScheme::always ||
                       (step.prepend == PrependScheme::first && at_text_start && k == 0);
        if (prepend && piece.compare(0, step.replacement.size(), step.replacement) != 0) {
          piece.insert(0, step.replacement);
        }
        if (step.metaspace_split) {
          size_t start = 0;
          for (size_t pos = piece.find(step.replacement, 1); pos != std::string::npos;
               pos = piece.find(step.replacement, pos + 1)) {
            out.push_back(piece.substr(start, pos - start));
            start = pos;
          }
          out.push_back(piece.substr(start));
        } else {
          out.push_back(std::move(piece));
        }
        break;
      }
    }
  }
  pieces = std::move(out);
}

// --- BPE --------------------------------------------------------------------------------

struct Symbol {
  int32_t id;
  int32_t prev, next;  // -1 at the ends
};

struct Candidate {
  int32_t rank, left, right, left_id, right_id, merged;
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;  // lowest rank, then leftmost
  }
};

void bpe_merge(const TokenizerData& d, std::vector<int32_t>& ids) {
  if (ids.size() < 2 || d.merges.empty()) return;
  std::vector<Symbol> sym(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    sym[i] = {ids[i], static_cast<int32_t>(i) - 1, i + 1 < ids.size() ? static_cast<int32_t>(i + 1) : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto try_push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(sym[left].id)) << 32) |
                   static_cast<uint32_t>(sym[right].id);
    auto it = d.merges.find(key);
    if (it == d.merges.end()) return;
    heap.push({it->second.rank, left, right, sym[left].id, sym[right].id, it->second.id});
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) try_push(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[c.left];
    if (l.id != c.left_id || l.next != c.right || sym[c.right].id != c.right_id) continue;  // stale
    Symbol& r = sym[c.right];
    l.id = c.merged;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    r.id = -1;
    try_push(l.prev, c.left);
    try_push(c.left, l.next);
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
}

// Initial symbols of a word, then merges. Appends to out.
void bpe_word(const TokenizerData& d, std::string_view word, std::vector<int32_t>& out) {
  std::vector<int32_t> ids;
  if (d.byte_level) {
    if (d.ignore_merges) {
      std::string mapped;
      for (unsigned char c : word) append_utf8(mapped, byte_to_codepoint()[c]);
      auto it = d.token_to_id.find(mapped);
      if (it != d.token_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    ids.reserve(word.size());
    for (unsigned char c : word) {
      int32_t id = d.byte_token[c] >= 0 ? d.byte_token[c] : d.unk_id;
      if (id < 0) continue;
      if (id == d.unk_id && d.fuse_unk && !ids.empty() && ids.back() == d.unk_id) continue;
      ids.push_back(id);
    }
  } else {
    if (d.ignore_merges) {
      auto it = d.token_to_id.find(word);
      if (it != d.token_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    ids.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      size_t n = utf8_char_len(word, i);
      auto it = d.token_to_id.find(word.substr(i, n));
      if (it != d.token_to_id.end()) {
        ids.push_back(it->second);
      } else {
        bool done = false;
        if (d.byte_fallback) {
          done = true;
          for (size_t k = 0; k < n; ++k) done = done && d.byte_token[static_cast<uint8_t>(word[i + k])] >= 0;
          if (done) {
            for (size_t k = 0; k < n; ++k) ids.push_back(d.byte_token[static_cast<uint8_t>(word[i + k])]);
          }
        }
        if (!done && d.unk_id >= 0 && !(d.fuse_unk && !ids.empty() && ids.back() == d.unk_id)) {
          ids.push_back(d.unk_id);
        }
      }
      i += n;
    }
  }
  bpe_merge(d, ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

void encode_word_cached(const TokenizerData& d, const std::string& word, std::vector<int32_t>& out) {
  bool cacheable = word.size() <= TokenizerData::k_cache_max_word_bytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(d.cache_mutex);
    auto it = d.cache.find(word);
    if (it != d.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  bpe_word(d, word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(d.cache_mutex);
    if (d.cache.size() >= TokenizerData::k_cache_max_entries) d.cache.clear();
    d.cache.emplace(word, std::vector<int32_t>(out.begin() + start, out.end()));
  }
}

void encode_segment(const TokenizerData& d, std::string_view segment, bool at_text_start,
                    std::vector<int32_t>& out) {
  std::string text(segment);
  for (const auto& n : d.normalizers) {
    if (n.kind == NormalizerStep::Kind::prepend) {
      if (!text.empty()) text.insert(0, n.to);
    } else {
      replace_all(text, n.from, n.to);
    }
  }
  if (text.empty()) return;
  std::vector<std::string> pieces{std::move(text)};
  for (const auto& step : d.pre_steps) apply_pre_step(step, at_text_start, pieces);
  for (const auto& p : pieces) {
    if (!p.empty()) encode_word_cached(d, p, out);
  }
}

}  // namespace

// --- Tokenizer ---------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const TokenizerData& d = *data_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), d.prefix_ids.begin(), d.prefix_ids.end());
  size_t seg_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    for (int32_t k : d.added_by_first_byte[static_cast<uint8_t>(text[i])]) {
      const std::string& c = d.added[k].content;
      if (text.compare(i, c.size(), c) == 0) {
        hit = &d.added[k];
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > seg_start) encode_segment(d, text.substr(seg_start, i - seg_start), seg_start == 0, out);
    out.push_back(hit->id);
    i += hit->content.size();
    seg_start = i;
  }
  if (seg_start < text.size()) encode_segment(d, text.substr(seg_start), seg_start == 0, out);
  if (add_special_tokens) out.insert(out.end(), d.suffix_ids.begin(), d.suffix_ids.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && data_->special[id]) continue;
    raw += data_->id_to_bytes[id];
  }
  size_t strip = 0;
  while (strip < static_cast<size_t>(data_->strip_leading_spaces) && strip < raw.size() && raw[strip] == ' ') ++strip;
  return utf8_sanitize(std::string_view(raw).substr(strip));
}

std::string Tokenizer::token_text(int32_t id) const {
  return id >= 0 && id < vocab_size() ? data_->id_to_token[id] : std::string();
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  static const std::string k_empty;
  return id >= 0 && id < vocab_size() ? data_->id_to_bytes[id] : k_empty;
}

int32_t Tokenizer::token_id(std::string_view token_text) const {
  auto it = data_->token_to_id.find(token_text);
  return it == data_->token_to_id.end() ? -1 : it->second;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && data_->special[id] != 0;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(data_->id_to_token.size()); }
int32_t Tokenizer::bos_id() const { return data_->bos_id; }
int32_t Tokenizer::eos_id() const { return data_->eos_id; }
std::vector<int32_t> Tokenizer::eos_ids() const { return data_->eos_ids; }
bool Tokenizer::strips_leading_space() const { return data_->strip_leading_spaces > 0; }

bool Tokenizer::add_bos() const {
  return data_->bos_id >= 0 && !data_->prefix_ids.empty() && data_->prefix_ids.front() == data_->bos_id;
}

// --- StreamDecoder -----------------------------------------------------------------------

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  std::string_view bytes = tokenizer_->token_bytes(id);
  if (bytes.empty()) return {};
  if (!started_) {
    started_ = true;
    if (tokenizer_->strips_leading_space() && bytes[0] == ' ') bytes.remove_prefix(1);
  }
  pending_.append(bytes);
  size_t held = 0;
  std::string out = utf8_sanitize(pending_, /*hold_incomplete_tail=*/true, &held);
  pending_.erase(0, pending_.size() - held);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace snap
