// `snapserve serve` as a client sees it: the real binary on a free loopback port, spoken to
// over real HTTP (a small Beast client). Completions and chat, streamed and not, agree;
// 16 concurrent streams with different KV policies equal the same requests run alone
// (greedy); every bad input gets its 4xx and the server keeps serving; a full queue gives
// 429; a vanished client's blocks are freed; SIGTERM stops the server cleanly with exit 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <numeric>
#include <cstring>
#include <cmath>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/snapserve_binary.h"
#include "coordinator/engine/prompt.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/e2e/http_client.h"
#include "tests/e2e/logits_dump_file.h"
#include "tests/e2e/server_process.h"
#include "tests/prom_text.h"

namespace snap {
namespace {

namespace fs = std::filesystem;
namespace http = snap::testing::http;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string model_path() {
  if (const char* m = std::getenv("SNAP_MODEL")) return m;
  return std::string(std::getenv("HOME")) + "/.cache/snapserve/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// --- the server process ------------------------------------------------------------

// `snapserve serve` on a free port with the suite's limits, plus `extra` flags.
// env: NAME=VALUE settings for the server process alone (through env(1)).
class ServerProcess : public snap::testing::ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& extra, const std::vector<std::string>& env = {})
      : snap::testing::ServerProcess(command(extra, env)) {}

 private:
  static std::vector<std::string> command(const std::vector<std::string>& extra, const std::vector<std::string>& env) {
    std::vector<std::string> args;
    if (!env.empty()) {
      args.push_back("env");
      args.insert(args.end(), env.begin(), env.end());
    }
    args.insert(args.end(), {snapserve_binary(), "serve", "--model", model_path(),
                                     "--port", "0", "--threads", "2", "--read-timeout", "2",
                                     "--max-model-len", "1024", "--shutdown-timeout", "2"});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

// Where a sanitizer's report starts in a server's log (the start of its first line), or npos.
size_t sanitizer_report_at(const std::string& log) {
  for (const char* mark : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"}) {
    const size_t at = log.find(mark);
    if (at == std::string::npos) continue;
    const size_t line = log.rfind('\n', at);
    return line == std::string::npos ? 0 : line + 1;
  }
  return std::string::npos;
}

// What a failing test prints of a server's log: a sanitizer's report from its first line
// (what was freed twice, and where, comes first), else the log's last 4000 bytes.
std::string log_excerpt(const std::string& log) {
  if (const size_t from = sanitizer_report_at(log); from != std::string::npos) {
    return "its sanitizer report:\n" + log.substr(from, 12000);
  }
  return "the last of its log:\n" + log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
}

// --- a small HTTP client (tests/e2e/http_client.h) ----------------------------------

using snap::testing::call;
using snap::testing::post;
using snap::testing::raw_post;
using snap::testing::RawConn;
using snap::testing::Reply;

// The "data:" payloads of an SSE body, in order.
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end == std::string::npos ? std::string::npos : end - pos - 6));
    if (end == std::string::npos) break;
    pos = end + 2;
  }
  return out;
}

struct Streamed {
  std::string text;
  std::string finish_reason;
  json usage;
  bool saw_role = false;
  bool done = false;
  std::string problem;
};

Streamed collect_stream(const Reply& r, bool chat) {
  Streamed s;
  if (r.status != 200) {
    s.problem = "status " + std::to_string(r.status) + " " + r.error + " " + r.body;
    return s;
  }
  const auto payloads = sse_payloads(r.body);
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (payloads[i] == "[DONE]") {
      s.done = i + 1 == payloads.size();
      break;
    }
    const json c = json::parse(payloads[i], nullptr, false);
    if (c.is_discarded() || !c.contains("choices")) {
      s.problem = "bad chunk: " + payloads[i];
      return s;
    }
    if (c.contains("usage")) s.usage = c["usage"];
    if (c["choices"].empty()) continue;
    const json& ch = c["choices"][0];
    if (chat) {
      if (ch["delta"].contains("role")) s.saw_role = true;
      if (ch["delta"].contains("content")) s.text += ch["delta"]["content"].get<std::string>();
    } else {
      s.text += ch["text"].get<std::string>();
    }
    if (!ch["finish_reason"].is_null()) s.finish_reason = ch["finish_reason"];
  }
  return s;
}

// A value from the Prometheus text: the line "key value" (key with its labels).
double metric(int port, const std::string& key) {
  const Reply r = call(port, http::verb::get, "/metrics");
  if (r.status != 200) return std::nan("");
  return snap::testing::prom_value(r.body, key);
}

// Polls until running requests and KV usage are both zero, or the time is up.
bool wait_until_idle(int port, double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    if (metric(port, "snapserve_num_requests_running") == 0 && metric(port, "snapserve_kv_cache_usage_ratio") == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// --- the shared server (one model load for most tests) -----------------------------

class Server : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path()
                                          << " (run scripts/setup.sh or set SNAP_MODEL)";
    server_ = new ServerProcess({});
    auto tok = Tokenizer::load_for_model(model_path());
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tokenizer_ = new Tokenizer(std::move(tok).value());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete tokenizer_;
    server_ = nullptr;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(server_->port(), 0) << server_->log();
    port_ = server_->port();
  }
  // A failed case says whether the shared server is still running and what it last printed:
  // a server that died or stopped answering fails every later case of the suite too.
  void TearDown() override {
    if (!HasFailure() || server_ == nullptr) return;
    // A sanitizer that found something may still be writing its report: give it time.
    const bool report = sanitizer_report_at(server_->log()) != std::string::npos;
    const int exited = server_->wait(report ? 60 : 0);
    std::printf("shared server %s; %s\n", exited < 0 ? "still running" : ("exited with " + std::to_string(exited)).c_str(),
                log_excerpt(server_->log()).c_str());
  }
  static ServerProcess* server_;
  static Tokenizer* tokenizer_;
  int port_ = 0;
};
ServerProcess* Server::server_ = nullptr;
Tokenizer* Server::tokenizer_ = nullptr;

TEST_F(Server, HealthModelsAndMetricsAnswer) {
  const Reply h = call(port_, http::verb::get, "/health");
  EXPECT_EQ(h.status, 200) << h.error;
  EXPECT_EQ(h.j()["status"], "ok");
  const Reply m = call(port_, http::verb::get, "/v1/models");
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(m.j()["data"][0]["id"], server_->model_name());
  const Reply met = call(port_, http::verb::get, "/metrics");
  ASSERT_EQ(met.status, 200);
  EXPECT_NE(met.content_type.find("text/plain"), std::string::npos);
  EXPECT_NE(met.body.find("snapserve_num_requests_running"), std::string::npos);
}

TEST_F(Server, KeepAliveServesSeveralRequestsOnOneConnection) {
  RawConn conn(port_);
  ASSERT_TRUE(conn.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(conn.send_all("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")) << "request " << i;
    std::string got;
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < until && got.find("{\"status\":\"ok\"}") == std::string::npos) {
      ASSERT_TRUE(conn.read_some(&got, 100)) << "connection closed after request " << i << ": " << got;
    }
    EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  }
}

TEST_F(Server, CompletionStreamedEqualsNotStreamed) {
  const std::string prompt = "The three primary colors are";
  json body = {{"model", server_->model_name()}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}};
  const Reply whole = post(port_, "/v1/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.error << whole.body;
  const json w = whole.j();
  const std::string text = w["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(w["object"], "text_completion");
  const int64_t prompt_tokens = static_cast<int64_t>(prompt_ids_for_text(*tokenizer_, prompt).size());
  EXPECT_EQ(w["usage"]["prompt_tokens"], prompt_tokens);
  const int64_t completion_tokens = w["usage"]["completion_tokens"];
  EXPECT_GE(completion_tokens, 1);
  EXPECT_LE(completion_tokens, 12);
  EXPECT_EQ(w["usage"]["total_tokens"], prompt_tokens + completion_tokens);
  if (w["choices"][0]["finish_reason"] == "length") {
    EXPECT_EQ(completion_tokens, 12);
  }
  EXPECT_GT(w["kv"]["resident_bytes"].get<int64_t>(), 0);
  // Uncompressed: resident and full-equivalent on the same basis (whole blocks), ratio 1.
  EXPECT_EQ(w["kv"]["resident_bytes"], w["kv"]["full_equivalent_bytes"]);
  EXPECT_EQ(w["kv"]["compression_ratio"], 1.0);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const Reply streamed = post(port_, "/v1/completions", body);
  EXPECT_NE(streamed.content_type.find("text/event-stream"), std::string::npos);
  const Streamed s = collect_stream(streamed, false);
  ASSERT_TRUE(s.problem.empty()) << s.problem;
  EXPECT_TRUE(s.done) << "stream did not end with data: [DONE]";
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.finish_reason, w["choices"][0]["finish_reason"]);
  EXPECT_EQ(s.usage, w["usage"]);
}

TEST_F(Server, ChatStreamedEqualsNotStreamed) {
  const std::vector<ChatMessage> messages = {{"user", "What is the capital of France?"}};
  json body = {{"messages", {{{"role", "user"}, {"content", messages[0].content}}}},
               {"max_tokens", 10},
               {"temperature", 0}};
  const Reply whole = post(port_, "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.error << whole.body;
  const json w = whole.j();
  EXPECT_EQ(w["object"], "chat.completion");
  EXPECT_EQ(w["choices"][0]["message"]["role"], "assistant");
  const std::string text = w["choices"][0]["message"]["content"];
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;
  auto ids = prompt_ids_for_chat(*tokenizer_, messages);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(w["usage"]["prompt_tokens"], static_cast<int64_t>(ids->size()));

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const Streamed s = collect_stream(post(port_, "/v1/chat/completions", body), true);
  ASSERT_TRUE(s.problem.empty()) << s.problem;
  EXPECT_TRUE(s.saw_role);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.finish_reason, w["choices"][0]["finish_reason"]);
  EXPECT_EQ(s.usage, w["usage"]);
}

// Start of the UTF-8 character `n` characters before the end of `s`.
size_t chars_from_end(const std::string& s, int n) {
  size_t at = s.size();
  while (n > 0 && at > 0) {
    --at;
    if ((static_cast<unsigned char>(s[at]) & 0xC0) != 0x80) --n;
  }
  return at;
}

// Stop strings lose no text (issue 14 #1): a completion that ends by max_tokens, a chat that
// ends by EOS and a Spanish completion with multi-byte characters, each with a stop string
// that never matches, ones that match only partially at the end (held back, then owed to
// the client when generation ends), and ones that hit; streamed and not.
TEST_F(Server, StopStringsLoseNoText) {
  struct Ref {
    std::string name, route;
    json body;
    std::string want_finish;  // of the run without stop strings
  };
  const std::vector<Ref> refs = {
      {"length", "/v1/completions", {{"prompt", "Count: 1, 2, 3,"}, {"max_tokens", 8}}, "length"},
      {"eos", "/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}}, {"max_tokens", 64}}, "stop"},
      {"utf8", "/v1/completions",
       {{"prompt", "Translate to Spanish: The boy is very small. In Spanish:"}, {"max_tokens", 16}}, "length"},
  };
  const bool chat_route[] = {false, true, false};
  auto run = [&](const Ref& r, bool chat, const json& stop, bool stream) {
    json body = r.body;
    body["temperature"] = 0;
    if (!stop.is_null()) body["stop"] = stop;
    if (stream) body["stream"] = true;
    const Reply reply = post(port_, r.route, body);
    Streamed out;
    if (stream) return collect_stream(reply, chat);
    if (reply.status != 200) {
      out.problem = "status " + std::to_string(reply.status) + " " + reply.body;
      return out;
    }
    const json j = reply.j();
    const json& c = j["choices"][0];
    out.text = chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
    out.finish_reason = c["finish_reason"];
    return out;
  };
  for (size_t i = 0; i < refs.size(); ++i) {
    const Ref& r = refs[i];
    const bool chat = chat_route[i];
    const Streamed ref = run(r, chat, nullptr, false);
    ASSERT_TRUE(ref.problem.empty()) << r.name << ": " << ref.problem;
    ASSERT_EQ(ref.finish_reason, r.want_finish) << r.name << " (the case needs it): " << ref.text;
    const std::string& t = ref.text;
    ASSERT_GE(t.size(), 6u) << r.name << ": " << t;

    struct Case {
      std::string what;
      json stop;
      std::string text, finish;
    };
    std::vector<Case> cases;
    cases.push_back({"never matches", json::array({"@@@"}), t, ref.finish_reason});
    for (int k : {1, 3}) {  // the last k characters start a stop string that never completes
      cases.push_back({"partial " + std::to_string(k), json::array({t.substr(chars_from_end(t, k)) + "@@"}), t,
                       ref.finish_reason});
    }
    // Three whole characters from the middle.
    size_t mid = t.size() / 2, end = mid;
    while (mid > 0 && (static_cast<unsigned char>(t[mid]) & 0xC0) == 0x80) --mid;
    end = mid;
    for (int n = 0; n < 3 && end < t.size(); ++n) {
      ++end;
      while (end < t.size() && (static_cast<unsigned char>(t[end]) & 0xC0) == 0x80) ++end;
    }
    const std::string piece = t.substr(mid, end - mid);
    cases.push_back({"hit", json::array({"@@@", piece}), t.substr(0, t.find(piece)), "stop"});
    if (r.name == "utf8") {
      const size_t accent = t.find("\xC3");  // á, é, í, ó, ú, ñ
      ASSERT_NE(accent, std::string::npos) << "the Spanish completion has no accented letter: " << t;
      // Held back across the accented letter: the tail from it on, plus a character more.
      cases.push_back({"partial from the accent", json::array({t.substr(accent) + "@"}), t, ref.finish_reason});
      cases.push_back({"hit on the accent", json::array({t.substr(accent, 2)}), t.substr(0, accent), "stop"});
    }
    for (const Case& c : cases) {
      for (bool stream : {false, true}) {
        const Streamed got = run(r, chat, c.stop, stream);
        const std::string label = r.name + ", " + c.what + ", stop " + c.stop.dump() + (stream ? ", streamed" : "");
        ASSERT_TRUE(got.problem.empty()) << label << ": " << got.problem;
        EXPECT_EQ(got.text, c.text) << label;
        EXPECT_EQ(got.finish_reason, c.finish) << label;
        if (stream) {
          EXPECT_TRUE(got.done) << label;
        }
      }
    }
  }
}

// Reads the last row of a `generate --dump-logits` file (tools/read_logits.py's format).
std::vector<float> last_dumped_logits(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[32];
  if (!in.read(head, 32) || std::string(head, 8) != "SNAPLGT1") return {};
  int64_t n = 0, vocab = 0;
  std::memcpy(&n, head + 16, 8);
  std::memcpy(&vocab, head + 24, 8);
  std::vector<float> row(static_cast<size_t>(vocab));
  in.seekg(32 + 4 * n + 4 * (n - 1) * vocab);
  if (!in.read(reinterpret_cast<char*>(row.data()), 4 * vocab)) return {};
  return row;
}

// logprobs are the model's distribution: the first token's log-probability and top 5 equal
// a log-softmax of the logits `generate --dump-logits` writes for the same prompt; streamed
// chat logprobs equal non-streamed ones; the EOS/stop token is not listed.
TEST_F(Server, LogprobsAreTheModelsDistribution) {
  const std::string prompt = "The capital of France is";
  const std::string dump = (fs::temp_directory_path() / ("snap_lp_" + std::to_string(::getpid()))).string();
  const std::string cmd = snapserve_binary() + " generate --model " + model_path() + " --prompt '" +
                          prompt + "' --max-tokens 1 --threads 2 --dump-logits " + dump + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<float> row = last_dumped_logits(dump);
  fs::remove(dump);
  ASSERT_FALSE(row.empty());
  double mx = row[0];
  for (float v : row) mx = std::max<double>(mx, v);
  double z = 0;
  for (float v : row) z += std::exp(v - mx);
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });

  const Reply r = post(port_, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 5}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json lp = r.j()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 1u) << lp.dump();
  EXPECT_EQ(lp["tokens"][0], tokenizer_->token_bytes(order[0]));
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), row[order[0]] - mx - std::log(z), 1e-3);
  const json& top = lp["top_logprobs"][0];
  EXPECT_EQ(top.size(), 5u) << top.dump();
  for (int i = 0; i < 5; ++i) {
    const std::string tok = tokenizer_->token_bytes(order[i]);
    ASSERT_TRUE(top.contains(tok)) << "top 5 lacks '" << tok << "': " << top.dump();
    EXPECT_NEAR(top[tok].get<double>(), row[order[i]] - mx - std::log(z), 1e-3) << tok;
  }

  // Chat: streamed logprobs concatenate to the non-streamed list; the EOS is not in it.
  json body = {{"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
               {"max_tokens", 64}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}};
  const Reply whole = post(port_, "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json w = whole.j();
  ASSERT_EQ(w["choices"][0]["finish_reason"], "stop");
  const json content = w["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(static_cast<int64_t>(content.size()), w["usage"]["completion_tokens"].get<int64_t>() - 1)
      << "every output token but the EOS";
  std::string joined;
  for (const json& c : content) {
    joined += c["token"].get<std::string>();
    EXPECT_EQ(c["top_logprobs"].size(), 2u);
    EXPECT_LE(c["logprob"].get<double>(), 0.0);
  }
  EXPECT_EQ(joined, w["choices"][0]["message"]["content"]);
  body["stream"] = true;
  const Reply streamed = post(port_, "/v1/chat/completions", body);
  json from_stream = json::array();
  for (const std::string& payload : sse_payloads(streamed.body)) {
    if (payload == "[DONE]") break;
    const json c = json::parse(payload);
    if (!c["choices"].empty() && !c["choices"][0]["logprobs"].is_null()) {
      for (const json& e : c["choices"][0]["logprobs"]["content"]) from_stream.push_back(e);
    }
  }
  EXPECT_EQ(from_stream, content);
}

// n choices and prompt lists (issue 14 #4): choice c of a request with seed S is exactly the
// text of a request of its own with seed S + c (one prefill, forked KV), a list of prompts
// gives prompt p's choice c at index p * n + c, streaming gives the same texts per index.
TEST_F(Server, ChoicesAndPromptListsMatchSingleRequests) {
  const std::vector<std::string> prompts = {"Once upon a time", "The capital of France is"};
  json body = {{"prompt", prompts}, {"n", 3}, {"max_tokens", 8}, {"temperature", 0.9}, {"seed", 41},
               {"kv_compression", {{"policy", "snapkv"}, {"budget", 16}, {"window", 4}}}};
  const Reply r = post(port_, "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.j();
  ASSERT_EQ(j["choices"].size(), 6u);
  int64_t prompt_tokens = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int c = 0; c < 3; ++c) {
      json one = body;
      one["prompt"] = prompts[p];
      one["n"] = 1;
      one["seed"] = 41 + c;
      const Reply alone = post(port_, "/v1/completions", one);
      ASSERT_EQ(alone.status, 200) << alone.body;
      const json& got = j["choices"][p * 3 + c];
      EXPECT_EQ(got["index"], static_cast<int>(p * 3 + c));
      EXPECT_EQ(got["text"], alone.j()["choices"][0]["text"]) << "prompt " << p << " choice " << c;
      if (c == 0) prompt_tokens += alone.j()["usage"]["prompt_tokens"].get<int64_t>();
    }
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens) << "each prompt counted once";
  EXPECT_EQ(j["usage"]["completion_tokens"], 6 * 8);

  body["stream"] = true;
  const Reply streamed = post(port_, "/v1/completions", body);
  std::vector<std::string> texts(6);
  std::vector<std::string> reasons(6);
  for (const std::string& payload : sse_payloads(streamed.body)) {
    if (payload == "[DONE]") break;
    const json c = json::parse(payload);
    for (const json& ch : c["choices"]) {
      texts[ch["index"].get<int>()] += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) reasons[ch["index"].get<int>()] = ch["finish_reason"];
    }
  }
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(texts[i], j["choices"][i]["text"]) << "streamed choice " << i;
    EXPECT_EQ(reasons[i], "length") << i;
  }
  // Chat with n: three choices, the first one's role chunk each.
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Name a fruit."}}}}, {"n", 3}, {"max_tokens", 6},
                     {"temperature", 1.0}, {"seed", 3}};
  const Reply h = post(port_, "/v1/chat/completions", chat);
  ASSERT_EQ(h.status, 200) << h.body;
  ASSERT_EQ(h.j()["choices"].size(), 3u);
  EXPECT_EQ(h.j()["choices"][2]["message"]["role"], "assistant");
  json too_many = chat;
  too_many["n"] = 64;  // more than this server's --max-num-seqs (16)
  EXPECT_EQ(post(port_, "/v1/chat/completions", too_many).status, 400);
}

// echo with logprobs scores the prompt (what log-likelihood harnesses ask): every prompt
// token's log-probability equals a log-softmax of the logits `generate --dump-logits` writes
// at the position before it; the first token's is null; max_tokens 0 generates nothing.
TEST_F(Server, EchoScoresThePromptLikeTheDumpedLogits) {
  const std::string prompt = "The quick brown fox jumps over the lazy dog";
  const std::string dump = (fs::temp_directory_path() / ("snap_echo_" + std::to_string(::getpid()))).string();
  const std::string cmd = snapserve_binary() + " generate --model " + model_path() + " --prompt '" +
                          prompt + "' --max-tokens 1 --threads 2 --dump-logits " + dump + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  snap::testing::DumpedLogits d;
  ASSERT_TRUE(snap::testing::read_logits_dump(dump, &d)) << dump;
  const int64_t n = d.n;
  fs::remove(dump);

  const Reply r = post(port_, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = r.j()["choices"][0];
  EXPECT_EQ(c["text"], prompt);
  EXPECT_EQ(r.j()["usage"]["completion_tokens"], 0);
  const json& lp = c["logprobs"];
  ASSERT_EQ(static_cast<int64_t>(lp["tokens"].size()), n) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (int64_t j = 1; j < n; ++j) {
    EXPECT_EQ(lp["tokens"][j], tokenizer_->token_bytes(d.ids[j]));
    EXPECT_NEAR(lp["token_logprobs"][j].get<double>(), snap::testing::log_softmax_at(d.row(j - 1), d.vocab, d.ids[j]), 1e-3)
        << "prompt token " << j;
  }
  // With generation: the prompt, then the completion, and their logprobs in that order.
  const Reply g = post(port_, "/v1/completions",
                       {{"prompt", prompt}, {"max_tokens", 3}, {"echo", true}, {"logprobs", 0}, {"temperature", 0}});
  ASSERT_EQ(g.status, 200) << g.body;
  const json gc = g.j()["choices"][0];
  EXPECT_EQ(gc["text"].get<std::string>().rfind(prompt, 0), 0u) << gc["text"];
  EXPECT_EQ(static_cast<int64_t>(gc["logprobs"]["tokens"].size()), n + 3);
  // Streaming with echo sends the prompt first; echo + logprobs + stream is refused by name.
  const Streamed st = collect_stream(post(port_, "/v1/completions",
                                          {{"prompt", prompt}, {"max_tokens", 3}, {"echo", true}, {"temperature", 0}, {"stream", true}}),
                                     false);
  ASSERT_TRUE(st.problem.empty()) << st.problem;
  EXPECT_EQ(st.text, gc["text"]);
  const Reply refused = post(port_, "/v1/completions", {{"prompt", prompt}, {"echo", true}, {"logprobs", 1}, {"stream", true}});
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.j()["error"]["param"], "echo");
}

// vLLM's sampling extras do what they say on the real model (their arithmetic is pinned in
// test_logits_processing): logit_bias forces or forbids a token, min_tokens holds off EOS,
// stop_token_ids end the output without the token, repetition_penalty changes the text.
TEST_F(Server, SamplingExtrasChangeTheOutput) {
  const json count = {{"prompt", "Count: 1, 2, 3,"}, {"max_tokens", 8}, {"temperature", 0}};
  const Reply ref = post(port_, "/v1/completions", count);
  ASSERT_EQ(ref.status, 200);
  const std::string ref_text = ref.j()["choices"][0]["text"];
  ASSERT_EQ(ref_text, " 4, 5, 6") << "the cases below assume this continuation";

  const std::vector<int32_t> bang = tokenizer_->encode("!", false), comma = tokenizer_->encode(",", false);
  ASSERT_EQ(bang.size(), 1u);
  ASSERT_EQ(comma.size(), 1u);
  json b = count;
  b["logit_bias"] = {{std::to_string(bang[0]), 100}};
  EXPECT_EQ(post(port_, "/v1/completions", b).j()["choices"][0]["text"], "!!!!!!!!");
  b["logit_bias"] = {{std::to_string(comma[0]), -100}};
  const std::string no_comma = post(port_, "/v1/completions", b).j()["choices"][0]["text"];
  EXPECT_EQ(no_comma.find(','), std::string::npos) << no_comma;

  b = count;
  b["stop_token_ids"] = {comma[0]};
  b["logprobs"] = 0;
  const json stopped = post(port_, "/v1/completions", b).j();
  EXPECT_EQ(stopped["choices"][0]["text"], " 4");
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(stopped["choices"][0]["logprobs"]["tokens"], (json{" ", "4"})) << "the stop token is not listed";
  EXPECT_EQ(stopped["usage"]["completion_tokens"], 3);
  EXPECT_EQ(stopped["choices"][0]["stop_reason"], comma[0]) << "vLLM's stop_reason: the stop token id";
  b = count;
  b["stop"] = {"@@", ", 5"};
  const json by_string = post(port_, "/v1/completions", b).j();
  EXPECT_EQ(by_string["choices"][0]["text"], " 4");
  EXPECT_EQ(by_string["choices"][0]["stop_reason"], ", 5") << "the stop string that matched";
  b["stream"] = true;
  bool saw_reason = false;
  for (const std::string& payload : sse_payloads(post(port_, "/v1/completions", b).body)) {
    if (payload == "[DONE]") break;
    const json c = json::parse(payload);
    if (!c["choices"].empty() && c["choices"][0]["finish_reason"] == "stop") {
      saw_reason = c["choices"][0]["stop_reason"] == ", 5";
    }
  }
  EXPECT_TRUE(saw_reason) << "the closing chunk carries stop_reason";

  b = count;
  b["repetition_penalty"] = 3.0;
  EXPECT_NE(post(port_, "/v1/completions", b).j()["choices"][0]["text"], ref_text);

  const json chat = {{"messages", {{{"role", "user"}, {"content", "What is the capital of France?"}}}},
                     {"max_tokens", 64}, {"temperature", 0}};
  const json free_run = post(port_, "/v1/chat/completions", chat).j();
  ASSERT_EQ(free_run["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(free_run["choices"][0]["stop_reason"].is_null()) << "EOS has no stop_reason";
  const int64_t natural = free_run["usage"]["completion_tokens"];
  json held = chat;
  held["min_tokens"] = natural + 10;
  const json longer = post(port_, "/v1/chat/completions", held).j();
  EXPECT_GE(longer["usage"]["completion_tokens"].get<int64_t>(), natural + 10) << longer.dump();
  held["min_tokens"] = 100;  // more than max_tokens
  EXPECT_EQ(post(port_, "/v1/chat/completions", held).status, 400);
}

TEST_F(Server, SixteenConcurrentPoliciesEqualRunsAlone) {
  std::string prompt;
  for (int i = 0; i < 8; ++i) {
    prompt += "Paragraph " + std::to_string(i) + ": the harbor town kept its lighthouse lit through every storm, "
              "and the keeper wrote the weather in a book. ";
  }
  prompt += "The keeper's book recorded";
  ASSERT_GT(prompt_ids_for_text(*tokenizer_, prompt).size(), 150u);  // longer than every budget below
  const std::vector<json> policies = {
      {{"policy", "full"}},
      {{"policy", "snapkv"}, {"budget", 64}, {"window", 8}, {"kernel", 7}},
      {{"policy", "snapkv"}, {"budget", 96}, {"window", 16}, {"kernel", 5}, {"pooling", "avg"}, {"gqa", "max"}},
      {{"policy", "streaming"}, {"budget", 64}},
      {{"policy", "h2o"}, {"budget", 64}},
      {{"policy", "pyramidkv"}, {"budget", 64}, {"window", 8}},
      {{"policy", "adakv"}, {"budget", 64}, {"window", 8}},
      {{"policy", "snapkv"}, {"budget", 64}, {"window", 8}, {"layerwise", true}},
  };
  auto body_for = [&](size_t p, bool stream) {
    return json{{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true},
                {"stream", stream}, {"kv_compression", policies[p]}};
  };
  constexpr int k_clients = 16;
  std::vector<Streamed> results(k_clients);
  std::vector<std::thread> clients;
  for (int c = 0; c < k_clients; ++c) {
    clients.emplace_back([&, c] {
      results[c] = collect_stream(post(port_, "/v1/completions", body_for(c % policies.size(), true)), false);
    });
  }
  for (auto& t : clients) t.join();
  for (size_t p = 0; p < policies.size(); ++p) {
    const Reply alone = post(port_, "/v1/completions", body_for(p, false));
    ASSERT_EQ(alone.status, 200) << policies[p].dump() << ": " << alone.body;
    const std::string expected = alone.j()["choices"][0]["text"];
    EXPECT_EQ(alone.j()["usage"]["completion_tokens"], 8);
    for (int c = static_cast<int>(p); c < k_clients; c += static_cast<int>(policies.size())) {
      ASSERT_TRUE(results[c].problem.empty()) << "client " << c << ": " << results[c].problem;
      EXPECT_TRUE(results[c].done) << "client " << c;
      EXPECT_EQ(results[c].finish_reason, "length") << "client " << c;
      EXPECT_EQ(results[c].text, expected) << "client " << c << " policy " << policies[p].dump();
    }
  }
}

struct BadInput {
  const char* name;
  std::string target;
  std::string body;
  int status;
  std::string param;  // "" = null
};

TEST_F(Server, BadInputsGetTheir4xxAndTheServerKeepsServing) {
  std::string long_prompt = "[";
  for (int i = 0; i < 1100; ++i) long_prompt += i ? ",28" : "28";  // over --max-model-len 1024
  long_prompt += "]";
  const std::string C = "/v1/completions", H = "/v1/chat/completions";
  const std::vector<BadInput> table = {
      {"malformed JSON", C, "{\"prompt\": \"hi\"", 400, ""},
      {"wrong type: prompt", C, "{\"prompt\": 42}", 400, "prompt"},
      {"wrong type: temperature", C, "{\"prompt\": \"hi\", \"temperature\": \"warm\"}", 400, "temperature"},
      {"wrong type: messages", H, "{\"messages\": {\"role\": \"user\"}}", 400, "messages"},
      {"missing prompt", C, "{\"max_tokens\": 3}", 400, "prompt"},
      {"missing content", H, "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0].content"},
      {"negative max_tokens", C, "{\"prompt\": \"hi\", \"max_tokens\": -5}", 400, "max_tokens"},
      {"huge max_tokens", C, "{\"prompt\": \"hi\", \"max_tokens\": 100000000000}", 400, "max_tokens"},
      {"n = 100", C, "{\"prompt\": \"hi\", \"n\": 100}", 400, "n"},
      {"tools", H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\"}]}", 400, "tools"},
      {"unknown policy", C, "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"zip\"}}", 400, "kv_compression.policy"},
      {"budget < window", C,
       "{\"prompt\": \"hi\", \"kv_compression\": {\"policy\": \"snapkv\", \"budget\": 16, \"window\": 32}}", 400,
       "kv_compression.budget"},
      {"prompt over the limit", C, "{\"prompt\": " + long_prompt + "}", 400, "prompt"},
      {"invalid UTF-8", C, "{\"prompt\": \"caf\xc3\x28\"}", 400, ""},
      {"unknown model", C, "{\"model\": \"gpt-4o\", \"prompt\": \"hi\"}", 404, "model"},
      {"unknown route", "/v1/embeddings", "{\"input\": \"hi\"}", 404, ""},
  };
  for (const BadInput& b : table) {
    const Reply r = call(port_, http::verb::post, b.target, b.body);
    EXPECT_EQ(r.status, b.status) << b.name << ": " << r.error << " " << r.body;
    const json j = r.j();
    ASSERT_TRUE(j.contains("error")) << b.name << ": " << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << b.name;
    EXPECT_TRUE(j["error"]["type"].is_string()) << b.name;
    EXPECT_TRUE(j["error"].contains("code")) << b.name;
    if (b.param.empty()) {
      EXPECT_TRUE(j["error"]["param"].is_null()) << b.name << ": " << r.body;
    } else {
      EXPECT_EQ(j["error"]["param"], b.param) << b.name << ": " << r.body;
    }
  }

  const Reply wrong_method = call(port_, http::verb::get, "/v1/completions");
  EXPECT_EQ(wrong_method.status, 405) << wrong_method.body;

  // Oversized body: 2 MiB against the 1 MiB default.
  const Reply big = call(port_, http::verb::post, "/v1/completions", std::string(2 << 20, 'a'));
  EXPECT_EQ(big.status, 413) << big.error << " " << big.body;

  // Slowloris: headers trickled a byte at a time are cut off (read timeout 2 s here).
  RawConn slow(port_);
  ASSERT_TRUE(slow.ok());
  const std::string partial = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  bool dropped = !slow.send_all(partial);
  std::string got;
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (!dropped && Clock::now() < until) {
    if (!slow.send_all("a") || !slow.read_some(&got, 200)) dropped = true;
  }
  EXPECT_TRUE(dropped) << "a request trickling its headers was never dropped";

  const Reply h = call(port_, http::verb::get, "/health");
  EXPECT_EQ(h.status, 200) << h.error << " " << h.body;
  const Reply ok = post(port_, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}, {"temperature", 0}});
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(Server, DisconnectMidStreamFreesBlocks) {
  ASSERT_TRUE(wait_until_idle(port_, 30)) << "server busy before the test";
  const double aborted_before = metric(port_, "snapserve_request_success_total{finished_reason=\"abort\"}");
  RawConn conn(port_);
  ASSERT_TRUE(conn.ok());
  const json body = {{"prompt", "Write a long story about a dragon."}, {"max_tokens", 400}, {"temperature", 0},
                     {"ignore_eos", true}, {"stream", true}};
  ASSERT_TRUE(conn.send_all(raw_post("/v1/completions", body.dump())));
  std::string got;
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < until && sse_payloads(got).size() < 2) {
    if (!conn.read_some(&got, 200)) break;
  }
  ASSERT_GE(sse_payloads(got).size(), 2u) << "no tokens streamed: " << got;
  EXPECT_EQ(metric(port_, "snapserve_num_requests_running"), 1);
  EXPECT_GT(metric(port_, "snapserve_kv_cache_usage_ratio"), 0);
  conn.close();
  EXPECT_TRUE(wait_until_idle(port_, 20)) << "blocks not freed after the client left";
  EXPECT_EQ(metric(port_, "snapserve_request_success_total{finished_reason=\"abort\"}"), aborted_before + 1);
}

TEST_F(Server, DisconnectWhileWaitingCancels) {
  ASSERT_TRUE(wait_until_idle(port_, 30)) << "server busy before the test";
  const double aborted_before = metric(port_, "snapserve_request_success_total{finished_reason=\"abort\"}");
  RawConn conn(port_);
  ASSERT_TRUE(conn.ok());
  const json body = {{"prompt", "Count to one thousand:"}, {"max_tokens", 400}, {"temperature", 0}, {"ignore_eos", true}};
  ASSERT_TRUE(conn.send_all(raw_post("/v1/completions", body.dump())));
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < until && metric(port_, "snapserve_num_requests_running") != 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(metric(port_, "snapserve_num_requests_running"), 1);
  conn.close();
  EXPECT_TRUE(wait_until_idle(port_, 20)) << "blocks not freed after the client left";
  EXPECT_EQ(metric(port_, "snapserve_request_success_total{finished_reason=\"abort\"}"), aborted_before + 1);
}

// --- servers with their own flags --------------------------------------------------

TEST(ServerLimits, ApiKeyAndQueueOverflow) {
  ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path();
  ServerProcess server({"--api-key", "s3cret", "--max-num-seqs", "1", "--max-waiting", "1"});
  const int port = server.port();
  ASSERT_GT(port, 0);
  const json body = {{"prompt", "Hello"}, {"max_tokens", 2}, {"temperature", 0}};
  EXPECT_EQ(post(port, "/v1/completions", body).status, 401);
  EXPECT_EQ(post(port, "/v1/completions", body, "wrong").status, 401);
  EXPECT_EQ(post(port, "/v1/completions", body, "s3cre").status, 401);
  const Reply unauth = call(port, http::verb::get, "/v1/models");
  EXPECT_EQ(unauth.status, 401);
  EXPECT_EQ(unauth.j()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(call(port, http::verb::get, "/health").status, 200);  // probes need no key
  EXPECT_EQ(post(port, "/v1/completions", body, "s3cret").status, 200);

  // One running, one waiting: of six long requests at once, exactly four are refused.
  const json long_body = {{"prompt", "Tell me a story."}, {"max_tokens", 160}, {"temperature", 0}, {"ignore_eos", true}};
  std::vector<Reply> replies(6);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < replies.size(); ++i) {
    clients.emplace_back([&, i] { replies[i] = post(port, "/v1/completions", long_body, "s3cret"); });
  }
  for (auto& t : clients) t.join();
  int ok = 0, refused = 0;
  for (const Reply& r : replies) {
    if (r.status == 200) ++ok;
    if (r.status == 429) {
      ++refused;
      EXPECT_EQ(r.retry_after, "1");
      EXPECT_TRUE(r.j()["error"]["message"].is_string());
    }
  }
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(refused, 4);
  EXPECT_EQ(call(port, http::verb::get, "/health").status, 200);
}

// N simultaneous requests to an idle server: how many 200s and 429s (issue 14 #9). A request a
// free sequence slot takes at once never counts as waiting: max_num_seqs + max_waiting run or
// wait, the rest are refused, and the refusals are counted by reason.
std::pair<int, int> burst(int port, int n, const json& body) {
  std::vector<Reply> replies(n);
  std::vector<std::thread> clients;
  std::atomic<int> ready{0};
  for (int i = 0; i < n; ++i) {
    clients.emplace_back([&, i] {
      ++ready;
      while (ready.load() < n) std::this_thread::yield();
      replies[i] = post(port, "/v1/completions", body);
    });
  }
  for (auto& t : clients) t.join();
  int ok = 0, refused = 0;
  for (const Reply& r : replies) {
    ok += r.status == 200;
    refused += r.status == 429;
  }
  return {ok, refused};
}

// One raw HTTP/1.1 exchange (Connection: close): the whole answer, headers and body.
std::string raw_exchange(int port, const std::string& request) {
  RawConn conn(port);
  if (!conn.ok() || !conn.send_all(request)) return "";
  std::string got;
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < until && conn.read_some(&got, 100)) {
  }
  return got;
}

// GET /v1/models/{id}, HEAD on the GET routes, OPTIONS, and CORS with --allowed-origins
// (issue 14 #6); the preflight needs no API key, a foreign origin gets no CORS header.
TEST(ServerLimits, ModelByIdHeadOptionsAndCors) {
  ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path();
  ServerProcess server({"--allowed-origins", "https://app.example.com,https://b.example.org", "--api-key", "k"});
  const int port = server.port();
  ASSERT_GT(port, 0) << server.log();
  const std::string name = server.model_name();

  const Reply one = call(port, http::verb::get, "/v1/models/" + name, "", "k");
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(one.j()["id"], name);
  EXPECT_EQ(one.j()["object"], "model");
  const Reply none = call(port, http::verb::get, "/v1/models/gpt-4o", "", "k");
  EXPECT_EQ(none.status, 404);
  EXPECT_EQ(none.j()["error"]["code"], "model_not_found");

  // HEAD: GET's status and Content-Length, no body.
  const std::string head = raw_exchange(port, "HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Length: 15"), std::string::npos) << head;  // {"status":"ok"}
  EXPECT_EQ(head.substr(head.find("\r\n\r\n") + 4), "") << "HEAD sent a body";

  // Preflight from an allowed origin, without the API key.
  const std::string pre = raw_exchange(port,
      "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example.com\r\n"
      "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n"
      "Connection: close\r\n\r\n");
  EXPECT_EQ(pre.rfind("HTTP/1.1 204", 0), 0u) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Origin: https://app.example.com"), std::string::npos) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Methods: POST, OPTIONS"), std::string::npos) << pre;
  EXPECT_NE(pre.find("Access-Control-Allow-Headers: Authorization, Content-Type"), std::string::npos) << pre;
  // The request itself carries the header; another origin's does not.
  const std::string body = R"({"prompt": "Hi", "max_tokens": 2, "temperature": 0})";
  auto post_from = [&](const std::string& origin) {
    return raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: " + origin +
                                  "\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  };
  const std::string allowed = post_from("https://b.example.org");
  EXPECT_EQ(allowed.rfind("HTTP/1.1 200", 0), 0u) << allowed;
  EXPECT_NE(allowed.find("Access-Control-Allow-Origin: https://b.example.org"), std::string::npos) << allowed;
  const std::string foreign = post_from("https://evil.example.net");
  EXPECT_EQ(foreign.rfind("HTTP/1.1 200", 0), 0u) << foreign;
  EXPECT_EQ(foreign.find("Access-Control-Allow-Origin"), std::string::npos) << foreign;
  const std::string post_head = raw_exchange(port, "HEAD /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(post_head.rfind("HTTP/1.1 405", 0), 0u) << post_head;
}

// A request past --request-timeout ends with vLLM's "abort" and says why; streamed too.
TEST(ServerLimits, TimeoutIsVisibleAsSuch) {
  ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path();
  ServerProcess server({"--request-timeout", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  json body = {{"prompt", "Tell me a long story."}, {"max_tokens", 900}, {"temperature", 0}, {"ignore_eos", true}};
  const Reply r = post(server.port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = r.j()["choices"][0];
  EXPECT_EQ(c["finish_reason"], "abort");
  EXPECT_EQ(c["abort_reason"], "timeout");
  EXPECT_LT(r.j()["usage"]["completion_tokens"].get<int64_t>(), 900);
  body["stream"] = true;
  const Streamed s = collect_stream(post(server.port(), "/v1/completions", body), false);
  ASSERT_TRUE(s.problem.empty()) << s.problem;
  EXPECT_EQ(s.finish_reason, "abort");
  EXPECT_TRUE(s.done);
  EXPECT_EQ(metric(server.port(), "snapserve_request_success_total{finished_reason=\"timeout\"}"), 2);
}

TEST(ServerLimits, BurstAdmissionCountsExactly) {
  ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path();
  const json body = {{"prompt", "Tell me a story."}, {"max_tokens", 64}, {"temperature", 0}, {"ignore_eos", true}};
  {
    ServerProcess server({"--max-num-seqs", "4", "--max-waiting", "2"});
    ASSERT_GT(server.port(), 0) << server.log();
    for (const auto& [n, want_ok] : std::vector<std::pair<int, int>>{{4, 4}, {6, 6}, {7, 6}, {9, 6}}) {
      ASSERT_TRUE(wait_until_idle(server.port(), 60));
      const auto [ok, refused] = burst(server.port(), n, body);
      EXPECT_EQ(ok, want_ok) << n << " at once, --max-num-seqs 4 --max-waiting 2";
      EXPECT_EQ(refused, n - want_ok) << n << " at once";
    }
    EXPECT_EQ(metric(server.port(), "snapserve_request_rejected_total{reason=\"queue_full\"}"), 1 + 3);
  }
  {
    ServerProcess server({"--max-num-seqs", "3", "--max-waiting", "0"});
    ASSERT_GT(server.port(), 0) << server.log();
    for (const auto& [n, want_ok] : std::vector<std::pair<int, int>>{{3, 3}, {5, 3}}) {
      ASSERT_TRUE(wait_until_idle(server.port(), 60));
      const auto [ok, refused] = burst(server.port(), n, body);
      EXPECT_EQ(ok, want_ok) << n << " at once, --max-num-seqs 3 --max-waiting 0";
      EXPECT_EQ(refused, n - want_ok) << n << " at once";
    }
  }
}

// Clients that leave mid-stream while their events are being written. The fresh-clone CI
// once saw the server free a queued event twice: the peer check found the client gone and
// closed the session (dropping the write queue) after a write had completed but before its
// handler ran, and the handler then popped the emptied queue. SNAP_FAULT_PEER_CHECK_BEFORE_WRITE
// queues a peer check ahead of every write's completion, so that the first event written
// after a client left meets that interleaving: the old code failed here in round 0, under
// AddressSanitizer and in the Release build alike. Every request is aborted, every block
// freed, and the server keeps serving.
TEST(ServerLimits, ClientsLeavingMidStreamLeaveItServing) {
  ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path();
  ServerProcess server({}, {"SNAP_FAULT_PEER_CHECK_BEFORE_WRITE=1"});
  const int port = server.port();
  ASSERT_GT(port, 0);
  const double aborted_before = metric(port, "snapserve_request_success_total{finished_reason=\"abort\"}");
  // max_tokens far beyond what a round lasts: each request ends because its client left.
  const json body = {{"prompt", "Write a long story about a dragon."}, {"max_tokens", 1000}, {"temperature", 0},
                     {"ignore_eos", true}, {"stream", true}};
  constexpr int k_rounds = 10, k_clients = 2;
  std::atomic<int> streamed{0};
  for (int round = 0; round < k_rounds; ++round) {
    std::vector<std::thread> clients;
    for (int c = 0; c < k_clients; ++c) {
      clients.emplace_back([&, round, c] {
        RawConn conn(port);
        if (!conn.ok() || !conn.send_all(raw_post("/v1/completions", body.dump()))) return;
        // Leaves after 1-10 events, then 0-270 ms later: at varied points of a write.
        const size_t want = 1 + static_cast<size_t>((round * 7 + c * 3) % 10);
        std::string got;
        const auto until = Clock::now() + std::chrono::seconds(60);
        while (Clock::now() < until && sse_payloads(got).size() < want) {
          if (!conn.read_some(&got, 200)) break;
        }
        if (sse_payloads(got).size() >= want) ++streamed;
        std::this_thread::sleep_for(std::chrono::milliseconds(30 * ((round + c) % 10)));
      });
    }
    for (auto& t : clients) t.join();
    if (call(port, http::verb::get, "/health").status != 200) {
      const int code = server.wait(60);  // a sanitizer may still be writing its report
      FAIL() << "the server stopped answering in round " << round << " (exit code " << code << "); "
             << log_excerpt(server.log());
    }
  }
  EXPECT_EQ(streamed.load(), k_rounds * k_clients);
  EXPECT_TRUE(wait_until_idle(port, 30)) << "blocks not freed after the clients left";
  EXPECT_EQ(metric(port, "snapserve_request_success_total{finished_reason=\"abort\"}"),
            aborted_before + k_rounds * k_clients);
  EXPECT_EQ(call(port, http::verb::get, "/health").status, 200);
  EXPECT_LT(server.wait(0), 0) << log_excerpt(server.log());
}

// An allocation that fails inside a step (std::bad_alloc: a long prompt's logits, scratch) once
// aborted the server from its scheduler thread. SNAP_FAULT_BAD_ALLOC_STEP=3 makes the third step
// fail after its forward extended the request's KV: that request ends with a 500 naming the out of
// memory, its blocks go back, and the server goes on serving the next request whole.
TEST(ServerLimits, OutOfMemoryInAStepEndsItsRequestsAndTheServerGoesOn) {
  ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path();
  ServerProcess server({}, {"SNAP_FAULT_BAD_ALLOC_STEP=3"});
  const int port = server.port();
  ASSERT_GT(port, 0) << log_excerpt(server.log());
  const json body = {{"prompt", "Write a story about a dragon."}, {"max_tokens", 12}, {"temperature", 0},
                     {"ignore_eos", true}};
  const Reply failed = post(port, "/v1/completions", body);
  EXPECT_EQ(failed.status, 500) << failed.body;
  EXPECT_NE(failed.body.find("out of memory"), std::string::npos) << failed.body;
  EXPECT_TRUE(wait_until_idle(port, 30)) << "blocks not freed after the failed step";
  EXPECT_EQ(call(port, http::verb::get, "/health").status, 200);
  const Reply next = post(port, "/v1/completions", body);
  ASSERT_EQ(next.status, 200) << next.body << log_excerpt(server.log());
  EXPECT_EQ(next.j()["usage"]["completion_tokens"], 12) << next.body;
  EXPECT_LT(server.wait(0), 0) << log_excerpt(server.log());
  EXPECT_NE(server.log().find("snapserve: error: out of memory: an allocation failed during a step"), std::string::npos)
      << log_excerpt(server.log());
}

TEST(ServerLimits, SigtermStopsWithinTheDeadline) {
  ASSERT_TRUE(fs::exists(model_path())) << "default model missing at " << model_path();
  ServerProcess server({"--max-connections", "3"});
  const int port = server.port();
  ASSERT_GT(port, 0);
  {
    // Three open connections fill the limit; a fourth is answered 503 and closed.
    std::vector<std::unique_ptr<RawConn>> held;
    for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<RawConn>(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const Reply over = call(port, http::verb::get, "/health");
    EXPECT_EQ(over.status, 503) << over.error << " " << over.body;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(call(port, http::verb::get, "/health").status, 200);
  // A stream that would run for many seconds is in flight when SIGTERM arrives.
  Reply streamed;
  std::thread client([&] {
    streamed = post(port, "/v1/completions",
                    {{"prompt", "Once upon a time"}, {"max_tokens", 1000}, {"temperature", 0}, {"ignore_eos", true},
                     {"stream", true}});
  });
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < until && metric(port, "snapserve_num_requests_running") != 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(metric(port, "snapserve_num_requests_running"), 1);
  const int code = server.terminate(15);  // --shutdown-timeout 2
  client.join();
  EXPECT_EQ(code, 0) << server.log();
  const Streamed s = collect_stream(streamed, false);
  EXPECT_TRUE(s.problem.empty()) << s.problem;
  EXPECT_TRUE(s.done) << "the in-flight stream was not closed cleanly";
  EXPECT_EQ(s.finish_reason, "abort");
}

}  // namespace
}  // namespace snap
