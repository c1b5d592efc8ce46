// Tokenizer: byte-level BPE (GPT-2 / Llama-3 / Qwen2 / SmolLM2) and SentencePiece-style BPE
// with byte fallback (Llama-2 / Mistral), loaded from GGUF metadata or a Hugging Face
// tokenizer.json. Added/special tokens in the text are matched literally (longest first);
// ids equal the HF `tokenizers` reference. Immutable after loading; copies share the tables
// and encode/decode may be called from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "worker/model/gguf.h"

namespace snap {

struct TokenizerData;  // tables, pre-tokenizer pipeline, word cache (tokenizer_impl.h)

class Tokenizer {
 public:
  static Result<Tokenizer> from_gguf(const GgufFile& gguf);
  static Result<Tokenizer> from_json(const std::string& tokenizer_json_path);
  // A .gguf file -> from_gguf; a directory -> tokenizer.json plus, when present,
  // tokenizer_config.json (chat_template, bos_token, eos_token) and chat_template.jinja (which
  // wins over the config's template, as in transformers) or chat_template.json.
  static Result<Tokenizer> load_for_model(const std::string& model_path);

  // add_special_tokens adds what the file's post-processor / add_bos_token says (BOS...).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Invalid UTF-8 in the result (e.g. a cut multi-byte sequence) becomes U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;
  // The vocabulary string as stored (e.g. "Ġthe", "▁the", "<0x0A>"); "" when out of range.
  std::string token_text(int32_t id) const;
  // The raw bytes the token stands for in decoded text ("" for out-of-range ids).
  const std::string& token_bytes(int32_t id) const;
  int32_t token_id(std::string_view token_text) const;  // -1 when absent
  bool is_special(int32_t id) const;

  int64_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the tokenizer has none
  int32_t eos_id() const;  // -1 when the tokenizer has none
  // eos plus end-of-turn tokens that exist (<|im_end|>, <|eot_id|>, <|endoftext|>, ...).
  std::vector<int32_t> eos_ids() const;
  bool add_bos() const;
  // Decoding strips one leading space (SentencePiece dummy prefix).
  bool strips_leading_space() const;

  const std::string& chat_template_source() const { return chat_template_; }
  void set_chat_template(std::string source) { chat_template_ = std::move(source); }

 private:
  Tokenizer() = default;
  std::shared_ptr<const TokenizerData> data_;
  std::string chat_template_;
  friend struct TokenizerBuilder;
};

// Incremental detokenization for streaming: push() returns only complete UTF-8 text and
// holds back an incomplete multi-byte sequence; flush() returns the rest with an invalid
// tail replaced by U+FFFD. Never emits a broken UTF-8 sequence. Concatenated output equals
// Tokenizer::decode of the same ids.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  bool started_ = false;
  std::string pending_;  // bytes not yet returned: at most an incomplete UTF-8 sequence
};

// Replaces every maximal invalid UTF-8 subsequence with U+FFFD (the Unicode-recommended
// practice, as Rust's from_utf8_lossy). When hold_incomplete_tail, a trailing sequence
// that is a valid-but-unfinished prefix is left out of the result and its length is
// returned in *held.
std::string utf8_sanitize(std::string_view bytes, bool hold_incomplete_tail = false,
                          size_t* held = nullptr);

}  // namespace snap
