// Internal to comm/: the blocking-with-deadline socket helpers shared by the TCP
// rendezvous (rendezvous.cpp) and the TCP communicator (tcp.cpp). Every wait is bounded
// by a deadline; results are ok, timeout or closed (the peer went away or an error).
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <endian.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>

#include "common/status.h"

namespace snap::comm::detail {

using Clock = std::chrono::steady_clock;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() { reset(); }
  int fd() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

enum class Io { ok, timeout, closed };

inline int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

inline Io wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return (p.revents & (events | POLLHUP | POLLERR)) ? Io::ok : Io::closed;
    if (n == 0) return Io::timeout;
    if (errno != EINTR) return Io::closed;
  }
}

inline Io send_all(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    if (Io w = wait_fd(fd, POLLOUT, deadline); w != Io::ok) return w;
    const ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return Io::closed;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Io::ok;
}

inline Io recv_all(int fd, void* data, size_t len, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    if (Io w = wait_fd(fd, POLLIN, deadline); w != Io::ok) return w;
    const ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return Io::closed;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Io::ok;
}

inline Io send_words(int fd, std::initializer_list<uint32_t> words, Clock::time_point deadline) {
  uint32_t buf[4];
  size_t n = 0;
  for (uint32_t w : words) buf[n++] = htole32(w);
  return send_all(fd, buf, n * 4, deadline);
}

inline Io recv_words(int fd, uint32_t* words, size_t n, Clock::time_point deadline) {
  Io r = recv_all(fd, words, n * 4, deadline);
  for (size_t i = 0; i < n; ++i) words[i] = le32toh(words[i]);
  return r;
}

// "30 s", "2.5 s"
inline std::string seconds_text(std::chrono::milliseconds t) {
  char buf[32];
  if (t.count() % 1000 == 0) {
    std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(t.count() / 1000));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(t.count()) / 1000.0);
  }
  return buf;
}

// A listening socket on `port` of every interface: dual-stack where IPv6 exists, IPv4
// otherwise. On failure the socket is closed (fd < 0) and *error says why.
inline Socket listen_any(int port, int backlog, std::string* error) {
  Socket s(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  const int zero = 0;
  int rc = -1;
  if (s.fd() >= 0) {
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0) {
    s = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.fd() < 0) {
      *error = std::string("socket: ") + std::strerror(errno);
      return s;
    }
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      *error = "rank 0 cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno);
      return Socket();
    }
  }
  if (::listen(s.fd(), backlog) != 0) {
    *error = std::string("listen: ") + std::strerror(errno);
    return Socket();
  }
  return s;
}

// One non-blocking connect attempt bounded by the deadline (TCP_NODELAY set); the reason
// on failure. A name
// that does not resolve yet is retried too: a Kubernetes leader's DNS entry appears late.
inline Result<Socket> try_connect(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) return internal_error("cannot resolve " + host + ": " + gai_strerror(gai));
  std::string last = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (s.fd() < 0) continue;
    int rc = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_fd(s.fd(), POLLOUT, deadline) != Io::ok) {
        last = "connect timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      ::freeaddrinfo(res);
      const int nodelay = 1;
      ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
      return s;
    }
    last = std::strerror(errno);
  }
  ::freeaddrinfo(res);
  return internal_error(last);
}

}  // namespace snap::comm::detail
