// The completion stream both engines share (coordinator/scheduler/token_stream.h): stop
// strings cut at the first match and a tail that may start one is held back, EOS and
// stop_token_ids stop, max_tokens and the context end with "length", and the final event
// carries the held-back tail and what stopped the completion. Driven through the byte-level
// BPE fixture tokenizer with one-hot logits, so every sampled token is chosen by the test.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/scheduler/token_stream.h"

namespace snap {
namespace {

const std::string k_fixtures = std::string(SNAP_SOURCE_DIR) + "/tests/fixtures/tokenizer";

const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    auto t = Tokenizer::load_for_model(k_fixtures + "/bytebpe");
    if (!t.ok()) ADD_FAILURE() << t.status().to_string();
    return std::move(t).value();
  }();
  return tok;
}

// One token per character of `text`, as the fixture's byte-level vocabulary has them.
std::vector<int32_t> char_tokens(const std::string& text) {
  std::vector<int32_t> ids;
  for (char ch : text) {
    const std::vector<int32_t> one = tokenizer().encode(std::string(1, ch), false);
    EXPECT_EQ(one.size(), 1u) << "'" << ch << "'";
    ids.push_back(one.at(0));
  }
  return ids;
}

struct Stream {
  TokenStream s;
  std::vector<EngineEvent> events;
  std::vector<int32_t> eos = {0};
  EmitContext c;

  explicit Stream(EngineRequest req, int64_t context = 1000) {
    s.req = std::move(req);
    s.decoder = std::make_unique<StreamDecoder>(tokenizer(), true);
    s.logits.assign(static_cast<size_t>(tokenizer().vocab_size()), 0.0f);
    s.sink = [this](const EngineEvent& e) { events.push_back(e); };
    c.vocab = tokenizer().vocab_size();
    c.context = context;
    c.eos = &eos;
    s.choice = 3;  // the events carry the stream's choice
  }
  // Makes `id` the argmax and emits it.
  void emit(int32_t id) {
    std::fill(s.logits.begin(), s.logits.end(), 0.0f);
    s.logits.at(static_cast<size_t>(id)) = 10.0f;
    sample_and_emit(s, c);
  }
  // Emits `ids` until the stream is done; returns how many it took.
  size_t emit_all(const std::vector<int32_t>& ids) {
    size_t n = 0;
    for (int32_t id : ids) {
      if (!s.done_reason.empty()) break;
      emit(id);
      ++n;
    }
    return n;
  }
  std::string streamed() const {
    std::string t;
    for (const EngineEvent& e : events) t += e.text;
    return t;
  }
};

EngineRequest request(int64_t max_tokens, std::vector<std::string> stop = {}) {
  EngineRequest r;
  r.prompt_ids = {1, 2, 3};
  r.max_tokens = max_tokens;
  r.stop = std::move(stop);
  return r;
}

TEST(TokenStream, FirstStopIsTheEarliestAndTheFirstListedOnATie) {
  std::string matched;
  EXPECT_EQ(first_stop("abcdef", {"de", "bc"}, &matched), 1u);
  EXPECT_EQ(matched, "bc");
  EXPECT_EQ(first_stop("abcdef", {"cd", "c"}, &matched), 2u);
  EXPECT_EQ(matched, "cd");
  EXPECT_EQ(first_stop("abcdef", {"", "x"}, nullptr), std::string::npos);
}

TEST(TokenStream, HoldsTheLongestTailThatMayStartAStopString) {
  EXPECT_EQ(stop_prefix_hold("hello wor", {"world"}), 3u);
  EXPECT_EQ(stop_prefix_hold("hello wor", {"or!", "world"}), 3u);
  EXPECT_EQ(stop_prefix_hold("hello", {"xyz"}), 0u);
  EXPECT_EQ(stop_prefix_hold("hello", {""}), 0u);
  // A whole stop string is not a proper prefix: first_stop's business, not the hold's.
  EXPECT_EQ(stop_prefix_hold("ab", {"ab"}), 0u);
  // A prefix that cuts inside a UTF-8 character holds the whole character.
  EXPECT_EQ(stop_prefix_hold("ab\xC3\xA9", {"\xA9x"}), 2u);
}

TEST(TokenStream, StopStringCutsAndTheHeldTailIsNotStreamed) {
  Stream r(request(100, {"lo w"}));
  const size_t n = r.emit_all(char_tokens("hello world"));
  EXPECT_EQ(n, 7u);  // "hello w" completes the stop string
  EXPECT_EQ(r.s.done_reason, "stop");
  EXPECT_TRUE(r.s.stopped_by_string);
  EXPECT_EQ(r.s.stop_string, "lo w");
  EXPECT_EQ(r.streamed(), "hel");
  // The first "l" (a prefix of "lo w") is held back, then released by the second.
  ASSERT_EQ(r.events.size(), 7u);
  EXPECT_EQ(r.events[2].text, "");
  EXPECT_EQ(r.events[3].text, "l");
  for (const EngineEvent& e : r.events) {
    EXPECT_EQ(e.kind, EngineEvent::Kind::token);
    EXPECT_EQ(e.index, 3);
  }
  EngineEvent fin;
  finish_stream(r.s, "stop", &fin);
  EXPECT_EQ(fin.kind, EngineEvent::Kind::finished);
  EXPECT_EQ(fin.text, "");
  EXPECT_EQ(fin.stop_string, "lo w");
  EXPECT_EQ(fin.completion_tokens, 7);
  EXPECT_EQ(fin.prompt_tokens, 3);
}

TEST(TokenStream, AHeldTailThatNeverCompletesComesWithTheFinalEvent) {
  Stream r(request(5, {"lo!"}));
  r.emit_all(char_tokens("hello"));
  EXPECT_EQ(r.s.done_reason, "length");
  EXPECT_EQ(r.streamed(), "hel");  // "lo" may still start "lo!"
  EngineEvent fin;
  finish_stream(r.s, r.s.done_reason, &fin);
  EXPECT_EQ(fin.finish_reason, "length");
  EXPECT_EQ(fin.text, "lo");
  EXPECT_EQ(fin.stop_string, "");
}

TEST(TokenStream, EosAndStopTokenIdsStopWithoutText) {
  Stream r(request(100));
  r.s.req.stop_token_ids = {char_tokens("q")[0]};
  r.emit_all(char_tokens("abq"));
  EXPECT_EQ(r.s.done_reason, "stop");
  EXPECT_EQ(r.s.stop_token_id, char_tokens("q")[0]);
  ASSERT_EQ(r.events.size(), 3u);
  EXPECT_TRUE(r.events[2].stop_token);
  EXPECT_EQ(r.events[2].text, "");
  EXPECT_EQ(r.streamed(), "ab");

  Stream e(request(100));
  e.emit_all({char_tokens("a")[0], 0, char_tokens("b")[0]});
  EXPECT_EQ(e.s.done_reason, "stop");
  EXPECT_EQ(e.s.stop_token_id, -1);  // EOS, not a stop_token_ids entry
  EXPECT_EQ(e.events.size(), 2u);

  Stream ignore(request(3));
  ignore.s.req.ignore_eos = true;
  EXPECT_EQ(ignore.emit_all({0, 0, 0, 0}), 3u);
  EXPECT_EQ(ignore.s.done_reason, "length");
}

TEST(TokenStream, TheContextEndsTheCompletion) {
  Stream r(request(100), /*context=*/5);  // 3 prompt tokens: room for 2
  EXPECT_EQ(r.emit_all(char_tokens("abcdef")), 2u);
  EXPECT_EQ(r.s.done_reason, "length");
  EXPECT_EQ(r.s.next_token, char_tokens("a")[0]);  // the last fed token; "b" never is
}

TEST(TokenStream, AStopStringCompletedByTheFlushStillCuts) {
  Stream r(request(3, {"bc"}));
  r.emit_all(char_tokens("ab"));
  EXPECT_EQ(r.streamed(), "a");
  r.s.text += "c";  // as if the decoder's last bytes finished the stop string
  EngineEvent fin;
  finish_stream(r.s, "length", &fin);
  EXPECT_EQ(fin.finish_reason, "stop");
  EXPECT_EQ(fin.text, "");
  EXPECT_EQ(fin.stop_string, "bc");
}

TEST(TokenStream, AnErrorCarriesNoHeldText) {
  Stream r(request(10, {"lo!"}));
  r.emit_all(char_tokens("hello"));
  r.s.error = internal_error("boom");
  EngineEvent fin;
  finish_stream(r.s, "error", &fin);
  EXPECT_EQ(fin.finish_reason, "error");
  EXPECT_EQ(fin.text, "");
  EXPECT_FALSE(fin.error.ok());
}

}  // namespace
}  // namespace snap
