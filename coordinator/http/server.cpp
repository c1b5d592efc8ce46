// HttpServer on Boost.Beast: one io_context run by a fixed pool of I/O threads, one
// asynchronous Session per connection on its own strand (so a session's handlers never run
// concurrently and need no locks). Chosen over thread-per-connection because SSE streams
// are long-lived: 256 idle streams cost 256 small objects, not 256 stacks.
// Engine events arrive on the engine thread; the EventSink only posts them to the
// session's strand (never blocks), where they are framed and queued for writing.
#include "coordinator/http/server.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "coordinator/http/openai.h"

namespace snap {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

constexpr size_t k_header_limit = 16 * 1024;
constexpr auto k_peer_check_interval = std::chrono::milliseconds(200);
constexpr double k_close_grace_seconds = 2.0;
constexpr double k_linger_seconds = 2.0;
constexpr int64_t k_linger_bytes = 8 << 20;

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// Compares in time independent of where the strings differ.
bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned diff = static_cast<unsigned>(a.size() ^ b.size());
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

using Headers = std::vector<std::pair<std::string, std::string>>;

// A whole response; `head_only` (HEAD) keeps the Content-Length of `body` but sends no body.
std::string serialize_response(unsigned version, int status, const char* content_type, std::string body,
                               bool keep_alive, const Headers& extra, bool head_only) {
  http::response<http::string_body> res{static_cast<http::status>(status), version};
  res.set(http::field::server, "snapserve");
  if (status != 204) res.set(http::field::content_type, content_type);
  for (const auto& [name, value] : extra) res.set(name, value);
  res.keep_alive(keep_alive);
  if (head_only) {
    res.content_length(body.size());
  } else {
    res.body() = std::move(body);
    res.prepare_payload();
  }
  std::ostringstream os;
  os << res;
  return os.str();
}

// "/v1/models/ID" with %XX escapes decoded (a model id may contain '/').
std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string hex_size(size_t n) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%zx", n);
  return buf;
}

}  // namespace

// --- shared state ------------------------------------------------------------

struct HttpServer::State {
  HttpServerConfig cfg;
  Engine* engine = nullptr;
  ServerMetrics* metrics = nullptr;
  ApiContext api;
  int64_t started = 0;  // /v1/models "created"

  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  tcp::acceptor acceptor{net::make_strand(ioc)};
  int port = 0;
  std::vector<std::thread> threads;

  std::atomic<int> connections{0};
  std::atomic<bool> stopping{false};
  bool stopped = false;
  std::mutex sessions_mu;
  std::map<void*, std::function<void()>> close_idle;  // per live session: close it if idle
};

namespace {

using State = HttpServer::State;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<State> state, tcp::socket socket, bool counted)
      : state_(std::move(state)), stream_(std::move(socket)), peer_timer_(stream_.get_executor()), counted_(counted) {
    if (counted_) state_->connections.fetch_add(1);
  }
  ~Session() {
    if (!counted_) return;
    {
      std::lock_guard<std::mutex> lock(state_->sessions_mu);
      state_->close_idle.erase(this);
    }
    state_->connections.fetch_sub(1);
  }

  void start() {
    auto self = shared_from_this();
    {
      std::lock_guard<std::mutex> lock(state_->sessions_mu);
      std::weak_ptr<Session> weak = self;
      state_->close_idle[this] = [weak] {
        if (auto s = weak.lock()) net::post(s->stream_.get_executor(), [s] { s->close_if_idle(); });
      };
    }
    net::dispatch(stream_.get_executor(), [self] { self->do_read(); });
  }

  // Too many connections: answer 503 and close without reading.
  void reject() {
    auto self = shared_from_this();
    net::dispatch(stream_.get_executor(), [self] {
      self->keep_alive_ = false;
      self->send_error(ApiError{ApiErrorKind::unavailable, "too many connections; retry later", ""});
    });
  }

 private:
  // --- reading
  void do_read() {
    if (closed_) return;
    parser_.emplace();
    route_ = "other";
    parser_->body_limit(static_cast<uint64_t>(state_->cfg.max_body_bytes));
    parser_->header_limit(k_header_limit);
    stream_.expires_after(seconds(state_->cfg.read_timeout_seconds));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      return send_error({ApiErrorKind::payload_too_large,
                         "request body exceeds " + std::to_string(state_->cfg.max_body_bytes) + " bytes", ""});
    }
    if (ec == http::error::header_limit) {
      keep_alive_ = false;
      return send_error({ApiErrorKind::payload_too_large,
                         "request headers exceed " + std::to_string(k_header_limit) + " bytes", ""});
    }
    if (ec) {
      // Timeout (slowloris), end of stream, reset: nothing sensible to answer.
      const bool http_syntax = ec.category() == http::make_error_code(http::error::bad_method).category();
      if (http_syntax && ec != http::error::end_of_stream && ec != http::error::partial_message) {
        keep_alive_ = false;
        return send_error({ApiErrorKind::bad_request, "malformed HTTP request: " + ec.message(), ""});
      }
      return close();
    }
    stream_.expires_never();
    handle_request(parser_->release());
  }

  // --- routing
  void handle_request(http::request<http::string_body> req) {
    version_ = req.version();
    keep_alive_ = req.keep_alive() && !state_->stopping.load();
    std::string path(req.target());
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    http::verb method = req.method();
    for (const char* known : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}) {
      if (path == known) route_ = known;
    }
    const bool model_path = path.rfind("/v1/models/", 0) == 0 && path.size() > 11;
    if (model_path) route_ = "/v1/models";
    extra_headers_.clear();
    head_only_ = false;
    // CORS: an allowed Origin gets Access-Control-Allow-Origin on every answer.
    const auto origin = req.find(http::field::origin);
    const bool cors = origin != req.end() && origin_allowed(std::string(origin->value()));
    if (cors) {
      const bool any = std::find(state_->cfg.allowed_origins.begin(), state_->cfg.allowed_origins.end(), "*") !=
                       state_->cfg.allowed_origins.end();
      extra_headers_.emplace_back("Access-Control-Allow-Origin", any ? "*" : std::string(origin->value()));
      if (!any) extra_headers_.emplace_back("Vary", "Origin");
    }
    const bool get_route = path == "/health" || path == "/metrics" || path == "/v1/models" || model_path;
    const bool post_route = path == "/v1/completions" || path == "/v1/chat/completions";
    if (method == http::verb::options) {  // preflight: no API key (browsers send none)
      if (!get_route && !post_route) return send_error({ApiErrorKind::route_not_found, "no route for " + path, ""});
      const char* allow = get_route ? "GET, HEAD, OPTIONS" : "POST, OPTIONS";
      extra_headers_.emplace_back("Allow", allow);
      if (cors) {
        extra_headers_.emplace_back("Access-Control-Allow-Methods", allow);
        extra_headers_.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type");
        extra_headers_.emplace_back("Access-Control-Max-Age", "600");
      }
      return send_body(204, "text/plain", "");
    }
    if (method == http::verb::head && get_route) {  // a GET without the body
      head_only_ = true;
      method = http::verb::get;
    }

    if (path.rfind("/v1/", 0) == 0 && !state_->cfg.api_key.empty() && !authorized(req)) {
      return send_error({ApiErrorKind::unauthorized, "missing or invalid API key (send Authorization: Bearer KEY)", ""});
    }
    auto wrong_method = [&](const char* allowed) {
      last_allow_ = allowed;
      send_error({ApiErrorKind::method_not_allowed,
                  "method " + std::string(req.method_string()) + " is not allowed on " + path + " (use " + allowed + ")",
                  ""});
    };
    if (path == "/health") {
      if (method != http::verb::get) return wrong_method("GET");
      if (state_->stopping.load() || !state_->engine->healthy()) {
        return send_error({ApiErrorKind::unavailable, "the engine is not healthy", ""});
      }
      return send_body(200, "application/json", "{\"status\":\"ok\"}");
    }
    if (path == "/metrics") {
      if (method != http::verb::get) return wrong_method("GET");
      if (!state_->metrics) return send_error({ApiErrorKind::route_not_found, "metrics are disabled", ""});
      return send_body(200, "text/plain; version=0.0.4; charset=utf-8", state_->metrics->serialize());
    }
    if (path == "/v1/models") {
      if (method != http::verb::get) return wrong_method("GET");
      return send_body(200, "application/json", models_response(state_->api.model_name, state_->started));
    }
    if (model_path) {
      if (method != http::verb::get) return wrong_method("GET");
      const std::string id = percent_decode(path.substr(11));
      if (id != state_->api.model_name) {
        return send_error({ApiErrorKind::model_not_found,
                           "The model `" + id + "` does not exist (serving `" + state_->api.model_name + "`)", ""});
      }
      return send_body(200, "application/json", model_response(state_->api.model_name, state_->started));
    }
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      if (method != http::verb::post) return wrong_method("POST");
      if (state_->stopping.load()) return send_error({ApiErrorKind::unavailable, "the server is shutting down", ""});
      const ApiRoute route = path == "/v1/completions" ? ApiRoute::completions : ApiRoute::chat_completions;
      return submit(route, req.body());
    }
    if (path == PerspectiveHandler::k_path && state_->cfg.perspective) {
      if (method != http::verb::post) return wrong_method("POST");
      const PerspectiveReply r = state_->cfg.perspective->analyze(std::string(req.target()), req.body());
      return send_body(r.status, "application/json", r.body);
    }
    send_error({ApiErrorKind::route_not_found, "no route for " + path, ""});
  }

  bool origin_allowed(const std::string& origin) const {
    for (const std::string& o : state_->cfg.allowed_origins) {
      if (o == "*" || o == origin) return true;
    }
    return false;
  }

  bool authorized(const http::request<http::string_body>& req) const {
    auto it = req.find(http::field::authorization);
    if (it == req.end()) return false;
    const std::string value(it->value());
    if (value.size() < 7 || !beast::iequals(value.substr(0, 7), "Bearer ")) return false;
    return constant_time_equal(value.substr(7), state_->cfg.api_key);
  }

  // --- engine requests
  void submit(ApiRoute route, const std::string& body) {
    ApiParse parsed = parse_api_request(route, body, state_->api);
    if (parsed.error) return send_error(*parsed.error);
    meta_ = api_response_meta(parsed.request, state_->api.model_name);
    streaming_ = parsed.request.stream;
    include_usage_ = parsed.request.include_usage;
    ++generation_;  // events of an earlier request on this connection are ignored
    n_ = parsed.request.engine.n;
    choices_.assign(static_cast<size_t>(parsed.request.num_choices()), ApiChoice{});
    pending_ = parsed.request.num_choices();
    first_error_.reset();
    engine_ids_.clear();
    // echo: every choice starts with its prompt; with logprobs the prompt's tokens come first.
    echo_ = parsed.request.echo;
    echo_prompts_.clear();
    if (echo_) {
      for (size_t i = 0; i < choices_.size(); ++i) choices_[i].text = parsed.request.prompt_texts[i / static_cast<size_t>(n_)];
      if (meta_.logprobs >= 0) {
        echo_prompts_.push_back(parsed.request.engine.prompt_ids);
        for (const auto& more : parsed.request.more_prompts) echo_prompts_.push_back(more);
      }
    }
    // One engine request per prompt (each with its n choices); choice index p * n + c.
    std::vector<std::vector<int32_t>> more = std::move(parsed.request.more_prompts);
    const int prompts = 1 + static_cast<int>(more.size());
    for (int p = 0; p < prompts; ++p) {
      EngineRequest r = p + 1 < prompts ? parsed.request.engine : std::move(parsed.request.engine);
      if (p > 0) r.prompt_ids = std::move(more[p - 1]);
      // Runs on the engine thread: post and return.
      EventSink sink = [self = shared_from_this(), gen = generation_, p](const EngineEvent& ev) {
        net::post(self->stream_.get_executor(), [self, gen, p, ev] { self->on_event(gen, p, ev); });
      };
      auto id = state_->engine->submit(std::move(r), std::move(sink));
      if (!id.ok()) {
        for (uint64_t done : engine_ids_) state_->engine->cancel(done);  // their events are now stale
        ++generation_;
        engine_ids_.clear();
        const ApiError err = api_error_from_status(id.status());
        if (err.kind == ApiErrorKind::too_many_requests) return send_error(err, "Retry-After", "1");
        return send_error(err);
      }
      engine_ids_.push_back(id.value());
    }
    in_flight_ = true;
    if (streaming_) {
      const bool chunked = version_ >= 11;
      chunked_ = chunked;
      if (!chunked) keep_alive_ = false;
      std::string head = "HTTP/1." + std::to_string(version_ % 10) + " 200 OK\r\nServer: snapserve\r\n"
                         "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
      head += chunked ? "Transfer-Encoding: chunked\r\n" : "";
      for (const auto& [name, value] : extra_headers_) head += name + ": " + value + "\r\n";
      head += keep_alive_ ? (version_ >= 11 ? "" : "Connection: keep-alive\r\n") : "Connection: close\r\n";
      head += "\r\n";
      count_response(200);
      enqueue(std::move(head));
      if (meta_.route == ApiRoute::chat_completions) {
        for (size_t i = 0; i < choices_.size(); ++i) send_sse(stream_chunk(meta_, "", true, "", {}, static_cast<int>(i)));
      }
      if (echo_) {
        for (size_t i = 0; i < choices_.size(); ++i) send_sse(stream_chunk(meta_, choices_[i].text, false, "", {}, static_cast<int>(i)));
      }
    }
    arm_peer_check();
  }

  void on_event(uint64_t gen, int prompt, const EngineEvent& ev) {
    if (gen != generation_) return;
    const size_t i = static_cast<size_t>(prompt * n_ + ev.index);
    if (i >= choices_.size()) return;
    const bool finished = ev.kind == EngineEvent::Kind::finished;
    if (finished && --pending_ == 0) {
      in_flight_ = false;
      peer_timer_.cancel();
    }
    if (closed_) return;
    ApiChoice& c = choices_[i];
    if (!finished) {
      // Logprobs of output tokens only (not of the EOS / stop token that ended the output).
      std::vector<ApiLogprob> lp;
      if (meta_.logprobs >= 0 && !ev.stop_token) lp.push_back(api_logprob(*state_->api.tokenizer, ev));
      if (!streaming_) {
        c.text += ev.text;
        c.logprobs.insert(c.logprobs.end(), lp.begin(), lp.end());
      } else if (!ev.text.empty() || !lp.empty()) {
        send_sse(stream_chunk(meta_, ev.text, false, "", lp, static_cast<int>(i)));
      }
      return;
    }
    // The finished event carries the text held back for a possible stop string (and the
    // decoder's last bytes): it belongs to the completion.
    c.finished = ev;
    if (ev.finish_reason == "error" && !first_error_) {
      first_error_ = ev.error;
      for (uint64_t id : engine_ids_) state_->engine->cancel(id);  // the response is an error now
    }
    if (!streaming_) {
      c.text += ev.text;
      if (pending_ > 0) return;
      if (first_error_) return send_error(api_error_from_status(*first_error_));
      if (!echo_prompts_.empty()) {  // the echoed prompt's logprobs (from each prompt's choice 0) first
        for (size_t k = 0; k < choices_.size(); ++k) {
          const size_t p = k / static_cast<size_t>(n_);
          std::vector<ApiLogprob> all = api_prompt_logprobs(*state_->api.tokenizer, echo_prompts_[p],
                                                            choices_[p * static_cast<size_t>(n_)].finished.prompt_logprobs);
          all.insert(all.end(), choices_[k].logprobs.begin(), choices_[k].logprobs.end());
          choices_[k].logprobs = std::move(all);
        }
      }
      return send_body(200, "application/json", completion_response(meta_, choices_, n_));
    }
    if (ev.finish_reason == "error") {
      send_sse(api_error_body(api_error_from_status(ev.error)));
    } else {
      if (!ev.text.empty()) send_sse(stream_chunk(meta_, ev.text, false, "", {}, static_cast<int>(i)));
      send_sse(stream_finish_chunk(meta_, ev, static_cast<int>(i)));
    }
    if (pending_ > 0) return;
    if (include_usage_ && !first_error_) send_sse(stream_usage_chunk(meta_, choices_, n_));
    send_sse("[DONE]");
    if (chunked_) enqueue("0\r\n\r\n");
    response_done_ = true;
    if (!writing_) after_response();
  }

  // Polls the socket while a request runs: EOF or an error means the client left.
  void arm_peer_check() {
    peer_timer_.expires_after(k_peer_check_interval);
    peer_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->in_flight_ || self->closed_) return;
      if (self->peer_gone()) return self->client_gone();
      self->arm_peer_check();
    });
  }

  // EOF or an error on the socket (without consuming what the client may have sent).
  bool peer_gone() {
    char c;
    const ssize_t r = ::recv(stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  void client_gone() {
    if (closed_) return;
    if (in_flight_) {
      for (uint64_t id : engine_ids_) state_->engine->cancel(id);
    }
    close();
  }

  // --- writing
  void send_sse(const std::string& payload) {
    std::string event = sse_event(payload);
    if (chunked_) event = hex_size(event.size()) + "\r\n" + event + "\r\n";
    enqueue(std::move(event));
  }

  void send_body(int status, const char* content_type, std::string body, const char* extra_name = nullptr,
                 const char* extra_value = nullptr) {
    count_response(status);
    Headers headers = extra_headers_;
    if (extra_name) headers.emplace_back(extra_name, extra_value);
    enqueue(serialize_response(version_, status, content_type, std::move(body), keep_alive_, headers, head_only_));
    response_done_ = true;
    if (!writing_) do_write();
  }

  void count_response(int status) {
    if (state_->metrics) state_->metrics->add_http_response(route_, status);
  }

  void send_error(const ApiError& err, const char* extra_name = nullptr, const char* extra_value = nullptr) {
    const int status = api_error_info(err.kind).http_status;
    if (status == 405) {
      extra_name = "Allow";
      extra_value = last_allow_;
    }
    send_body(status, "application/json", api_error_body(err), extra_name, extra_value);
  }

  void enqueue(std::string bytes) {
    if (closed_) return;
    outbox_.push_back(std::move(bytes));
    if (!writing_) do_write();
  }

  void do_write() {
    if (closed_) return;
    if (outbox_.empty()) {
      if (response_done_) after_response();
      return;
    }
    writing_ = true;
    if (state_->cfg.fault_peer_check_before_write && in_flight_) {
      net::post(stream_.get_executor(), [self = shared_from_this()] {
        if (self->in_flight_ && !self->closed_ && self->peer_gone()) self->client_gone();
      });
    }
    stream_.expires_after(seconds(state_->cfg.write_timeout_seconds));
    net::async_write(stream_, net::buffer(outbox_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    // close() ran while this write was in flight (the peer check found the client gone): it
    // kept the event being written and dropped the rest; the write may still have succeeded.
    if (closed_) return outbox_.clear();
    if (ec) return client_gone();
    outbox_.pop_front();
    do_write();
  }

  void after_response() {
    if (closed_ || writing_ || !outbox_.empty()) return;
    response_done_ = false;
    streaming_ = chunked_ = false;
    if (keep_alive_ && !state_->stopping.load()) return do_read();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    linger();
  }

  // Lingering close: after answering a request whose body we did not read (413, a parse
  // error), closing at once would reset the connection and the client could lose our
  // answer; read and discard what it still sends, for a bounded time and size, first.
  void linger() {
    if (closed_) return;
    if (lingered_bytes_ > k_linger_bytes) return close();
    if (lingered_bytes_ == 0) stream_.expires_after(seconds(k_linger_seconds));
    stream_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->close();
      self->lingered_bytes_ += static_cast<int64_t>(n) + 1;
      self->linger();
    });
  }

  void close_if_idle() {
    keep_alive_ = false;
    if (!in_flight_ && !writing_ && outbox_.empty()) close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    // A write in flight still reads outbox_.front(); on_write drops it.
    outbox_.erase(writing_ && !outbox_.empty() ? outbox_.begin() + 1 : outbox_.begin(), outbox_.end());
    peer_timer_.cancel();
    beast::error_code ec;
    stream_.socket().close(ec);
  }

  std::shared_ptr<State> state_;  // first: destroyed last
  beast::tcp_stream stream_;
  net::steady_timer peer_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool counted_;

  unsigned version_ = 11;
  bool keep_alive_ = true;
  const char* last_allow_ = "GET";
  const char* route_ = "other";  // the metrics label of the request being answered
  ApiResponseMeta meta_;
  std::vector<uint64_t> engine_ids_;  // one per prompt of the request
  uint64_t generation_ = 0;           // requests answered on this connection
  int n_ = 1;                         // choices per prompt
  std::vector<ApiChoice> choices_;    // prompt * n + choice
  int pending_ = 0;                   // choices not finished yet
  std::optional<Status> first_error_;
  bool echo_ = false;
  std::vector<std::vector<int32_t>> echo_prompts_;  // echo with logprobs: each prompt's ids
  bool in_flight_ = false;
  bool streaming_ = false;
  bool chunked_ = false;
  bool include_usage_ = false;
  Headers extra_headers_;  // CORS and Allow headers of the current answer
  bool head_only_ = false;  // HEAD: headers only
  std::deque<std::string> outbox_;
  bool writing_ = false;
  bool response_done_ = false;
  bool closed_ = false;
  std::array<char, 16384> scratch_;
  int64_t lingered_bytes_ = 0;
};

void do_accept(const std::shared_ptr<State>& state) {
  state->acceptor.async_accept(net::make_strand(state->ioc), [state](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !state->acceptor.is_open()) return;
      return do_accept(state);  // e.g. EMFILE: keep serving the connections we have
    }
    if (state->connections.load() >= state->cfg.max_connections) {
      std::make_shared<Session>(state, std::move(socket), false)->reject();
    } else {
      std::make_shared<Session>(state, std::move(socket), true)->start();
    }
    do_accept(state);
  });
}

}  // namespace

// --- HttpServer ----------------------------------------------------------------

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerConfig& cfg, Engine* engine,
                                                      ServerMetrics* metrics) {
  CHECK(engine != nullptr) << "HttpServer needs an engine";
  if (cfg.io_threads < 1) return invalid_argument("http: io_threads must be >= 1");
  if (cfg.max_body_bytes < 1) return invalid_argument("http: max body bytes must be >= 1");
  if (cfg.max_connections < 1) return invalid_argument("http: max connections must be >= 1");
  if (cfg.port < 0 || cfg.port > 65535) return invalid_argument("http: port " + std::to_string(cfg.port) + " out of range");
  auto state = std::make_shared<State>();
  state->cfg = cfg;
  state->engine = engine;
  state->metrics = metrics;
  const int64_t context = cfg.context_length > 0 ? cfg.context_length : engine->model_config().max_position;
  state->api.tokenizer = &engine->tokenizer();
  state->api.model_name = engine->model_name();
  state->api.context_length = context;
  state->api.max_prompt_tokens = cfg.max_prompt_tokens > 0 ? cfg.max_prompt_tokens : std::max<int64_t>(1, context - 1);
  state->api.max_tokens_limit = cfg.max_tokens_limit > 0 ? cfg.max_tokens_limit : context;
  state->api.timeout_seconds = cfg.request_timeout_seconds;
  state->started = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();

  beast::error_code ec;
  tcp::resolver resolver(state->ioc);
  auto endpoints = resolver.resolve(cfg.host, std::to_string(cfg.port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) return invalid_argument("http: cannot resolve host '" + cfg.host + "': " + ec.message());
  const tcp::endpoint ep = endpoints.begin()->endpoint();
  tcp::acceptor& acc = state->acceptor;
  if (acc.open(ep.protocol(), ec); ec) return internal_error("http: socket: " + ec.message());
  if (acc.set_option(net::socket_base::reuse_address(true), ec); ec) return internal_error("http: SO_REUSEADDR: " + ec.message());
  if (acc.bind(ep, ec); ec) {
    return invalid_argument("http: cannot bind " + cfg.host + ":" + std::to_string(cfg.port) + ": " + ec.message());
  }
  if (acc.listen(net::socket_base::max_listen_connections, ec); ec) return internal_error("http: listen: " + ec.message());
  state->port = acc.local_endpoint().port();

  do_accept(state);
  state->work.emplace(state->ioc.get_executor());
  for (int i = 0; i < cfg.io_threads; ++i) state->threads.emplace_back([s = state.get()] { s->ioc.run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(state)));
}

int HttpServer::port() const { return state_->port; }

void HttpServer::stop(double deadline_seconds) {
  State& s = *state_;
  if (s.stopped) return;
  s.stopped = true;
  s.stopping.store(true);
  std::promise<void> closed;
  net::post(s.acceptor.get_executor(), [&] {
    beast::error_code ec;
    s.acceptor.close(ec);
    closed.set_value();
  });
  closed.get_future().wait();
  // Running requests finish (their events are written by the I/O threads) or are cancelled.
  s.engine->shutdown(deadline_seconds);
  const auto until = std::chrono::steady_clock::now() + seconds(k_close_grace_seconds);
  while (s.connections.load() > 0 && std::chrono::steady_clock::now() < until) {
    std::vector<std::function<void()>> closers;
    {
      std::lock_guard<std::mutex> lock(s.sessions_mu);
      for (auto& [key, fn] : s.close_idle) closers.push_back(fn);
    }
    for (auto& fn : closers) fn();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  s.work.reset();
  if (s.connections.load() > 0) s.ioc.stop();  // a client that would not leave
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

HttpServer::~HttpServer() { stop(0); }

}  // namespace snap
