// tests/e2e/http_client.h over Boost.Beast (call) and POSIX sockets (RawConn).
#include "tests/e2e/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

namespace snap::testing {

namespace {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

bhttp::verb to_beast(http::verb v) {
  switch (v) {
    case http::verb::get: return bhttp::verb::get;
    case http::verb::post: return bhttp::verb::post;
    case http::verb::put: return bhttp::verb::put;
    case http::verb::delete_: return bhttp::verb::delete_;
  }
  return bhttp::verb::get;
}
}  // namespace

Reply call(int port, http::verb method, const std::string& target, const std::string& body, const std::string& api_key,
           int64_t declared_length) {
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
  bhttp::request<bhttp::string_body> req{to_beast(method), target, 11};
  req.set(bhttp::field::host, "127.0.0.1");
  req.set(bhttp::field::content_type, "application/json");
  if (!api_key.empty()) req.set(bhttp::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  if (declared_length >= 0) req.content_length(declared_length);
  bhttp::write(stream, req, ec);  // a server refusing the body may stop reading it: still read the answer
  beast::flat_buffer buf;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(64 << 20);
  bhttp::read(stream, buf, parser, ec);
  if (ec) {
    r.error = "read: " + ec.message();
    return r;
  }
  const auto& res = parser.get();
  r.status = res.result_int();
  r.body = res.body();
  if (auto it = res.find(bhttp::field::retry_after); it != res.end()) r.retry_after = std::string(it->value());
  if (auto it = res.find(bhttp::field::content_type); it != res.end()) r.content_type = std::string(it->value());
  return r;
}

Reply post(int port, const std::string& target, const nlohmann::json& body, const std::string& key) {
  return call(port, http::verb::post, target, body.dump(), key);
}

Reply get_within(int port, const std::string& target, double timeout_s) {
  // Async operations, so that the stream's expiry applies to every step (the sync ones ignore it).
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::flat_buffer buffer;
  bhttp::request<bhttp::empty_body> req{bhttp::verb::get, target, 11};
  req.set(bhttp::field::host, "127.0.0.1");
  bhttp::response<bhttp::string_body> res;
  beast::error_code result;
  stream.expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  stream.async_connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)),
                       [&](beast::error_code ec) {
                         if (ec) {
                           result = ec;
                           return;
                         }
                         bhttp::async_write(stream, req, [&](beast::error_code ec2, size_t) {
                           if (ec2) {
                             result = ec2;
                             return;
                           }
                           bhttp::async_read(stream, buffer, res, [&](beast::error_code ec3, size_t) { result = ec3; });
                         });
                       });
  ioc.run();
  Reply r;
  if (result) {
    r.error = result.message();
    return r;
  }
  r.status = res.result_int();
  r.body = res.body();
  if (auto it = res.find(bhttp::field::content_type); it != res.end()) r.content_type = std::string(it->value());
  return r;
}

RawConn::RawConn(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ok_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

RawConn::~RawConn() { close(); }

bool RawConn::send_all(const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool RawConn::read_some(std::string* into, int timeout_ms) {
  if (fd_ < 0 || !ok_) return false;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return true;
  char buf[4096];
  const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
  if (n <= 0) return false;
  into->append(buf, static_cast<size_t>(n));
  return true;
}

void RawConn::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string raw_post(const std::string& target, const std::string& body) {
  return "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace snap::testing
