// Tokenizer loading: Hugging Face tokenizer.json (+ tokenizer_config.json) and GGUF
// tokenizer metadata (tokenizer.ggml.*). Every unsupported or malformed part is a one-line
// Status naming the file and the field; nothing here throws or aborts on bad input.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/tokenizer_impl.h"

namespace snap {

using nlohmann::json;

Result<std::shared_ptr<CompiledRegex>> compile_regex(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // PCRE2_LITERAL refuses PCRE2_UCP (which only changes how \d, \w and classes match).
  const uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? uint32_t{PCRE2_LITERAL} : uint32_t{PCRE2_UCP});
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &err_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return invalid_argument("regex '" + pattern + "' at offset " + std::to_string(err_offset) + ": " +
                            reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  auto re = std::make_shared<CompiledRegex>();
  re->code = code;
  return re;
}

namespace {

// Pre-tokenizer regexes (as in the HF tokenizer.json files of each family).
constexpr const char* k_gpt2_regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* k_llama3_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* k_qwen2_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Result<PreTokenizerStep> split_step(const std::string& pattern, bool literal, SplitBehavior behavior) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::split;
  step.behavior = behavior;
  SNAP_ASSIGN_OR_RETURN(step.regex, compile_regex(pattern, literal));
  return step;
}

Result<PreTokenizerStep> byte_level_step(bool add_prefix_space, bool use_regex) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::byte_level;
  step.add_prefix_space = add_prefix_space;
  if (use_regex) {
    SNAP_ASSIGN_OR_RETURN(step.regex, compile_regex(k_gpt2_regex, false));
  }
  return step;
}

// Fills byte_token, merges ranks -> ids; called once vocab and merges are known.
void fill_byte_tokens(TokenizerData& d) {
  for (int b = 0; b < 256; ++b) {
    std::string key;
    if (d.byte_level) {
      append_utf8(key, byte_to_codepoint()[b]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      key = buf;
    }
    auto it = d.token_to_id.find(key);
    d.byte_token[b] = it == d.token_to_id.end() ? -1 : it->second;
  }
}

Status add_merge(TokenizerData& d, const std::string& where, std::string_view a, std::string_view b,
                 int32_t rank) {
  auto ia = d.token_to_id.find(a);
  auto ib = d.token_to_id.find(b);
  std::string joined = std::string(a) + std::string(b);
  auto im = d.token_to_id.find(joined);
  if (ia == d.token_to_id.end() || ib == d.token_to_id.end() || im == d.token_to_id.end()) {
    return data_loss(where + ": merge " + std::to_string(rank) + " '" + std::string(a) + " " +
                     std::string(b) + "' uses a token missing from the vocabulary");
  }
  uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                 static_cast<uint32_t>(ib->second);
  d.merges.try_emplace(key, MergeInfo{rank, im->second});  // the first (lowest) rank wins
  return Status();
}

// --- tokenizer.json ----------------------------------------------------------------------

std::string json_str(const json& j, const char* key, const std::string& def = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : def;
}
bool json_bool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

Result<SplitBehavior> parse_behavior(const std::string& where, const std::string& s) {
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  return unimplemented(where + ": Split behavior '" + s + "' is not supported");
}

PrependScheme parse_prepend(const json& j) {
  std::string scheme = json_str(j, "prepend_scheme", "");
  if (scheme.empty()) return json_bool(j, "add_prefix_space", true) ? PrependScheme::always : PrependScheme::never;
  if (scheme == "first") return PrependScheme::first;
  if (scheme == "never") return PrependScheme::never;
  return PrependScheme::always;
}

Status parse_normalizer(const std::string& where, const json& j, TokenizerData& d) {
  if (j.is_null()) return Status();
  std::string type = json_str(j, "type");
  if (type == "Sequence") {
    for (const auto& n : j.value("normalizers", json::array())) SNAP_RETURN_IF_ERROR(parse_normalizer(where, n, d));
  } else if (type == "Prepend") {
    d.normalizers.push_back({NormalizerStep::Kind::prepend, "", json_str(j, "prepend")});
  } else if (type == "Replace") {
    const json& pat = j.value("pattern", json::object());
    if (!pat.contains("String") || !pat["String"].is_string()) {
      return unimplemented(where + ": normalizer Replace with a regex pattern is not supported");
    }
    d.normalizers.push_back({NormalizerStep::Kind::replace, pat["String"].get<std::string>(), json_str(j, "content")});
  } else if (type == "NFC") {
    // Treated as a no-op: NFC text (nearly all real input) is unchanged by it; decomposed
    // input may tokenize differently from the reference.
  } else {
    return unimplemented(where + ": normalizer '" + type + "' is not supported");
  }
  return Status();
}

Status parse_pre_tokenizer(const std::string& where, const json& j, TokenizerData& d) {
  if (j.is_null()) return Status();
  std::string type = json_str(j, "type");
  if (type == "Sequence") {
    for (const auto& p : j.value("pretokenizers", json::array())) SNAP_RETURN_IF_ERROR(parse_pre_tokenizer(where, p, d));
  } else if (type == "ByteLevel") {
    SNAP_ASSIGN_OR_RETURN(PreTokenizerStep step,
                          byte_level_step(json_bool(j, "add_prefix_space", false), json_bool(j, "use_regex", true)));
    d.pre_steps.push_back(std::move(step));
    d.byte_level = true;
  } else if (type == "Split") {
    if (json_bool(j, "invert", false)) return unimplemented(where + ": pre_tokenizer Split with invert=true is not supported");
    const json& pat = j.value("pattern", json::object());
    bool literal = pat.contains("String");
    const json& p = literal ? pat["String"] : pat.value("Regex", json());
    if (!p.is_string()) return data_loss(where + ": pre_tokenizer Split has no pattern");
    SNAP_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(where, json_str(j, "behavior", "Isolated")));
    auto step = split_step(p.get<std::string>(), literal, behavior);
    if (!step.ok()) return invalid_argument(where + ": " + step.status().message());
    d.pre_steps.push_back(std::move(step).value());
  } else if (type == "Digits") {
    bool individual = json_bool(j, "individual_digits", false);
    SNAP_ASSIGN_OR_RETURN(PreTokenizerStep step,
                          split_step(individual ? R"(\p{N})" : R"(\p{N}+)", false, SplitBehavior::isolated));
    d.pre_steps.push_back(std::move(step));
  } else if (type == "Metaspace") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::metaspace;
    step.replacement = json_str(j, "replacement", "\u2581");
    step.prepend = parse_prepend(j);
    step.metaspace_split = json_bool(j, "split", true);
    d.pre_steps.push_back(std::move(step));
  } else {
    return unimplemented(where + ": pre_tokenizer '" + type + "' is not supported");
  }
  return Status();
}

Status parse_decoder(const std::string& where, const json& j, TokenizerData& d) {
  if (j.is_null()) return Status();
  std::string type = json_str(j, "type");
  if (type == "Sequence") {
    for (const auto& p : j.value("decoders", json::array())) SNAP_RETURN_IF_ERROR(parse_decoder(where, p, d));
  } else if (type == "Strip") {
    if (json_str(j, "content", " ") != " " || j.value("stop", 0) != 0) {
      return unimplemented(where + ": decoder Strip other than leading spaces is not supported");
    }
    d.strip_leading_spaces = j.value("start", 0);
  } else if (type == "Metaspace") {
    if (parse_prepend(j) != PrependScheme::never) d.strip_leading_spaces = 1;
  } else if (type == "Replace") {
    const json& pat = j.value("pattern", json::object());
    if (pat.value("String", std::string()) != "\u2581" || json_str(j, "content") != " ") {
      return unimplemented(where + ": decoder Replace other than '\u2581' -> ' ' is not supported");
    }
  } else if (type != "ByteLevel" && type != "ByteFallback" && type != "Fuse") {
    // ByteLevel / ByteFallback / "▁" are handled by the per-token byte table (finalize()).
    return unimplemented(where + ": decoder '" + type + "' is not supported");
  }
  return Status();
}

Status parse_post_processor(const std::string& where, const json& j, TokenizerData& d) {
  if (j.is_null()) return Status();
  std::string type = json_str(j, "type");
  if (type == "Sequence") {
    for (const auto& p : j.value("processors", json::array())) SNAP_RETURN_IF_ERROR(parse_post_processor(where, p, d));
  } else if (type == "TemplateProcessing") {
    const json& specials = j.value("special_tokens", json::object());
    d.prefix_ids.clear();
    d.suffix_ids.clear();
    bool after = false;
    for (const auto& item : j.value("single", json::array())) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      std::string name = item.value("SpecialToken", json::object()).value("id", std::string());
      auto it = specials.find(name);
      if (it == specials.end() || !it->contains("ids")) {
        return data_loss(where + ": post_processor names special token '" + name + "' without ids");
      }
      for (const auto& id : (*it)["ids"]) (after ? d.suffix_ids : d.prefix_ids).push_back(id.get<int32_t>());
    }
  } else if (type != "ByteLevel") {
    return unimplemented(where + ": post_processor '" + type + "' is not supported");
  }
  return Status();
}

Result<json> read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found(path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return data_loss(path + ": not valid JSON");
  return j;
}

// The most token ids a tokenizer.json may use (the largest vocabularies we know hold 262,144).
constexpr int64_t k_max_vocab_ids = int64_t{1} << 24;

Status parse_tokenizer_json(const std::string& where, const json& j, TokenizerData& d) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    return data_loss(where + ": no 'model' object");
  }
  const json& m = j["model"];
  std::string type = json_str(m, "type", "BPE");
  if (type != "BPE") return unimplemented(where + ": model type '" + type + "' is not supported (only BPE)");
  if (!json_str(m, "continuing_subword_prefix").empty() || !json_str(m, "end_of_word_suffix").empty()) {
    return unimplemented(where + ": BPE continuing_subword_prefix/end_of_word_suffix are not supported");
  }
  if (!m.contains("vocab") || !m["vocab"].is_object()) return data_loss(where + ": model.vocab is not an object");

  int64_t size = 0;
  for (const auto& [tok, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= k_max_vocab_ids) {
      return data_loss(where + ": vocab entry '" + tok + "' has a bad id");
    }
    size = std::max(size, id.get<int64_t>() + 1);
  }
  const json added = j.value("added_tokens", json::array());
  for (const auto& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 || !a.contains("content")) {
      return data_loss(where + ": added_tokens entry without id/content");
    }
    if (a["id"].get<int64_t>() >= k_max_vocab_ids) return data_loss(where + ": added_tokens entry has a bad id");
    size = std::max(size, a["id"].get<int64_t>() + 1);
  }
  if (size == 0) return data_loss(where + ": empty vocabulary");
  // The ids index a table of size max id + 1: an id far beyond the number of tokens given
  // (fuzzing found 2,233,333,335: a 71 GB table) is a corrupt file, not a vocabulary.
  const int64_t entries = static_cast<int64_t>(m["vocab"].size() + added.size());
  if (size > 2 * entries + 1024) {
    return data_loss(where + ": vocabulary ids run to " + std::to_string(size - 1) + " for " + std::to_string(entries) +
                     " tokens (ids must be dense and below " + std::to_string(k_max_vocab_ids) + ")");
  }
  d.id_to_token.assign(size, std::string());
  d.special.assign(size, 0);
  for (const auto& [tok, id] : m["vocab"].items()) {
    d.id_to_token[id.get<int64_t>()] = tok;
    d.token_to_id[tok] = id.get<int32_t>();
  }
  for (const auto& a : added) {
    AddedToken t{a["content"].get<std::string>(), a["id"].get<int32_t>(), json_bool(a, "special", false)};
    d.id_to_token[t.id] = t.content;
    d.token_to_id[t.content] = t.id;
    d.special[t.id] = t.special;
    d.added.push_back(std::move(t));
  }

  d.byte_fallback = json_bool(m, "byte_fallback", false);
  d.fuse_unk = json_bool(m, "fuse_unk", false);
  d.ignore_merges = json_bool(m, "ignore_merges", false);
  std::string unk = json_str(m, "unk_token");
  if (!unk.empty()) {
    auto it = d.token_to_id.find(unk);
    if (it == d.token_to_id.end()) return data_loss(where + ": unk_token '" + unk + "' is not in the vocabulary");
    d.unk_id = it->second;
  }

  SNAP_RETURN_IF_ERROR(parse_normalizer(where, j.value("normalizer", json()), d));
  SNAP_RETURN_IF_ERROR(parse_pre_tokenizer(where, j.value("pre_tokenizer", json()), d));
  SNAP_RETURN_IF_ERROR(parse_decoder(where, j.value("decoder", json()), d));
  SNAP_RETURN_IF_ERROR(parse_post_processor(where, j.value("post_processor", json()), d));
  fill_byte_tokens(d);

  const json merges = m.value("merges", json::array());
  if (!merges.is_array()) return data_loss(where + ": model.merges is not an array");
  d.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ', 1);  // "a b"; a itself is never empty
      if (sp == std::string::npos) return data_loss(where + ": merge " + std::to_string(r) + " '" + s + "' has no space");
      SNAP_RETURN_IF_ERROR(add_merge(d, where, std::string_view(s).substr(0, sp),
                                     std::string_view(s).substr(sp + 1), static_cast<int32_t>(r)));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      SNAP_RETURN_IF_ERROR(add_merge(d, where, e[0].get<std::string>(), e[1].get<std::string>(), static_cast<int32_t>(r)));
    } else {
      return data_loss(where + ": merge " + std::to_string(r) + " is neither \"a b\" nor [a, b]");
    }
  }
  if (!d.prefix_ids.empty()) d.bos_id = d.prefix_ids.front();
  return Status();
}

int32_t find_token(const TokenizerData& d, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = d.token_to_id.find(std::string_view(n));
    if (it != d.token_to_id.end()) return it->second;
  }
  return -1;
}

// tokenizer_config.json's "bos_token"/"eos_token": a string or {"content": ...}.
std::string config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return json_str(*it, "content");
  return "";
}

// --- GGUF --------------------------------------------------------------------------------

Result<std::vector<PreTokenizerStep>> gguf_pre_steps(const std::string& where, const std::string& pre) {
  std::vector<PreTokenizerStep> steps;
  if (pre == "smollm") {
    // SmolLM2's tokenizer.json: Digits(individual_digits) then ByteLevel with the GPT-2 regex.
    SNAP_ASSIGN_OR_RETURN(PreTokenizerStep digits, split_step(R"(\p{N})", false, SplitBehavior::isolated));
    steps.push_back(std::move(digits));
    SNAP_ASSIGN_OR_RETURN(PreTokenizerStep bl, byte_level_step(false, true));
    steps.push_back(std::move(bl));
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "qwen2") {
    SNAP_ASSIGN_OR_RETURN(PreTokenizerStep split,
                          split_step(pre == "qwen2" ? k_qwen2_regex : k_llama3_regex, false, SplitBehavior::isolated));
    steps.push_back(std::move(split));
    SNAP_ASSIGN_OR_RETURN(PreTokenizerStep bl, byte_level_step(false, false));
    steps.push_back(std::move(bl));
  } else if (pre == "gpt2" || pre == "default" || pre.empty()) {
    SNAP_ASSIGN_OR_RETURN(PreTokenizerStep bl, byte_level_step(false, true));
    steps.push_back(std::move(bl));
  } else {
    return unimplemented(where + ": tokenizer.ggml.pre '" + pre +
                         "' is not supported (smollm, llama-bpe, llama3, qwen2, gpt2, default)");
  }
  return steps;
}

// SentencePiece vocabularies carry scores instead of merges: any adjacent pair whose
// concatenation is a (normal) token may merge, the higher-scored result first (as
// llama.cpp's SPM tokenizer). Expressed as a rank table so one BPE loop serves both.
void spm_merges_from_scores(TokenizerData& d, const std::vector<double>& scores, const std::vector<int64_t>& types) {
  std::vector<int32_t> order(d.id_to_token.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  for (size_t rank = 0; rank < order.size(); ++rank) {
    int32_t id = order[rank];
    if (types[id] != 1 && types[id] != 4) continue;
    const std::string& t = d.id_to_token[id];
    for (size_t k = utf8_char_len(t, 0); k < t.size(); k += utf8_char_len(t, k)) {
      auto ia = d.token_to_id.find(std::string_view(t).substr(0, k));
      auto ib = d.token_to_id.find(std::string_view(t).substr(k));
      if (ia == d.token_to_id.end() || ib == d.token_to_id.end()) continue;
      uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                     static_cast<uint32_t>(ib->second);
      d.merges.try_emplace(key, MergeInfo{static_cast<int32_t>(rank), id});
    }
  }
}

// A parsed tokenizer.json (Gemma 3's 33 MB file: ~230 MiB of small JSON nodes) or a GGUF's
// metadata is freed once the vocabulary is built, but glibc keeps freed heap in the process
// (a server's resident memory for good): hand it back to the system.
void release_freed_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// Parsed tokenizer.json with bos/eos guessed from the post-processor and common names;
// not yet finalized, so tokenizer_config.json may still adjust it.
Result<std::shared_ptr<TokenizerData>> load_json_data(const std::string& path) {
  auto d = std::make_shared<TokenizerData>();
  {
    SNAP_ASSIGN_OR_RETURN(json j, read_json(path));
    try {  // value()/get() throw on fields of the wrong JSON type
      SNAP_RETURN_IF_ERROR(parse_tokenizer_json(path, j, *d));
    } catch (const nlohmann::json::exception& e) {
      return data_loss(path + ": unexpected field type (" + std::string(e.what()) + ")");
    }
  }
  release_freed_heap();  // the parsed document
  if (d->bos_id < 0) d->bos_id = find_token(*d, {"<s>", "<|begin_of_text|>"});
  d->eos_id = find_token(*d, {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>"});
  return d;
}

}  // namespace

// --- public entry points -------------------------------------------------------------------

Result<Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json_path) {
  SNAP_ASSIGN_OR_RETURN(std::shared_ptr<TokenizerData> d, load_json_data(tokenizer_json_path));
  d->finalize();
  return TokenizerBuilder::make(std::move(d), "");
}

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  const std::string where = gguf.path();
  auto d = std::make_shared<TokenizerData>();
  SNAP_ASSIGN_OR_RETURN(std::string model, gguf.get_string("tokenizer.ggml.model"));
  SNAP_ASSIGN_OR_RETURN(d->id_to_token, gguf.get_string_array("tokenizer.ggml.tokens"));
  const size_t n = d->id_to_token.size();
  if (n == 0) return data_loss(where + ": tokenizer.ggml.tokens is empty");
  std::vector<int64_t> types(n, 1);
  if (gguf.find("tokenizer.ggml.token_type")) {
    SNAP_ASSIGN_OR_RETURN(types, gguf.get_int_array("tokenizer.ggml.token_type"));
    if (types.size() != n) return data_loss(where + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                                            " entries for " + std::to_string(n) + " tokens");
  }
  d->special.assign(n, 0);
  d->token_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    d->token_to_id.try_emplace(d->id_to_token[i], static_cast<int32_t>(i));
    // Unknown, control and user-defined tokens are matched literally in the text.
    if (types[i] == 2 || types[i] == 3 || types[i] == 4) {
      d->added.push_back({d->id_to_token[i], static_cast<int32_t>(i), types[i] != 4});
      d->special[i] = types[i] != 4;
    }
  }
  auto get_id = [&](const char* key) -> int32_t {
    auto v = gguf.get_int(key);
    return v.ok() && *v >= 0 && *v < static_cast<int64_t>(n) ? static_cast<int32_t>(*v) : -1;
  };
  d->bos_id = get_id("tokenizer.ggml.bos_token_id");
  d->eos_id = get_id("tokenizer.ggml.eos_token_id");
  d->unk_id = get_id("tokenizer.ggml.unknown_token_id");

  bool add_bos_default = false;
  if (model == "gpt2") {
    std::string pre = gguf.find("tokenizer.ggml.pre") ? gguf.get_string("tokenizer.ggml.pre").value() : "default";
    SNAP_ASSIGN_OR_RETURN(d->pre_steps, gguf_pre_steps(where, pre));
    d->byte_level = true;
    d->unk_id = -1;  // byte-level vocabularies cover every byte
    fill_byte_tokens(*d);
    SNAP_ASSIGN_OR_RETURN(std::vector<std::string> merges, gguf.get_string_array("tokenizer.ggml.merges"));
    d->merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
      size_t sp = merges[r].find(' ', 1);
      if (sp == std::string::npos) return data_loss(where + ": tokenizer.ggml.merges[" + std::to_string(r) + "] has no space");
      std::string_view s = merges[r];
      SNAP_RETURN_IF_ERROR(add_merge(*d, where, s.substr(0, sp), s.substr(sp + 1), static_cast<int32_t>(r)));
    }
  } else if (model == "llama") {
    // SentencePiece: "▁" for spaces, a dummy "▁" before each text segment, byte fallback.
    add_bos_default = true;
    bool space_prefix = true;
    if (gguf.find("tokenizer.ggml.add_space_prefix")) {
      SNAP_ASSIGN_OR_RETURN(space_prefix, gguf.get_bool("tokenizer.ggml.add_space_prefix"));
    }
    if (space_prefix) d->normalizers.push_back({NormalizerStep::Kind::prepend, "", "\u2581"});
    d->normalizers.push_back({NormalizerStep::Kind::replace, " ", "\u2581"});
    d->strip_leading_spaces = space_prefix ? 1 : 0;
    d->byte_fallback = true;
    d->fuse_unk = true;
    fill_byte_tokens(*d);
    SNAP_ASSIGN_OR_RETURN(std::vector<double> scores, gguf.get_float_array("tokenizer.ggml.scores"));
    if (scores.size() != n) return data_loss(where + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                                             " entries for " + std::to_string(n) + " tokens");
    spm_merges_from_scores(*d, scores, types);
  } else {
    return unimplemented(where + ": tokenizer.ggml.model '" + model + "' is not supported (gpt2, llama)");
  }

  bool add_bos = add_bos_default, add_eos = false;
  if (gguf.find("tokenizer.ggml.add_bos_token")) {
    SNAP_ASSIGN_OR_RETURN(add_bos, gguf.get_bool("tokenizer.ggml.add_bos_token"));
  }
  if (gguf.find("tokenizer.ggml.add_eos_token")) {
    SNAP_ASSIGN_OR_RETURN(add_eos, gguf.get_bool("tokenizer.ggml.add_eos_token"));
  }
  if (add_bos && d->bos_id >= 0) d->prefix_ids.push_back(d->bos_id);
  if (add_eos && d->eos_id >= 0) d->suffix_ids.push_back(d->eos_id);
  std::string chat_template;
  if (gguf.find("tokenizer.chat_template")) {
    SNAP_ASSIGN_OR_RETURN(chat_template, gguf.get_string("tokenizer.chat_template"));
  }
  d->finalize();
  return TokenizerBuilder::make(std::move(d), std::move(chat_template));
}

Result<Tokenizer> Tokenizer::load_for_model(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) {
    fs::path dir(model_path);
    SNAP_ASSIGN_OR_RETURN(std::shared_ptr<TokenizerData> d, load_json_data((dir / "tokenizer.json").string()));
    fs::path cfg_path = dir / "tokenizer_config.json";
    json cfg = json::object();
    if (fs::exists(cfg_path, ec)) {
      SNAP_ASSIGN_OR_RETURN(cfg, read_json(cfg_path.string()));
      if (!cfg.is_object()) return data_loss(cfg_path.string() + ": not a JSON object");
    }
    for (const char* key : {"bos_token", "eos_token"}) {
      std::string name = config_token(cfg, key);
      if (name.empty()) continue;
      int32_t id = find_token(*d, {name.c_str()});
      if (id < 0) return data_loss(cfg_path.string() + ": " + key + " '" + name + "' is not in the vocabulary");
      (std::string(key) == "bos_token" ? d->bos_id : d->eos_id) = id;
    }
    std::string chat_template;
    auto ct = cfg.find("chat_template");
    if (ct != cfg.end() && ct->is_string()) {
      chat_template = ct->get<std::string>();
    } else if (ct != cfg.end() && ct->is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const auto& e : *ct) {
        if (e.is_object() && json_str(e, "name") == "default") chat_template = json_str(e, "template");
      }
    }
    // transformers >= 4.47 saves the template beside the config, as chat_template.jinja (and
    // a processor's as chat_template.json); the .jinja file wins, as transformers loads it.
    const fs::path jinja = dir / "chat_template.jinja";
    const fs::path ct_json = dir / "chat_template.json";
    if (fs::exists(jinja, ec)) {
      std::ifstream in(jinja, std::ios::binary);
      if (!in) return not_found(jinja.string() + ": cannot open");
      chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } else if (chat_template.empty() && fs::exists(ct_json, ec)) {
      SNAP_ASSIGN_OR_RETURN(json j, read_json(ct_json.string()));
      if (!j.is_object() || !j.contains("chat_template") || !j["chat_template"].is_string())
        return data_loss(ct_json.string() + ": no 'chat_template' string");
      chat_template = j["chat_template"].get<std::string>();
    }
    d->finalize();
    return TokenizerBuilder::make(std::move(d), std::move(chat_template));
  }
  if (!fs::exists(model_path, ec)) return not_found(model_path + ": no such file or directory");
  Result<Tokenizer> tok = [&]() -> Result<Tokenizer> {
    SNAP_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(model_path));
    return from_gguf(gguf);
  }();
  release_freed_heap();  // the file's metadata
  return tok;
}

}  // namespace snap
