// Test helper: a small blocking HTTP/1.1 client for the server tests (one request per
// connection: the reply's status, body and the headers the tests read), and a raw TCP
// connection for partial requests, streams and early hang-ups. Compiled once into
// snap_test_http (tests/e2e/http_client.cpp, Boost.Beast): the test files that include this
// header do not instantiate Beast themselves, which took ~11 s of compiling per file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace snap::testing {

namespace http {
enum class verb { get, post, put, delete_ };
}  // namespace http

struct Reply {
  int status = 0;
  std::string body;
  std::string retry_after;
  std::string content_type;
  std::string error;  // transport failure
  nlohmann::json j() const { return nlohmann::json::parse(body, nullptr, false); }
};

// One request to 127.0.0.1:port (Content-Type application/json; Authorization: Bearer api_key
// when given). declared_length ≥ 0 sends that Content-Length whatever the body's size. The
// reply body may be up to 64 MiB; a connect or read failure is in Reply::error.
Reply call(int port, http::verb method, const std::string& target, const std::string& body = "",
           const std::string& api_key = "", int64_t declared_length = -1);
Reply post(int port, const std::string& target, const nlohmann::json& body, const std::string& key = "");
// A GET that gives up after timeout_s (status 0 then, the reason in error): for a server that
// may hang or not be up yet. (call's reads block until the server answers or closes.)
Reply get_within(int port, const std::string& target, double timeout_s);

// A raw TCP connection to 127.0.0.1:port.
class RawConn {
 public:
  explicit RawConn(int port);
  ~RawConn();
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  bool ok() const { return ok_; }
  bool send_all(const std::string& s);
  // Appends what arrives within timeout_ms (nothing if nothing did); false once the peer closed
  // (or the connection never opened).
  bool read_some(std::string* into, int timeout_ms);
  void close();

 private:
  int fd_ = -1;
  bool ok_ = false;
};

// A POST request's bytes (Host, Content-Type application/json, Content-Length) for a RawConn.
std::string raw_post(const std::string& target, const std::string& body);

}  // namespace snap::testing
