// `snapserve bench serve` (see bench_serve.h): the CLI, a Beast HTTP/1.1 client that
// streams one request at a time over a keep-alive connection with a per-request deadline,
// and the driver that runs C such clients over R requests and reports.
// Each client owns its io_context and runs every async op to completion on its own thread
// ("sync over async"), so Beast's stream timeouts bound every connect, write and read.
#include "coordinator/loadgen/bench_serve.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "common/host_port.h"
#include "common/status.h"
#include "common/sys.h"
#include "coordinator/loadgen/bench_stats.h"

namespace snap {

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

constexpr int k_max_concurrency = 1024;
constexpr int64_t k_max_requests = 1'000'000;
constexpr int64_t k_max_prompt_len = 1'000'000;
constexpr size_t k_max_error_body = 4096;       // bytes of a refusal's body kept for the message
constexpr uint64_t k_max_stream_body = 1ull << 30;  // a stream longer than 1 GiB is broken

// --- URL and prompts -------------------------------------------------------------

struct Target {
  std::string host;
  std::string port;
  std::string base_path;  // "" or "/prefix" (no trailing slash)
};

Result<Target> parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    return invalid_argument("bench serve: --url '" + url + "' must start with http://");
  }
  std::string rest = url.substr(scheme.size());
  Target t;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    t.base_path = rest.substr(slash);
    rest.resize(slash);
    while (!t.base_path.empty() && t.base_path.back() == '/') t.base_path.pop_back();
  }
  Result<HostPort> hp = parse_host_port(rest);
  if (!hp.ok()) return invalid_argument("bench serve: --url '" + url + "': " + hp.status().message());
  t.host = hp->host;
  t.port = hp->port == 0 ? "80" : std::to_string(hp->port);
  return t;
}

// Short common English words: each is one token (with its leading space) in the BPE
// vocabularies of SmolLM2, Llama and Mistral, so L words ≈ L prompt tokens.
const char* const k_words[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "was",   "for",   "on",    "with",
    "as",    "at",    "by",    "from",  "this",  "that",  "river", "house", "light", "water",
    "city",  "tree",  "road",  "stone", "night", "day",   "year",  "world", "time",  "man",
    "small", "large", "old",   "new",   "good",  "long",  "high",  "little", "great", "first",
    "went",  "came",  "made",  "said",  "found", "saw",   "took",  "gave",  "told",  "left",
    "red",   "blue",  "green", "black", "white", "cold",  "warm",  "dark",  "open",  "quiet"};

std::string synthetic_prompt(int64_t num_words, uint64_t seed, int64_t index) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index));
  std::uniform_int_distribution<size_t> pick(0, std::size(k_words) - 1);
  std::string prompt;
  prompt.reserve(static_cast<size_t>(num_words) * 6);
  for (int64_t i = 0; i < num_words; ++i) {
    if (i > 0) prompt += ' ';
    prompt += k_words[pick(rng)];
  }
  return prompt;
}

std::string request_body(const BenchServeArgs& args, const std::string& model, int64_t index) {
  const std::string prompt = synthetic_prompt(args.prompt_len, args.seed, index);
  json body = {{"max_tokens", args.max_tokens},
               {"temperature", 0.0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (!model.empty()) body["model"] = model;
  if (args.chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  } else {
    body["prompt"] = prompt;
  }
  if (args.ignore_eos) body["ignore_eos"] = true;
  if (!args.kv_policy.empty() || args.kv_budget > 0) {
    json kv = json::object();
    if (!args.kv_policy.empty()) kv["policy"] = args.kv_policy;
    if (args.kv_budget > 0) kv["budget"] = args.kv_budget;
    body["kv_compression"] = kv;
  }
  return body.dump();
}

// "HTTP 429: queue full" from an OpenAI error body (or its first bytes).
std::string http_error_message(int status, const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  std::string detail = body.substr(0, 200);
  if (j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string()) {
    detail = j["error"]["message"].get<std::string>();
  }
  for (char& c : detail) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return "HTTP " + std::to_string(status) + (detail.empty() ? "" : ": " + detail);
}

// --- one client connection ----------------------------------------------------------

class Connection {
 public:
  Connection(const Target& target, const tcp::resolver::results_type& endpoints,
             const std::string& api_key)
      : target_(target), endpoints_(endpoints), api_key_(api_key), stream_(ioc_) {}

  // POSTs body to path and reads the SSE stream to its end.
  RequestRecord stream_request(const std::string& path, const std::string& body, bool chat,
                               double timeout_s) {
    for (int attempt = 0;; ++attempt) {
      const bool reused = connected_;
      bool stale = false;
      RequestRecord rec = stream_once(path, body, chat, timeout_s, &stale);
      // The server may close an idle keep-alive connection between our requests: retry
      // once on a fresh connection when nothing of the response had arrived.
      if (stale && reused && attempt == 0) continue;
      return rec;
    }
  }

  // GETs path; returns the status (0 on a transport failure) and fills body.
  int get(const std::string& path, double timeout_s, std::string* body) {
    const auto deadline = deadline_after(timeout_s);
    if (!connected_ && !connect(deadline).empty()) return 0;
    http::request<http::empty_body> req{http::verb::get, target_.base_path + path, 11};
    set_common_headers(req);
    stream_.expires_at(deadline);
    if (run([&](auto h) { http::async_write(stream_, req, h); })) return close_and(0);
    http::response_parser<http::string_body> parser;
    parser.body_limit(1 << 20);
    stream_.expires_at(deadline);
    if (run([&](auto h) { http::async_read(stream_, buffer_, parser, h); })) return close_and(0);
    *body = parser.get().body();
    if (!parser.keep_alive()) close();
    return parser.get().result_int();
  }

 private:
  using Clock = net::steady_timer::clock_type;

  static Clock::time_point deadline_after(double s) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // Starts one async op with a completion handler and runs it to completion here.
  template <class Initiate>
  beast::error_code run(Initiate&& initiate) {
    beast::error_code result;
    initiate([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc_.restart();
    ioc_.run();
    return result;
  }

  template <class Request>
  void set_common_headers(Request& req) const {
    req.set(http::field::host, target_.host);
    req.set(http::field::user_agent, "snapserve-bench");
    if (!api_key_.empty()) req.set(http::field::authorization, "Bearer " + api_key_);
    req.keep_alive(true);
  }

  // "" on success, else the error message.
  std::string connect(Clock::time_point deadline) {
    stream_.expires_at(deadline);
    const beast::error_code ec = run([&](auto h) { stream_.async_connect(endpoints_, h); });
    if (ec) {
      close();
      return ec.message();
    }
    connected_ = true;
    return "";
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    buffer_.consume(buffer_.size());
    connected_ = false;
  }
  int close_and(int v) {
    close();
    return v;
  }

  static RequestRecord failure(std::string kind, std::string message) {
    RequestRecord r;
    r.error_kind = std::move(kind);
    r.error = std::move(message);
    return r;
  }

  RequestRecord transport_failure(const beast::error_code& ec, const char* during) {
    close();
    if (ec == beast::error::timeout) return failure("timeout", std::string("timeout during ") + during);
    return failure("transport", std::string(during) + ": " + ec.message());
  }

  RequestRecord stream_once(const std::string& path, const std::string& body, bool chat,
                            double timeout_s, bool* stale) {
    const auto deadline = deadline_after(timeout_s);
    const double t0 = now_seconds();
    if (!connected_) {
      if (std::string err = connect(deadline); !err.empty()) return failure("connect", "connect: " + err);
    }
    http::request<http::string_body> req{http::verb::post, target_.base_path + path, 11};
    set_common_headers(req);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.body() = body;
    req.prepare_payload();

    stream_.expires_at(deadline);
    if (auto ec = run([&](auto h) { http::async_write(stream_, req, h); })) {
      *stale = ec != beast::error::timeout;
      return transport_failure(ec, "write");
    }
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(k_max_stream_body);
    stream_.expires_at(deadline);
    if (auto ec = run([&](auto h) { http::async_read_header(stream_, buffer_, parser, h); })) {
      *stale = ec == http::error::end_of_stream || ec == net::error::eof ||
               ec == net::error::connection_reset;
      return transport_failure(ec, "reading the response header");
    }
    const int status = parser.get().result_int();

    RequestRecord rec;
    SseParser sse;
    std::string error_body;
    bool saw_done = false, saw_usage = false;
    int64_t content_chunks = 0;
    double last_content = 0;
    char buf[16384];
    while (!parser.is_done()) {
      parser.get().body().data = buf;
      parser.get().body().size = sizeof buf;
      stream_.expires_at(deadline);
      beast::error_code ec = run([&](auto h) { http::async_read_some(stream_, buffer_, parser, h); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return transport_failure(ec, "reading the stream");
      const size_t n = sizeof buf - parser.get().body().size;
      const double t = now_seconds();
      if (status != 200) {
        error_body.append(buf, std::min(n, k_max_error_body - std::min(error_body.size(), k_max_error_body)));
        continue;
      }
      for (const std::string& event : sse.feed(std::string_view(buf, n))) {
        const StreamChunk c = parse_stream_chunk(event, chat);
        if (c.done) {
          saw_done = true;
        } else if (c.malformed) {
          close();
          return failure("malformed", "stream: a chunk is not a JSON object: " + event.substr(0, 120));
        } else if (!c.error.empty()) {
          close();
          return failure("stream_error", "stream error: " + c.error);
        } else {
          if (!c.content.empty()) {
            if (content_chunks == 0) {
              rec.has_ttft = true;
              rec.ttft_s = t - t0;
            } else {
              rec.itl_s.push_back(t - last_content);
            }
            last_content = t;
            ++content_chunks;
          }
          if (c.has_usage) {
            saw_usage = true;
            rec.prompt_tokens = c.prompt_tokens;
            rec.output_tokens = c.completion_tokens;
          }
        }
      }
    }
    rec.e2e_s = now_seconds() - t0;
    if (!parser.keep_alive()) close();
    if (status != 200) {
      return failure("http_" + std::to_string(status), http_error_message(status, error_body));
    }
    if (!saw_done) return failure("no_done", "stream ended without data: [DONE]");
    if (!saw_usage) rec.output_tokens = content_chunks;
    rec.success = true;
    return rec;
  }

  Target target_;
  tcp::resolver::results_type endpoints_;
  std::string api_key_;
  net::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  bool connected_ = false;
};

// --- driver --------------------------------------------------------------------

Status validate(const BenchServeArgs& a) {
  if (a.concurrency < 1 || a.concurrency > k_max_concurrency) {
    return invalid_argument("bench serve: --concurrency " + std::to_string(a.concurrency) +
                            " must be in 1.." + std::to_string(k_max_concurrency));
  }
  if (a.requests < 1 || a.requests > k_max_requests) {
    return invalid_argument("bench serve: --requests " + std::to_string(a.requests) +
                            " must be in 1.." + std::to_string(k_max_requests));
  }
  if (a.prompt_len < 1 || a.prompt_len > k_max_prompt_len) {
    return invalid_argument("bench serve: --prompt-len " + std::to_string(a.prompt_len) +
                            " must be in 1.." + std::to_string(k_max_prompt_len));
  }
  if (a.max_tokens < 1) return invalid_argument("bench serve: --max-tokens must be at least 1");
  if (a.kv_budget < 0) return invalid_argument("bench serve: --kv-budget must not be negative");
  if (!(a.timeout_s > 0)) return invalid_argument("bench serve: --timeout must be positive seconds");
  return Status::ok_status();
}

int fail(const std::string& message) {
  std::fprintf(stderr, "snapserve: error: %s\n", message.c_str());
  return 1;
}

// The served model's name from /v1/models, "" when the server does not say.
std::string served_model(Connection& conn, double timeout_s) {
  std::string body;
  if (conn.get("/v1/models", std::min(timeout_s, 30.0), &body) != 200) return "";
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
      j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string()) {
    return j["data"][0]["id"].get<std::string>();
  }
  return "";
}

}  // namespace

void add_bench_subcommand(CLI::App& app, BenchServeArgs& args) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks against a running server");
  bench->require_subcommand(1);
  CLI::App* serve = bench->add_subcommand(
      "serve", "Load-test an OpenAI-compatible server with streaming requests (like `vllm bench serve`)");
  serve->add_option("--url", args.url, "Server base URL (http only)")->capture_default_str();
  serve->add_option("--model", args.model, "Model name to send (default: the server's /v1/models)");
  serve->add_option("--concurrency,-c", args.concurrency, "Concurrent clients, one connection each")
      ->check(CLI::Range(1, k_max_concurrency))
      ->capture_default_str();
  serve->add_option("--prompt-len", args.prompt_len, "Synthetic prompt length in tokens (approximate)")
      ->check(CLI::Range(int64_t{1}, k_max_prompt_len))
      ->capture_default_str();
  serve->add_option("--max-tokens", args.max_tokens, "max_tokens of every request")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  serve->add_option("--requests,-n", args.requests, "Number of requests")
      ->check(CLI::Range(int64_t{1}, k_max_requests))
      ->capture_default_str();
  serve->add_option("--seed", args.seed, "Seed of the synthetic prompts")->capture_default_str();
  serve->add_option("--api-key", args.api_key, "Bearer token")->envname("SNAPSERVE_API_KEY");
  serve->add_option("--kv-policy", args.kv_policy,
                    "kv_compression.policy of every request (full, snapkv, ...)");
  serve->add_option("--kv-budget", args.kv_budget, "kv_compression.budget of every request")
      ->check(CLI::NonNegativeNumber);
  serve->add_flag("--chat", args.chat, "Use /v1/chat/completions (default /v1/completions)");
  serve->add_flag("--ignore-eos", args.ignore_eos, "Ask the server to generate max_tokens tokens");
  serve->add_option("--json", args.json_path, "Also write the summary and per-request values here");
  serve->add_option("--timeout", args.timeout_s, "Per-request timeout in seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

int run_bench_serve(const BenchServeArgs& args) {
  if (Status s = validate(args); !s.ok()) return fail(s.message());
  Result<Target> target = parse_url(args.url);
  if (!target.ok()) return fail(target.status().message());

  net::io_context resolve_ctx;
  tcp::resolver resolver(resolve_ctx);
  beast::error_code ec;
  const tcp::resolver::results_type endpoints = resolver.resolve(target->host, target->port, ec);
  if (ec) return fail("bench serve: cannot resolve '" + target->host + "': " + ec.message());

  std::string model = args.model;
  if (model.empty()) {
    Connection probe(*target, endpoints, args.api_key);
    model = served_model(probe, args.timeout_s);
  }
  const std::string path = args.chat ? "/v1/chat/completions" : "/v1/completions";
  const int clients = static_cast<int>(std::min<int64_t>(args.concurrency, args.requests));
  std::fprintf(stderr,
               "bench serve: %lld requests, concurrency %d, prompt ~%lld tokens, max_tokens %lld, "
               "model '%s' -> http://%s:%s%s%s\n",
               static_cast<long long>(args.requests), clients, static_cast<long long>(args.prompt_len),
               static_cast<long long>(args.max_tokens), model.c_str(), target->host.c_str(),
               target->port.c_str(), target->base_path.c_str(), path.c_str());

  std::vector<std::string> bodies(static_cast<size_t>(args.requests));
  for (int64_t i = 0; i < args.requests; ++i) bodies[static_cast<size_t>(i)] = request_body(args, model, i);

  std::vector<RequestRecord> records(static_cast<size_t>(args.requests));
  std::atomic<int64_t> next{0};
  const double t_start = now_seconds();
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(clients));
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      Connection conn(*target, endpoints, args.api_key);
      for (int64_t i; (i = next.fetch_add(1)) < args.requests;) {
        RequestRecord& rec = records[static_cast<size_t>(i)];
        try {
          rec = conn.stream_request(path, bodies[static_cast<size_t>(i)], args.chat, args.timeout_s);
        } catch (const std::exception& e) {  // Beast/json report through error codes; belt and braces
          rec = RequestRecord{};
          rec.error_kind = "internal";
          rec.error = std::string("internal: ") + e.what();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double duration = now_seconds() - t_start;

  const BenchSummary summary = summarize(records, duration);
  std::fputs(format_summary_table(summary).c_str(), stdout);
  std::fflush(stdout);
  std::map<std::string, std::string> first_error;
  for (const RequestRecord& r : records) {
    if (!r.success) first_error.emplace(r.error_kind, r.error);
  }
  for (const auto& [kind, message] : first_error) {
    std::fprintf(stderr, "bench serve: %lld failed (%s), e.g. %s\n",
                 static_cast<long long>(summary.failures.at(kind.empty() ? "unknown" : kind)),
                 kind.c_str(), message.c_str());
  }
  if (!args.json_path.empty()) {
    std::ofstream out(args.json_path);
    // Error bodies may hold cut UTF-8: replace bad bytes rather than throw.
    out << bench_result_json(summary, records).dump(2, ' ', false, json::error_handler_t::replace)
        << "\n";
    if (!out) return fail("bench serve: cannot write --json file '" + args.json_path + "'");
  }
  if (summary.completed == 0) return fail("bench serve: every request failed");
  return 0;
}

}  // namespace snap
