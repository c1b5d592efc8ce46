// HttpServer: the OpenAI-compatible HTTP/1.1 front-end of `snapserve serve` on Boost.Beast.
// Routes: POST /v1/completions, POST /v1/chat/completions (both with SSE streaming),
// GET /v1/models, GET /health, GET /metrics. Limits: read timeout per request (slowloris),
// body size (413), concurrent connections (503), optional API key on /v1/* (401).
// A client that disconnects while its request runs gets the request cancelled.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/http/perspective.h"
#include "coordinator/metrics/metrics.h"
#include "coordinator/scheduler/engine.h"

namespace snap {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0: the kernel picks a free port (see HttpServer::port())
  int io_threads = 2;                 // threads running the asynchronous sessions
  std::string api_key;                // empty: no authentication
  int64_t max_body_bytes = 1 << 20;   // larger bodies get 413
  int max_connections = 256;          // connections beyond get 503 and are closed
  double read_timeout_seconds = 10;   // whole request (headers + body), idle keep-alive included
  double write_timeout_seconds = 60;  // one write to a client that stopped reading
  double request_timeout_seconds = 600;  // engine-side limit per request; 0: none
  int64_t context_length = 0;         // prompt + max_tokens bound; 0: the model's context
  int64_t max_prompt_tokens = 0;      // 0: context_length - 1
  int64_t max_tokens_limit = 0;       // 0: context_length
  // CORS: origins whose browsers may call the API ("*": any). Empty: no CORS headers.
  std::vector<std::string> allowed_origins;
  // POST /v1alpha1/comments:analyze (Perspective-compatible) when set; must outlive the server.
  const PerspectiveHandler* perspective = nullptr;
  // Fault injection for tests (serve sets it when $SNAP_FAULT_PEER_CHECK_BEFORE_WRITE is 1):
  // while a request runs, every write is preceded by a check whether the client left, queued
  // on the session's strand ahead of the write's completion: the worst moment for the
  // periodic check to find a client gone.
  bool fault_peer_check_before_write = false;
};

class HttpServer {
 public:
  // Binds, listens and starts the I/O threads. engine (and metrics, may be null) must
  // outlive the server.
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerConfig& cfg, Engine* engine,
                                                   ServerMetrics* metrics);
  ~HttpServer();  // stop(0) when still running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;  // the bound port (the chosen one when configured with 0)
  // Stops accepting, calls engine->shutdown(deadline_seconds) (running requests finish or
  // are cancelled), lets their responses flush, closes idle connections, joins the threads.
  void stop(double deadline_seconds);

  struct State;

 private:
  explicit HttpServer(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace snap
