// Internal tables of a Tokenizer, shared by tokenizer.cpp (encode/decode) and
// tokenizer_load.cpp (from_json/from_gguf). Not part of the public interface.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "coordinator/tokenizer/tokenizer.h"

namespace snap {

// Heterogeneous lookup so string_views find std::string keys without allocating.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct CompiledRegex {
  pcre2_code* code = nullptr;
  ~CompiledRegex() { pcre2_code_free(code); }
};
// PCRE2 with UTF+UCP (so \p{L}, \s are Unicode-aware), MATCH_INVALID_UTF (bad bytes never
// match instead of failing the whole match) and JIT.
Result<std::shared_ptr<CompiledRegex>> compile_regex(const std::string& pattern, bool literal);

enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };
enum class PrependScheme { always, first, never };

struct PreTokenizerStep {
  enum class Kind { split, byte_level, metaspace } kind = Kind::split;
  std::shared_ptr<CompiledRegex> regex;  // split; byte_level when use_regex
  SplitBehavior behavior = SplitBehavior::isolated;
  bool add_prefix_space = false;         // byte_level
  std::string replacement = "\u2581";    // metaspace
  PrependScheme prepend = PrependScheme::always;
  bool metaspace_split = true;
};

struct NormalizerStep {
  enum class Kind { prepend, replace } kind = Kind::prepend;
  std::string from, to;  // prepend: to = prefix
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
};

struct MergeInfo {
  int32_t rank = 0;
  int32_t id = 0;  // the merged token
};

struct TokenizerData {
  std::vector<std::string> id_to_token;  // vocabulary strings as stored
  std::vector<std::string> id_to_bytes;  // what each token decodes to
  std::vector<uint8_t> special;          // 1 for special added tokens (skipped by decode)
  TokenMap token_to_id;
  std::unordered_map<uint64_t, MergeInfo> merges;  // key: left id << 32 | right id

  // Model
  bool byte_level = false;   // initial symbols are bytes mapped through the GPT-2 table
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  int32_t unk_id = -1;
  std::array<int32_t, 256> byte_token{};  // byte_level: token of each byte; else <0xNN> or -1

  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_steps;
  std::vector<AddedToken> added;
  std::array<std::vector<int32_t>, 256> added_by_first_byte;  // indices into added, longest first

  std::vector<int32_t> prefix_ids, suffix_ids;  // post-processor for add_special_tokens
  int strip_leading_spaces = 0;                 // decoder Strip / Metaspace dummy prefix

  int32_t bos_id = -1, eos_id = -1;
  std::vector<int32_t> eos_ids;

  // Word cache: pre-tokenized piece -> ids. Bounded; cleared when full.
  static constexpr size_t k_cache_max_entries = 1 << 16;
  static constexpr size_t k_cache_max_word_bytes = 128;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

  // After the tables are filled: id_to_bytes, added_by_first_byte, eos_ids.
  void finalize();
};

// GPT-2 byte <-> printable code point table.
const std::array<uint32_t, 256>& byte_to_codepoint();
void append_utf8(std::string& out, uint32_t cp);
// Length of the UTF-8 character starting at s[i] (1 for an invalid byte).
size_t utf8_char_len(std::string_view s, size_t i);

// Builder with access to Tokenizer's private members.
struct TokenizerBuilder {
  static Tokenizer make(std::shared_ptr<TokenizerData> data, std::string chat_template) {
    Tokenizer t;
    t.data_ = std::move(data);
    t.chat_template_ = std::move(chat_template);
    return t;
  }
};

}  // namespace snap
