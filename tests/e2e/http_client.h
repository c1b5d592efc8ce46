// Test helper: a small blocking HTTP/1.1 client over Boost.Beast for the server tests —
// one request per connection, the reply's status, body and the headers the tests read.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace snap::testing {

namespace http_client_detail {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

struct Reply {
  int status = 0;
  std::string body;
  std::string retry_after;
  std::string content_type;
  std::string error;  // transport failure
  json j() const { return json::parse(body, nullptr, false); }
};

inline Reply call(int port, http::verb method, const std::string& target, const std::string& body = "",
           const std::string& api_key = "", int64_t declared_length = -1) {
  Reply r;
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  stream.expires_after(std::chrono::seconds(120));
  stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)), ec);
  if (ec) {
    r.error = "connect: " + ec.message();
    return r;
  }
  http::request<http::string_body> req{method, target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  if (declared_length >= 0) req.content_length(declared_length);
  http::write(stream, req, ec);  // a server refusing the body may stop reading it: still read the answer
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  http::read(stream, buf, parser, ec);
  if (ec) {
    r.error = "read: " + ec.message();
    return r;
  }
  const auto& res = parser.get();
  r.status = res.result_int();
  r.body = res.body();
  if (auto it = res.find(http::field::retry_after); it != res.end()) r.retry_after = std::string(it->value());
  if (auto it = res.find(http::field::content_type); it != res.end()) r.content_type = std::string(it->value());
  return r;
}

inline Reply post(int port, const std::string& target, const json& body, const std::string& key = "") {
  return call(port, http::verb::post, target, body.dump(), key);
}
}  // namespace http_client_detail

using http_client_detail::call;
using http_client_detail::post;
using http_client_detail::Reply;

}  // namespace snap::testing
