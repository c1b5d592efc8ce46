// Tokenizer tests against references written by tools/gen_tokenizer_fixture.py (HF
// `tokenizers` / transformers): exact ids for every text and tokenizer, decode, streaming
// decode that never emits broken UTF-8, invalid input, chat templates, and load errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "coordinator/tokenizer/chat_template.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "worker/model/gguf.h"

namespace snap {
namespace {

using nlohmann::json;

const std::string k_fixtures = std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/tokenizer";

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

const json& texts() {
  static const json j = read_json(k_fixtures + "/texts.json");
  return j;
}
const json& expected() {
  static const json j = read_json(k_fixtures + "/expected.json");
  return j;
}

std::string model_path() {
  const char* env = std::getenv("SNAP_MODEL");
  if (env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

Tokenizer load_smollm2() {
  std::string path = model_path();
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "default model not found at " << path << " (set SNAP_MODEL)";
  }
  auto gguf = GgufFile::open(path);
  CHECK(gguf.ok()) << gguf.status().to_string();
  auto tok = Tokenizer::from_gguf(*gguf);
  CHECK(tok.ok()) << tok.status().to_string();
  return std::move(tok).value();
}

Tokenizer load_dir(const std::string& name) {
  auto tok = Tokenizer::load_for_model(k_fixtures + "/" + name);
  CHECK(tok.ok()) << tok.status().to_string();
  return std::move(tok).value();
}

Tokenizer load_spm_gguf() {
  auto gguf = GgufFile::open(k_fixtures + "/spm.gguf");
  CHECK(gguf.ok()) << gguf.status().to_string();
  auto tok = Tokenizer::from_gguf(*gguf);
  CHECK(tok.ok()) << tok.status().to_string();
  return std::move(tok).value();
}

std::string show_tokens(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t from) {
  std::string s;
  for (size_t i = from; i < ids.size() && i < from + 6; ++i) {
    s += std::to_string(ids[i]) + "'" + tok.token_text(ids[i]) + "' ";
  }
  return s;
}

void expect_same_ids(const Tokenizer& tok, const std::vector<int32_t>& got, const json& want_json,
                     const std::string& what) {
  auto want = want_json.get<std::vector<int32_t>>();
  if (got == want) return;
  size_t pos = 0;
  while (pos < got.size() && pos < want.size() && got[pos] == want[pos]) ++pos;
  ADD_FAILURE() << what << ": first mismatch at token " << pos << " (got " << got.size() << " tokens, want "
                << want.size() << ")\n  got:  " << show_tokens(tok, got, pos)
                << "\n  want: " << show_tokens(tok, want, pos);
}

// ids with and without special tokens, and decode, for every text of the set.
void check_reference(const Tokenizer& tok, const std::string& name) {
  const json& ref = expected()[name];
  const json& t = texts()["texts"];
  ASSERT_EQ(ref["ids"].size(), t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    std::string text = t[i].get<std::string>();
    std::string what = name + " text " + std::to_string(i) + " " + json(text).dump();
    auto ids = tok.encode(text, true);
    expect_same_ids(tok, ids, ref["ids"][i], what + " (add_special_tokens)");
    expect_same_ids(tok, tok.encode(text, false), ref["ids_no_special"][i], what);
    EXPECT_EQ(tok.decode(ref["ids"][i].get<std::vector<int32_t>>(), false), ref["decoded"][i].get<std::string>())
        << what;
  }
}

TEST(Tokenizer, SmolLM2GgufMatchesReference) {
  Tokenizer tok = load_smollm2();
  EXPECT_EQ(tok.vocab_size(), 49152);
  check_reference(tok, "smollm2_gguf");
}

TEST(Tokenizer, SmolLM2LongTextMatchesReference) {
  Tokenizer tok = load_smollm2();
  std::string text = texts()["long_text"].get<std::string>();
  auto ids = tok.encode(text, false);
  EXPECT_GT(ids.size(), 7000u);
  expect_same_ids(tok, ids, expected()["smollm2_gguf"]["long_ids"], "long text");
  EXPECT_EQ(tok.decode(ids, false), text);
}

TEST(Tokenizer, ByteLevelJsonMatchesReference) { check_reference(load_dir("bytebpe"), "bytebpe"); }
TEST(Tokenizer, SentencePieceJsonMatchesReference) { check_reference(load_dir("spm"), "spm"); }
TEST(Tokenizer, MetaspaceJsonMatchesReference) { check_reference(load_dir("spm_metaspace"), "spm_metaspace"); }
// Gemma 3's tokenizer.json pipeline: a literal Split(" ") pre-tokenizer, no Prepend.
TEST(Tokenizer, GemmaPipelineJsonMatchesReference) { check_reference(load_dir("spm_gemma"), "spm_gemma"); }
// The same vocabulary as spm/tokenizer.json, as GGUF scores without merges.
TEST(Tokenizer, SentencePieceGgufMatchesReference) { check_reference(load_spm_gguf(), "spm"); }

TEST(Tokenizer, SpecialIdsAndFlags) {
  Tokenizer smol = load_smollm2();
  EXPECT_EQ(smol.bos_id(), 1);
  EXPECT_FALSE(smol.add_bos());
  auto eos = smol.eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), smol.token_id("<|im_end|>")), eos.end());
  EXPECT_NE(std::find(eos.begin(), eos.end(), smol.token_id("<|endoftext|>")), eos.end());
  EXPECT_EQ(smol.encode("<|im_start|>", false), std::vector<int32_t>{smol.token_id("<|im_start|>")});

  Tokenizer llama3 = load_dir("bytebpe");
  EXPECT_TRUE(llama3.add_bos());
  EXPECT_EQ(llama3.token_text(llama3.bos_id()), "<|begin_of_text|>");
  EXPECT_EQ(llama3.token_text(llama3.eos_id()), "<|end_of_text|>");
  eos = llama3.eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), llama3.token_id("<|eot_id|>")), eos.end());

  Tokenizer spm = load_spm_gguf();
  EXPECT_TRUE(spm.add_bos());
  EXPECT_EQ(spm.token_text(spm.bos_id()), "<s>");
  EXPECT_EQ(spm.eos_ids(), std::vector<int32_t>{spm.token_id("</s>")});
}

TEST(Tokenizer, DecodeEncodeRoundTrips) {
  struct Case {
    std::string name;
    Tokenizer tok;
  };
  std::vector<Case> cases;
  cases.push_back({"smollm2_gguf", load_smollm2()});
  cases.push_back({"bytebpe", load_dir("bytebpe")});
  cases.push_back({"spm", load_dir("spm")});
  cases.push_back({"spm_metaspace", load_dir("spm_metaspace")});
  const json& t = texts()["texts"];
  for (const auto& c : cases) {
    int checked = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      if (!expected()[c.name]["round_trips"][i].get<bool>()) continue;
      std::string text = t[i].get<std::string>();
      EXPECT_EQ(c.tok.decode(c.tok.encode(text, false), false), text) << c.name << " text " << i;
      ++checked;
    }
    EXPECT_GT(checked, 10) << c.name;
  }
}

bool valid_utf8(const std::string& s) { return utf8_sanitize(s) == s; }

TEST(Tokenizer, StreamDecoderNeverEmitsBrokenUtf8) {
  std::vector<std::pair<std::string, Tokenizer>> toks;
  toks.emplace_back("smollm2", load_smollm2());
  toks.emplace_back("spm", load_spm_gguf());
  const json& t = texts()["texts"];
  int held_back = 0;
  for (const auto& [name, tok] : toks) {
    for (size_t i = 0; i < t.size(); ++i) {
      std::string text = t[i].get<std::string>();
      for (bool skip : {false, true}) {
        auto ids = tok.encode(text, true);
        StreamDecoder stream(tok, skip);
        std::string all;
        for (int32_t id : ids) {
          std::string chunk = stream.push(id);
          EXPECT_TRUE(valid_utf8(chunk)) << name << " text " << i << ": chunk " << json(chunk).dump();
          if (chunk.empty() && !tok.token_bytes(id).empty() && !(skip && tok.is_special(id))) ++held_back;
          all += chunk;
        }
        all += stream.flush();
        EXPECT_EQ(all, tok.decode(ids, skip)) << name << " text " << i << " skip_special " << skip;
      }
    }
  }
  // Emoji and CJK split across byte tokens must have made the decoder wait.
  EXPECT_GT(held_back, 5);
}

TEST(Tokenizer, StreamDecoderFlushReplacesCutSequence) {
  Tokenizer tok = load_spm_gguf();
  StreamDecoder stream(tok, true);
  // "€" is E2 82 AC; stop after two bytes.
  EXPECT_EQ(stream.push(tok.token_id("<0x41>")), "A");
  EXPECT_EQ(stream.push(tok.token_id("<0xE2>")), "");
  EXPECT_EQ(stream.push(tok.token_id("<0x82>")), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.flush(), "");
}

TEST(Tokenizer, Utf8SanitizeReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(utf8_sanitize("abc"), "abc");
  EXPECT_EQ(utf8_sanitize("a\xE2\x82"), "a\xEF\xBF\xBD");           // cut sequence: one U+FFFD
  EXPECT_EQ(utf8_sanitize("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // two invalid bytes
  EXPECT_EQ(utf8_sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(utf8_sanitize("\xED\xA0\x80x"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDx");  // surrogate
  size_t held = 0;
  EXPECT_EQ(utf8_sanitize("ok\xF0\x9F\x98", true, &held), "ok");
  EXPECT_EQ(held, 3u);
}

TEST(Tokenizer, InvalidUtf8InputDoesNotCrash) {
  const std::vector<std::string> bad = {"\xFF\xFE abc", "caf\xC3", "\xE2\x82 euro", "\xED\xA0\x80",
                                        "\xC0\xAF<|im_start|>\x80", std::string("nul\0byte", 8)};
  Tokenizer smol = load_smollm2();
  Tokenizer spm = load_spm_gguf();
  Tokenizer bytebpe = load_dir("bytebpe");
  for (const auto& s : bad) {
    // A byte-level BPE with all 256 byte tokens is lossless on any bytes.
    std::string raw;
    for (int32_t id : bytebpe.encode(s, false)) raw += bytebpe.token_bytes(id);
    EXPECT_EQ(raw, s);
    // SmolLM2's vocabulary lacks the bytes that never occur in UTF-8 (0xC0, 0xF5..0xFF, ...):
    // those are dropped, as HF tokenizers does without an unk token.
    for (const Tokenizer* tok : {&smol, &spm}) {
      auto ids = tok->encode(s, false);
      EXPECT_FALSE(ids.empty());
      for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < tok->vocab_size());
      EXPECT_TRUE(valid_utf8(tok->decode(ids, false)));
    }
  }
}

TEST(ChatTemplate, MatchesTransformersRendering) {
  Tokenizer smol = load_smollm2();
  Tokenizer bytebpe = load_dir("bytebpe");
  Tokenizer spm = load_dir("spm");
  int checked = 0;
  for (const auto& c : expected()["chat"]) {
    std::string family = c["family"].get<std::string>();
    Tokenizer tok = family == "smollm2" ? smol : (family == "mistral" || family == "llama2") ? spm : bytebpe;
    if (family == "smollm2") {
      EXPECT_EQ(tok.chat_template_source(), c["template"].get<std::string>());  // read from the GGUF
    } else {
      tok.set_chat_template(c["template"].get<std::string>());
    }
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    auto out = apply_chat_template(tok, messages, c["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << family;
    ++checked;
  }
  EXPECT_EQ(checked, 14);
}

// transformers >= 4.47 saves the template as chat_template.jinja beside tokenizer_config.json
// (a processor's as chat_template.json); the .jinja file wins over the config's, as there.
TEST(ChatTemplate, TemplateFilesBesideTheConfig) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("snap_chat_template_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(k_fixtures + "/bytebpe/tokenizer.json", dir / "tokenizer.json");
  fs::copy_file(k_fixtures + "/bytebpe/tokenizer_config.json", dir / "tokenizer_config.json");
  const std::string mistral = load_dir("spm").chat_template_source();
  ASSERT_EQ(chat_family(mistral), ChatFamily::mistral);
  EXPECT_EQ(chat_family(Tokenizer::load_for_model(dir.string())->chat_template_source()), ChatFamily::llama3);
  {
    std::ofstream(dir / "chat_template.json") << json{{"chat_template", mistral}}.dump();
  }
  // The config's own template comes before a processor's chat_template.json...
  EXPECT_EQ(chat_family(Tokenizer::load_for_model(dir.string())->chat_template_source()), ChatFamily::llama3);
  {
    std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<|begin_of_text|>"})";
  }
  // ...which is used when the config has none;
  EXPECT_EQ(Tokenizer::load_for_model(dir.string())->chat_template_source(), mistral);
  {
    std::ofstream(dir / "chat_template.jinja") << "{{ bos_token }}" << mistral.substr(15);
    std::ofstream(dir / "tokenizer_config.json") << read_json(k_fixtures + "/bytebpe/tokenizer_config.json").dump();
  }
  // chat_template.jinja wins over both.
  auto tok = Tokenizer::load_for_model(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->chat_template_source(), "{{ bos_token }}" + mistral.substr(15));
  {
    std::ofstream(dir / "chat_template.json") << "{\"chat_template\": 7}";
    fs::remove(dir / "chat_template.jinja");
    std::ofstream(dir / "tokenizer_config.json") << "{}";
  }
  auto bad = Tokenizer::load_for_model(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), (dir / "chat_template.json").string() + ": no 'chat_template' string");
  fs::remove_all(dir);
}

TEST(ChatTemplate, TemplatesFromTheModelFiles) {
  EXPECT_EQ(chat_family(load_dir("bytebpe").chat_template_source()), ChatFamily::llama3);
  EXPECT_EQ(chat_family(load_dir("spm").chat_template_source()), ChatFamily::mistral);
  EXPECT_EQ(chat_family(load_spm_gguf().chat_template_source()), ChatFamily::mistral);
  Tokenizer spm = load_dir("spm");
  auto bad = apply_chat_template(spm, {{"user", "a"}, {"user", "b"}}, true);
  EXPECT_FALSE(bad.ok());
  // Unknown template: ChatML without a default system message.
  Tokenizer smol = load_smollm2();
  smol.set_chat_template("");
  auto out = apply_chat_template(smol, {{"user", "hi"}}, true);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

// --- load errors -------------------------------------------------------------------------

std::string write_temp(const std::string& name, const std::string& content) {
  auto dir = std::filesystem::temp_directory_path() / ("snap_tok_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream(path) << content;
  return path;
}

void expect_one_line_error(const Result<Tokenizer>& r, StatusCode code, const std::string& must_contain) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(must_contain), std::string::npos) << r.status().message();
}

TEST(Tokenizer, BadFilesGiveOneLineStatus) {
  expect_one_line_error(Tokenizer::from_json("/nonexistent/tokenizer.json"), StatusCode::k_not_found,
                        "/nonexistent/tokenizer.json");
  expect_one_line_error(Tokenizer::load_for_model("/nonexistent/model"), StatusCode::k_not_found, "/nonexistent/model");
  std::string garbled = write_temp("garbled.json", "{\"model\": {\"vocab\": [1, 2");
  expect_one_line_error(Tokenizer::from_json(garbled), StatusCode::k_data_loss, garbled);
  std::string no_model = write_temp("no_model.json", "{\"version\": \"1.0\"}");
  expect_one_line_error(Tokenizer::from_json(no_model), StatusCode::k_data_loss, "model");
  std::string unigram = write_temp("unigram.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  expect_one_line_error(Tokenizer::from_json(unigram), StatusCode::k_unimplemented, "Unigram");
  std::string wrong_type = write_temp(
      "wrong_type.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "Strip", "start": "x"}})");
  expect_one_line_error(Tokenizer::from_json(wrong_type), StatusCode::k_data_loss, "wrong_type.json");
  std::string bad_merge = write_temp(
      "bad_merge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})");
  expect_one_line_error(Tokenizer::from_json(bad_merge), StatusCode::k_data_loss, "merge 0");
  std::string bad_regex = write_temp(
      "bad_regex.json",
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})");
  expect_one_line_error(Tokenizer::from_json(bad_regex), StatusCode::k_invalid_argument, "(unclosed");
}

}  // namespace
}  // namespace snap
