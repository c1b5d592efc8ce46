// The two eval backends (see backends.h): the in-process Engine (one waiting caller per
// request, woken by the request's finished event) and a blocking Beast HTTP/1.1 client,
// one connection per request, every operation bounded by the request's deadline.
#include "eval/longctx/backends.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/host_port.h"
#include "common/sys.h"
#include "coordinator/scheduler/engine.h"

namespace snap::eval {

namespace {

using nlohmann::json;

// --- in-process engine ------------------------------------------------------------------

class EngineBackend final : public EvalBackend {
 public:
  explicit EngineBackend(std::unique_ptr<Engine> e) : engine_(std::move(e)) {}
  ~EngineBackend() override { shutdown(); }

  Result<Completion> complete(const CompletionJob& job) override {
    struct Wait {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      Completion c;
      Status error;
    };
    auto w = std::make_shared<Wait>();
    EngineRequest r;
    r.prompt_ids = job.prompt_ids;
    r.max_tokens = job.max_tokens;
    r.kv_policy = job.policy;  // greedy sampling is the default
    const double t0 = now_seconds();
    auto id = engine_->submit(std::move(r), [w](const EngineEvent& ev) {
      std::lock_guard<std::mutex> lock(w->mu);
      if (ev.kind == EngineEvent::Kind::token) {
        w->c.text += ev.text;
        return;
      }
      w->c.text += ev.text;
      w->c.finish_reason = ev.finish_reason;
      w->c.prompt_tokens = ev.prompt_tokens;
      w->c.completion_tokens = ev.completion_tokens;
      w->c.kv_resident_bytes = ev.kv_resident_bytes;
      w->c.kv_full_equivalent_bytes = ev.kv_full_equivalent_bytes;
      if (ev.finish_reason == "error") w->error = ev.error;
      w->done = true;
      w->cv.notify_all();
    });
    if (!id.ok()) return id.status();
    std::unique_lock<std::mutex> lock(w->mu);
    w->cv.wait(lock, [&] { return w->done; });
    if (!w->error.ok()) return w->error;
    w->c.seconds = now_seconds() - t0;
    return w->c;
  }
  std::string describe() const override { return "engine"; }
  std::string model_name() const override { return engine_->model_name(); }
  void shutdown() override {
    if (engine_ && !stopped_) engine_->shutdown(5);
    stopped_ = true;
  }

 private:
  std::unique_ptr<Engine> engine_;
  bool stopped_ = false;
};

// --- OpenAI-compatible URL ----------------------------------------------------------------

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

struct Target {
  std::string host, port, base;
};

Result<Target> parse_target(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return invalid_argument("--url '" + url + "' must start with http://");
  std::string rest = url.substr(scheme.size());
  Target t;
  if (size_t slash = rest.find('/'); slash != std::string::npos) {
    t.base = rest.substr(slash);
    rest.resize(slash);
    while (!t.base.empty() && t.base.back() == '/') t.base.pop_back();
  }
  auto hp = parse_host_port(rest);
  if (!hp.ok()) return invalid_argument("--url '" + url + "': " + hp.status().message());
  t.host = hp->host;
  t.port = hp->port == 0 ? "80" : std::to_string(hp->port);
  return t;
}

// One request on a fresh connection: (status, body).
Result<std::pair<int, std::string>> http_call(const Target& t, http::verb verb, const std::string& path,
                                              const std::string& body, const std::string& api_key, double timeout_s) {
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    stream.expires_after(timeout);
    stream.connect(resolver.resolve(t.host, t.port));
    http::request<http::string_body> req{verb, t.base + path, 11};
    req.set(http::field::host, t.host);
    req.set(http::field::user_agent, "snapserve-eval");
    req.set(http::field::content_type, "application/json");
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
    if (verb == http::verb::post) {
      req.body() = body;
      req.prepare_payload();
    }
    http::write(stream, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(stream, buf, parser);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    return std::make_pair(static_cast<int>(parser.get().result_int()), parser.get().body());
  } catch (const std::exception& e) {
    return unavailable(t.host + ":" + t.port + path + ": " + e.what());
  }
}

std::string error_detail(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    return j["error"]["message"].get<std::string>();
  }
  return body.substr(0, 200);
}

class UrlBackend final : public EvalBackend {
 public:
  UrlBackend(UrlBackendOptions o, Target t) : o_(std::move(o)), t_(std::move(t)) {}

  Status resolve_model() {
    if (!o_.model.empty()) return {};
    SNAP_ASSIGN_OR_RETURN(auto reply, http_call(t_, http::verb::get, "/v1/models", "", o_.api_key, 30));
    if (reply.first != 200) return unavailable(o_.url + "/v1/models: HTTP " + std::to_string(reply.first));
    const json j = json::parse(reply.second, nullptr, false);
    if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
        !j["data"][0].is_object() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
      return unavailable(o_.url + "/v1/models: no model id in the answer (pass --served-model)");
    }
    o_.model = j["data"][0]["id"].get<std::string>();
    return {};
  }

  Result<Completion> complete(const CompletionJob& job) override {
    json body = {{"model", o_.model}, {"max_tokens", job.max_tokens}, {"temperature", 0.0}, {"seed", 0}};
    if (o_.chat) {
      body["messages"] = json::array({{{"role", "user"}, {"content", job.prompt_text}}});
    } else {
      body["prompt"] = job.prompt_text;
    }
    if (job.send_policy) {
      const KvPolicy& p = job.policy;
      json kv = {{"policy", kv_policy_name(p.kind)}};
      if (p.kind != KvPolicyKind::full) {
        kv["budget"] = p.budget;
        kv["window"] = p.window;
        kv["kernel"] = p.kernel;
        kv["pooling"] = p.pooling == KvPooling::max ? "max" : "avg";
        kv["gqa"] = p.aggregation == GqaAggregation::mean ? "mean" : "max";
        kv["sinks"] = p.num_sink;
      }
      body["kv_compression"] = kv;
    }
    const char* path = o_.chat ? "/v1/chat/completions" : "/v1/completions";
    const double t0 = now_seconds();
    SNAP_ASSIGN_OR_RETURN(auto reply,
                          http_call(t_, http::verb::post, path, body.dump(), o_.api_key, o_.timeout_s));
    if (reply.first != 200) {
      return unavailable(o_.url + path + ": HTTP " + std::to_string(reply.first) + ": " + error_detail(reply.second));
    }
    const json j = json::parse(reply.second, nullptr, false);
    Completion c;
    c.seconds = now_seconds() - t0;
    try {
      const json& choice = j.at("choices").at(0);
      c.text = o_.chat ? choice.at("message").at("content").get<std::string>() : choice.at("text").get<std::string>();
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
        c.finish_reason = choice["finish_reason"].get<std::string>();
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        c.prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
        c.completion_tokens = j["usage"].value("completion_tokens", int64_t{0});
      }
      if (j.contains("kv") && j["kv"].is_object()) {  // snapserve's own statistics
        c.kv_resident_bytes = j["kv"].value("resident_bytes", int64_t{0});
        c.kv_full_equivalent_bytes = j["kv"].value("full_equivalent_bytes", int64_t{0});
      }
    } catch (const json::exception&) {
      return unavailable(o_.url + path + ": the answer has no choices[0] text: " + reply.second.substr(0, 200));
    }
    return c;
  }
  std::string describe() const override { return o_.url; }
  std::string model_name() const override { return o_.model; }

 private:
  UrlBackendOptions o_;
  Target t_;
};

}  // namespace

Result<std::unique_ptr<EvalBackend>> make_engine_backend(const EngineBackendOptions& o) {
  EngineConfig cfg;
  cfg.model_path = o.model_path;
  cfg.threads = o.threads;
  cfg.kv_cache_bytes = o.kv_cache_mib << 20;
  cfg.max_num_seqs = o.max_num_seqs;
  cfg.max_waiting = int64_t{1} << 40;  // the runner bounds what is in flight
  cfg.prefill_chunk = o.prefill_chunk;
  cfg.kv_dtype = o.kv_dtype;
  SNAP_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(cfg, nullptr));
  return std::unique_ptr<EvalBackend>(new EngineBackend(std::move(engine)));
}

Result<std::unique_ptr<EvalBackend>> make_url_backend(const UrlBackendOptions& o) {
  SNAP_ASSIGN_OR_RETURN(Target t, parse_target(o.url));
  auto b = std::make_unique<UrlBackend>(o, t);
  SNAP_RETURN_IF_ERROR(b->resolve_model());
  return std::unique_ptr<EvalBackend>(std::move(b));
}

}  // namespace snap::eval
