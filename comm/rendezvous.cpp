// TCP rendezvous for launchers without MPI (Kubernetes LeaderWorkerSet, explicit flags):
// rank 0 listens, the others connect with retries; rank 0 sends its blob (the NCCL unique
// id) to all, then a barrier. Every wait is bounded by one deadline (see comm/bootstrap.h).
// Wire, all little-endian u32: hello = {magic, rank, world_size}; reply = {magic, verdict,
// blob length} + blob; ack = {magic}; go = {magic}. A connection whose hello has a wrong
// magic (a port probe) is dropped and the leader keeps waiting.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "comm/bootstrap.h"
#include "comm/socket_io.h"

namespace snap::comm {

namespace {

using namespace detail;  // Socket, Io, send_all, recv_all, ... (socket_io.h)
constexpr uint32_t k_magic = 0x534e4150;  // "SNAP"
constexpr uint32_t k_verdict_ok = 0;
constexpr uint32_t k_verdict_bad_size = 1;
constexpr uint32_t k_verdict_bad_rank = 2;
constexpr uint32_t k_verdict_timed_out = 3;  // third word: ranks joined
constexpr size_t k_max_blob = 1 << 20;
constexpr auto k_retry_interval = std::chrono::milliseconds(100);

struct Rendezvous {
  std::string where;  // "host:port"
  std::chrono::milliseconds timeout;
  Clock::time_point deadline;
  int world_size;

  Status timed_out(const std::string& what) const {
    return internal_error("comm/rendezvous: rendezvous with " + where + " timed out after " + seconds_text(timeout) +
                          ": " + what);
  }
  Status failed(const std::string& what) const {
    return internal_error("comm/rendezvous: rendezvous with " + where + " failed: " + what);
  }
  Status io_error(Io io, const std::string& what) const {
    return io == Io::timeout ? timed_out(what) : failed(what + " (connection closed)");
  }
  std::string joined_text(int joined) const {
    return std::to_string(joined) + " of " + std::to_string(world_size) + " ranks joined";
  }
};

Result<Socket> listen_on(int port, const Rendezvous& rv) {
  std::string error;
  Socket s = listen_any(port, rv.world_size + 8, &error);
  if (s.fd() < 0) return rv.failed(error);
  return s;
}

Result<std::vector<uint8_t>> lead(int port, std::span<const uint8_t> blob, const Rendezvous& rv) {
  SNAP_ASSIGN_OR_RETURN(Socket listener, listen_on(port, rv));
  std::vector<Socket> peers(rv.world_size);
  int joined = 1;
  while (joined < rv.world_size) {
    Io w = wait_fd(listener.fd(), POLLIN, rv.deadline);
    if (w == Io::timeout) {
      // Tell the ranks that did join why, so their error names the missing ones too.
      const auto notify_deadline = Clock::now() + std::chrono::milliseconds(200);
      for (const Socket& p : peers) {
        if (p.fd() >= 0) send_words(p.fd(), {k_magic, k_verdict_timed_out, static_cast<uint32_t>(joined)}, notify_deadline);
      }
      return rv.timed_out(rv.joined_text(joined));
    }
    Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.fd() < 0) continue;
    // A peer that connects and stays silent (a probe) may hold us at most 5 s.
    const auto hello_deadline = std::min(rv.deadline, Clock::now() + std::chrono::seconds(5));
    uint32_t hello[3];
    if (recv_words(peer.fd(), hello, 3, hello_deadline) != Io::ok || hello[0] != k_magic) continue;
    const int rank = static_cast<int>(hello[1]);
    const int size = static_cast<int>(hello[2]);
    if (size != rv.world_size) {
      send_words(peer.fd(), {k_magic, k_verdict_bad_size, 0}, rv.deadline);
      return rv.failed("rank " + std::to_string(rank) + " says world size " + std::to_string(size) + ", rank 0 has " +
                       std::to_string(rv.world_size));
    }
    if (rank < 1 || rank >= rv.world_size || peers[rank].fd() >= 0) {
      send_words(peer.fd(), {k_magic, k_verdict_bad_rank, 0}, rv.deadline);
      return rv.failed("rank " + std::to_string(rank) + " joined twice or is outside [1, " +
                       std::to_string(rv.world_size) + ")");
    }
    const int nodelay = 1;
    ::setsockopt(peer.fd(), IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
    peers[rank] = std::move(peer);
    ++joined;
  }
  for (int r = 1; r < rv.world_size; ++r) {
    Io io = send_words(peers[r].fd(), {k_magic, k_verdict_ok, static_cast<uint32_t>(blob.size())}, rv.deadline);
    if (io == Io::ok) io = send_all(peers[r].fd(), blob.data(), blob.size(), rv.deadline);
    if (io != Io::ok) return rv.io_error(io, "sending the blob to rank " + std::to_string(r));
  }
  for (int r = 1; r < rv.world_size; ++r) {
    uint32_t ack = 0;
    Io io = recv_words(peers[r].fd(), &ack, 1, rv.deadline);
    if (io != Io::ok || ack != k_magic) return rv.io_error(io, "waiting for rank " + std::to_string(r) + " at the barrier");
  }
  for (int r = 1; r < rv.world_size; ++r) {
    if (Io io = send_words(peers[r].fd(), {k_magic}, rv.deadline); io != Io::ok) {
      return rv.io_error(io, "releasing rank " + std::to_string(r) + " from the barrier");
    }
  }
  return std::vector<uint8_t>(blob.begin(), blob.end());
}


Result<std::vector<uint8_t>> follow(const std::string& host, int port, int rank, const Rendezvous& rv) {
  Socket s;
  std::string last_error;
  for (;;) {
    Result<Socket> c = try_connect(host, port, rv.deadline);
    if (c.ok()) {
      s = std::move(c.value());
      break;
    }
    last_error = c.status().message();
    if (remaining_ms(rv.deadline) == 0) {
      return rv.timed_out("rank " + std::to_string(rank) + " could not connect (" + last_error + ")");
    }
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        k_retry_interval, std::chrono::milliseconds(remaining_ms(rv.deadline))));
  }
  Io io = send_words(s.fd(), {k_magic, static_cast<uint32_t>(rank), static_cast<uint32_t>(rv.world_size)}, rv.deadline);
  if (io != Io::ok) return rv.io_error(io, "rank " + std::to_string(rank) + " sending its hello");
  uint32_t reply[3];
  io = recv_words(s.fd(), reply, 3, rv.deadline);
  if (io != Io::ok) {
    return rv.io_error(io, "rank " + std::to_string(rank) + " connected but rank 0 did not send the blob (not all " +
                               std::to_string(rv.world_size) + " ranks joined)");
  }
  if (reply[0] != k_magic) return rv.failed("rank 0 answered with a bad magic (is another service on the port?)");
  if (reply[1] == k_verdict_bad_size) {
    return rv.failed("rank 0 has a different world size than " + std::to_string(rv.world_size));
  }
  if (reply[1] == k_verdict_timed_out) {
    return rv.failed("rank 0 timed out waiting for the others: " + rv.joined_text(static_cast<int>(reply[2])));
  }
  if (reply[1] != k_verdict_ok) return rv.failed("rank 0 rejected rank " + std::to_string(rank) + " (duplicate rank?)");
  if (reply[2] > k_max_blob) return rv.failed("rank 0 announced a blob of " + std::to_string(reply[2]) + " bytes");
  std::vector<uint8_t> blob(reply[2]);
  io = recv_all(s.fd(), blob.data(), blob.size(), rv.deadline);
  if (io == Io::ok) io = send_words(s.fd(), {k_magic}, rv.deadline);
  if (io != Io::ok) return rv.io_error(io, "rank " + std::to_string(rank) + " receiving the blob");
  uint32_t go = 0;
  io = recv_words(s.fd(), &go, 1, rv.deadline);
  if (io != Io::ok || go != k_magic) return rv.io_error(io, "rank " + std::to_string(rank) + " waiting at the barrier");
  return blob;
}

}  // namespace

Result<std::vector<uint8_t>> tcp_rendezvous(const std::string& leader_host, int port, int rank, int world_size,
                                            std::span<const uint8_t> blob, std::chrono::milliseconds timeout) {
  const std::string where = leader_host + ":" + std::to_string(port);
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return invalid_argument("comm/rendezvous: rank " + std::to_string(rank) + " of world size " +
                            std::to_string(world_size) + " is out of range");
  }
  if (port < 1 || port > 65535) return invalid_argument("comm/rendezvous: port " + std::to_string(port) + " is not a TCP port");
  if (blob.size() > k_max_blob) {
    return invalid_argument("comm/rendezvous: blob of " + std::to_string(blob.size()) + " bytes exceeds 1 MiB");
  }
  if (world_size == 1) return std::vector<uint8_t>(blob.begin(), blob.end());
  Rendezvous rv{where, timeout, Clock::now() + timeout, world_size};
  return rank == 0 ? lead(port, blob, rv) : follow(leader_host, port, rank, rv);
}

}  // namespace snap::comm
