// TCP backend (host buffers) for launchers without MPI: Kubernetes LeaderWorkerSet pods or
// explicit --rank/--world-size, over persistent connections. Two ranks (one connection) swap
// their blocks both ways at once and each sums them in rank order, so an all-reduce or
// all-gather is one crossing, not two in turn. Three or more are connected pairwise (a mesh):
// every rank r > 0 listens on a port of its own (the rendezvous port + 1 + r where it is
// free), tells rank 0 which in its hello, rank 0 hands the ranks' addresses out, and rank s
// connects to every rank 0 < r < s. An all-reduce above 64 KiB is then a reduce-scatter
// followed by an all-gather: rank r owns the r-th of P near-equal chunks, gets that chunk's
// piece from every rank, sums the P blocks in rank order (sum_blocks_in_rank_order: the MPI
// backend's bits, whatever the chunking, since each element's sum is the same) and sends the
// sum to every rank; every rank moves 2(P-1)/P·n bytes each way (a ring's figure; through rank
// 0 it was (P-1)·n there), in 256 KiB pieces, piece k's all-gather in the same round as piece
// k + 1's reduce-scatter. Smaller all-reduces (decode steps, where the number of messages costs
// more than the bytes), broadcasts and barriers go through rank 0 (a star); the all-gather goes
// straight from every rank to every rank.
//
// Wire, little-endian. Setup: hello = u32 {magic, rank, world_size, mesh port (0 for 2
// ranks)}; reply = u32 {magic, verdict, value}; with 3+ ranks rank 0 then sends the table
// u32 bytes + for each rank r >= 1 {u32 port, u32 length, host}, and a mesh connection from
// rank s to r starts with s's hello (port 0), answered by {magic, ok, r}. Collectives: each
// message is a 16-byte header {u32 magic, u32 kind, u64 num_bytes} + payload; kind is the CommOp + 1, so ranks that call different
// collectives (or counts) fail with a one-line error instead of misreading bytes. A rank
// that fails sends, where its connection is at a message boundary, an abort notice (kind
// k_kind_abort, payload: the one-line message) and closes every connection; the others
// then fail in their current or next collective with that message (or "rank R closed the
// connection" when the process died), never hang. A rank that hangs without dying (stopped,
// deadlocked, swapping) is caught by the armed collective timeout (exchange()); broadcasts
// have none unless bound (an idle worker waits for the next step plan in poll(), no
// spinning; Communicator::bound_broadcasts); a host
// that vanishes without closing is caught by TCP keepalive / TCP_USER_TIMEOUT within ~30 s.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/backends.h"
#include "comm/socket_io.h"
#include "comm/tcp_wire.h"

namespace snap::comm {

namespace {

using namespace detail;  // Socket, Io, send_all, recv_all, ... (socket_io.h)
using namespace tcp_wire;  // the message format and its checks (tcp_wire.h)
constexpr uint32_t k_verdict_ok = 0;
constexpr uint32_t k_verdict_bad_size = 1;    // value: rank 0's world size
constexpr uint32_t k_verdict_bad_rank = 2;
constexpr uint32_t k_verdict_timed_out = 3;   // value: ranks joined
constexpr uint32_t k_verdict_other_bad = 4;   // value: the rank whose hello was refused
constexpr auto k_retry_interval = std::chrono::milliseconds(100);
constexpr auto k_notice_time = std::chrono::milliseconds(200);
constexpr auto k_verdict_grace = std::chrono::milliseconds(1000);
// How much longer than rank 0 the other ranks wait in a collective before giving up on it.
constexpr auto k_worker_grace = std::chrono::milliseconds(5000);

// ------------------------------------------------------------ sockets (as comm/rendezvous.cpp)

// No Nagle delay (a decode step's all-reduce is one small message each way), and a peer
// host that vanishes without a FIN/RST (power loss, partition) is declared dead after
// ~30 s: keepalive probes when idle, TCP_USER_TIMEOUT when sent data stays unacknowledged.
void tune_socket(int fd) {
  const int one = 1;
  const int idle_s = 10, interval_s = 5, probes = 3;
  const unsigned user_timeout_ms = 30000;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

// ------------------------------------------------------------ setup: connect the star

struct Setup {
  std::string where;  // "host:port"
  std::chrono::milliseconds timeout;
  Clock::time_point deadline;
  int world_size;

  Status timed_out(const std::string& what) const {
    return internal_error("comm/tcp: connecting the group at " + where + " timed out after " + seconds_text(timeout) +
                          ": " + what);
  }
  Status failed(const std::string& what) const {
    return internal_error("comm/tcp: connecting the group at " + where + " failed: " + what);
  }
  Status io_error(Io io, const std::string& what) const {
    return io == Io::timeout ? timed_out(what) : failed(what + " (connection closed)");
  }
};

Result<Socket> listen_on(int port, const Setup& st) {
  std::string error;
  Socket s = listen_any(port, st.world_size + 8, &error);
  if (s.fd() < 0) return st.failed(error);
  return s;
}

// Where rank r (>= 1) listens for its mesh connections, as rank 0 saw it.
struct MeshAddress {
  std::string host;
  int port = 0;
};

// The numeric address of a connection's peer; an IPv4 peer of a dual-stack listener as IPv4.
std::string peer_host(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      ::inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof text);
    }
  } else if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, text, sizeof text);
  }
  return text;
}

// Rank 0: accept world_size - 1 hellos; peers[r] is rank r's connection (peers[0] empty).
// A refused hello fails the whole group: the ranks already connected are told why. With 3+
// ranks, every rank then gets the table of the others' mesh addresses.
Result<std::vector<Socket>> lead(int port, const Setup& st) {
  std::vector<MeshAddress> mesh(static_cast<size_t>(st.world_size));
  SNAP_ASSIGN_OR_RETURN(Socket listener, listen_on(port, st));
  std::vector<Socket> peers(st.world_size);
  int joined = 1;
  auto tell_joined = [&](uint32_t verdict, uint32_t value) {
    const auto deadline = Clock::now() + k_notice_time;
    for (const Socket& p : peers) {
      if (p.fd() >= 0) send_words(p.fd(), {k_magic, verdict, value}, deadline);
    }
  };
  while (joined < st.world_size) {
    if (wait_fd(listener.fd(), POLLIN, st.deadline) == Io::timeout) {
      tell_joined(k_verdict_timed_out, static_cast<uint32_t>(joined));
      std::string missing;
      for (int r = 1; r < st.world_size; ++r) {
        if (peers[r].fd() < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return st.timed_out(std::to_string(joined) + " of " + std::to_string(st.world_size) +
                          " ranks joined (missing: " + missing + ")");
    }
    Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.fd() < 0) continue;
    // A peer that connects and stays silent (a probe) may hold us at most 5 s.
    const auto hello_deadline = std::min(st.deadline, Clock::now() + std::chrono::seconds(5));
    uint32_t hello[4];
    if (recv_words(peer.fd(), hello, 4, hello_deadline) != Io::ok) continue;
    std::vector<bool> joined_ranks(static_cast<size_t>(st.world_size));
    for (int r = 1; r < st.world_size; ++r) joined_ranks[static_cast<size_t>(r)] = peers[r].fd() >= 0;
    const HelloVerdict verdict = check_hello(hello, joined_ranks);
    if (verdict == HelloVerdict::not_ours) continue;
    const int rank = static_cast<int>(hello[1]);
    const int size = static_cast<int>(hello[2]);
    if (verdict == HelloVerdict::bad_size) {
      send_words(peer.fd(), {k_magic, k_verdict_bad_size, static_cast<uint32_t>(st.world_size)}, hello_deadline);
      tell_joined(k_verdict_other_bad, hello[1]);
      return st.failed("rank " + std::to_string(rank) + " says world size " + std::to_string(size) + ", rank 0 has " +
                       std::to_string(st.world_size));
    }
    if (verdict == HelloVerdict::bad_rank) {
      send_words(peer.fd(), {k_magic, k_verdict_bad_rank, 0}, hello_deadline);
      tell_joined(k_verdict_other_bad, hello[1]);
      return st.failed("rank " + std::to_string(rank) + " joined twice or is outside [1, " +
                       std::to_string(st.world_size) + ")");
    }
    tune_socket(peer.fd());
    mesh[static_cast<size_t>(rank)] = MeshAddress{peer_host(peer.fd()), static_cast<int>(hello[3])};
    peers[rank] = std::move(peer);
    ++joined;
  }
  std::vector<uint8_t> table;
  if (st.world_size > 2) {
    for (int r = 1; r < st.world_size; ++r) {
      const MeshAddress& m = mesh[static_cast<size_t>(r)];
      const uint32_t words[2] = {htole32(static_cast<uint32_t>(m.port)), htole32(static_cast<uint32_t>(m.host.size()))};
      table.insert(table.end(), reinterpret_cast<const uint8_t*>(words), reinterpret_cast<const uint8_t*>(words) + 8);
      table.insert(table.end(), m.host.begin(), m.host.end());
    }
  }
  for (int r = 1; r < st.world_size; ++r) {
    const std::string what = "telling rank " + std::to_string(r) + " that the group is complete";
    Io io = send_words(peers[r].fd(), {k_magic, k_verdict_ok, static_cast<uint32_t>(st.world_size)}, st.deadline);
    if (io == Io::ok && !table.empty()) io = send_words(peers[r].fd(), {static_cast<uint32_t>(table.size())}, st.deadline);
    if (io == Io::ok && !table.empty()) io = send_all(peers[r].fd(), table.data(), table.size(), st.deadline);
    if (io != Io::ok) return st.io_error(io, what);
  }
  return peers;
}

// try_connect (socket_io.h) plus this communicator's socket options.
Result<Socket> connect_tuned(const std::string& host, int port, Clock::time_point deadline) {
  SNAP_ASSIGN_OR_RETURN(Socket s, try_connect(host, port, deadline));
  tune_socket(s.fd());
  return s;
}

Result<Socket> follow(const std::string& host, int port, int rank, int mesh_port, const Setup& st) {
  Socket s;
  for (;;) {
    Result<Socket> c = connect_tuned(host, port, st.deadline);
    if (c.ok()) {
      s = std::move(c.value());
      break;
    }
    if (remaining_ms(st.deadline) == 0) {
      return st.timed_out("rank " + std::to_string(rank) + " could not connect (" + c.status().message() + ")");
    }
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        k_retry_interval, std::chrono::milliseconds(remaining_ms(st.deadline))));
  }
  const std::string me = "rank " + std::to_string(rank);
  Io io = send_words(s.fd(),
                     {k_magic, static_cast<uint32_t>(rank), static_cast<uint32_t>(st.world_size),
                      static_cast<uint32_t>(mesh_port)},
                     st.deadline);
  if (io != Io::ok) return st.io_error(io, me + " sending its hello");
  // Rank 0 gives up at the same deadline and then says why (e.g. which ranks are
  // missing); wait a little longer for that than for our own deadline.
  uint32_t reply[3];
  io = recv_words(s.fd(), reply, 3, st.deadline + k_verdict_grace);
  if (io != Io::ok) return st.io_error(io, me + " connected but not all " + std::to_string(st.world_size) + " ranks joined");
  if (reply[0] != k_magic) return st.failed("rank 0 answered with a bad magic (is another service on the port?)");
  switch (reply[1]) {
    case k_verdict_ok: return s;
    case k_verdict_bad_size:
      return st.failed("rank 0 has world size " + std::to_string(reply[2]) + ", " + me + " has " +
                       std::to_string(st.world_size));
    case k_verdict_bad_rank: return st.failed("rank 0 rejected " + me + " (joined twice?)");
    case k_verdict_timed_out:
      return st.failed("rank 0 timed out waiting for the others: " + std::to_string(reply[2]) + " of " +
                       std::to_string(st.world_size) + " ranks joined");
    default:
      return st.failed("rank 0 gave up: it refused the hello of rank " + std::to_string(static_cast<int>(reply[2])) +
                       " (wrong world size or duplicate rank)");
  }
}

// A worker with 3+ ranks: the table of mesh addresses rank 0 sends after its verdict.
Result<std::vector<MeshAddress>> receive_table(int fd, const Setup& st) {
  uint32_t bytes = 0;
  Io io = recv_words(fd, &bytes, 1, st.deadline + k_verdict_grace);
  if (io != Io::ok) return st.io_error(io, "receiving the ranks' addresses from rank 0");
  if (bytes > (1u << 20)) return st.failed("rank 0 sent a table of " + std::to_string(bytes) + " bytes");
  std::vector<uint8_t> table(bytes);
  io = recv_all(fd, table.data(), table.size(), st.deadline + k_verdict_grace);
  if (io != Io::ok) return st.io_error(io, "receiving the ranks' addresses from rank 0");
  std::vector<MeshAddress> mesh(static_cast<size_t>(st.world_size));
  size_t at = 0;
  for (int r = 1; r < st.world_size; ++r) {
    uint32_t words[2];
    if (table.size() - at < 8) return st.failed("rank 0 sent a short table of addresses");
    std::memcpy(words, table.data() + at, 8);
    at += 8;
    const uint32_t len = le32toh(words[1]);
    if (table.size() - at < len || len > 255) return st.failed("rank 0 sent a short table of addresses");
    mesh[static_cast<size_t>(r)] = MeshAddress{std::string(reinterpret_cast<const char*>(table.data() + at), len),
                                               static_cast<int>(le32toh(words[0]))};
    at += len;
  }
  return mesh;
}

// Rank `me` (>= 1) of 3+: connects to every rank 0 < r < me and accepts every rank above it,
// on the mesh listener; peers[0] (the leader) is already there.
Status connect_mesh(int me, const std::vector<MeshAddress>& mesh, const Socket& listener, std::vector<Socket>& peers,
                    const Setup& st) {
  const int p = st.world_size;
  const std::string who = "rank " + std::to_string(me);
  for (int r = 1; r < me; ++r) {
    const MeshAddress& m = mesh[static_cast<size_t>(r)];
    const std::string where = "rank " + std::to_string(r) + " at " + m.host + ":" + std::to_string(m.port);
    Result<Socket> c = connect_tuned(m.host, m.port, st.deadline);
    if (!c.ok()) {
      return st.failed(who + " could not connect to " + where + " (" + c.status().message() +
                       "); with 3 or more ranks the ranks connect to each other, not only to rank 0: allow TCP "
                       "between them");
    }
    Socket s = std::move(c.value());
    Io io = send_words(s.fd(), {k_magic, static_cast<uint32_t>(me), static_cast<uint32_t>(p), 0}, st.deadline);
    uint32_t reply[3] = {};
    if (io == Io::ok) io = recv_words(s.fd(), reply, 3, st.deadline);
    if (io != Io::ok) return st.io_error(io, who + " connecting to " + where);
    if (reply[0] != k_magic || reply[1] != k_verdict_ok || reply[2] != static_cast<uint32_t>(r))
      return st.failed(who + " connected to " + where + ", which did not answer as rank " + std::to_string(r));
    peers[static_cast<size_t>(r)] = std::move(s);
  }
  for (int joined = me + 1; joined < p;) {
    if (wait_fd(listener.fd(), POLLIN, st.deadline) == Io::timeout) {
      std::string missing;
      for (int r = me + 1; r < p; ++r)
        if (peers[static_cast<size_t>(r)].fd() < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return st.timed_out(who + " waited for ranks above it to connect (missing: " + missing + ")");
    }
    Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.fd() < 0) continue;
    const auto hello_deadline = std::min(st.deadline, Clock::now() + std::chrono::seconds(5));
    uint32_t hello[4];
    if (recv_words(peer.fd(), hello, 4, hello_deadline) != Io::ok || hello[0] != k_magic) continue;  // a stray probe
    const int rank = static_cast<int>(hello[1]);
    if (hello[2] != static_cast<uint32_t>(p) || rank <= me || rank >= p || peers[static_cast<size_t>(rank)].fd() >= 0)
      return st.failed(who + " got a mesh connection from rank " + std::to_string(rank) + " of world size " +
                       std::to_string(hello[2]) + " (expected a rank in (" + std::to_string(me) + ", " +
                       std::to_string(p) + "), once)");
    if (send_words(peer.fd(), {k_magic, k_verdict_ok, static_cast<uint32_t>(me)}, hello_deadline) != Io::ok) continue;
    tune_socket(peer.fd());
    peers[static_cast<size_t>(rank)] = std::move(peer);
    ++joined;
  }
  return Status();
}

// ------------------------------------------------------------ collectives

// The all-reduce moves its blocks in pieces of this size (one message each way per piece):
// 256 KiB measured fastest on loopback (bench_comm_tcp: 64 KiB 29 ms, 256 KiB 9.7 ms, 1 MiB 18 ms
// for 32 MiB), small enough to stay within the sockets' buffers while the last piece is summed.
constexpr int64_t k_pair_piece_bytes = 1 << 18;
// With 3+ ranks, blocks up to this size go through rank 0 (the star), larger ones over the mesh:
// a decode step's all-reduce (Llama-3-8B: 4096 floats, 16 KiB) is a few messages' latency, a
// prefill chunk's (2048 x 4096 floats, 32 MiB) is the bytes on each rank's link. Measured with
// one rate-limited link per rank (bench/run_comm_tcp_netns.sh, 4 ranks, this 2-core machine):
// 4096 floats star 70 µs, mesh 133 µs at 10 Gbit/s (414 and 208 µs at 1 Gbit/s); 512 x 576
// floats star 3.2 ms, mesh 2.3 ms; 32 MiB 90 ms and 73 ms (845 and 476 ms at 1 Gbit/s).
constexpr int64_t k_star_max_bytes = 64 << 10;

// One message to or from one peer, moved a piece at a time as poll() allows.
struct Transfer {
  int peer;       // group rank at the other end
  bool send;
  uint8_t* data;  // payload [num_bytes]
  uint64_t num_bytes;
  uint8_t header[k_header_bytes] = {};
  uint64_t done = 0;  // bytes of header + payload moved
  bool finished() const { return done == k_header_bytes + num_bytes; }
  // What is left to send, as up to two pieces (the header's rest, the payload's); returns how many.
  int rest(iovec out[2]) {
    int n = 0;
    if (done < k_header_bytes) out[n++] = {header + done, k_header_bytes - done};
    const uint64_t payload_done = done < k_header_bytes ? 0 : done - k_header_bytes;
    if (num_bytes > payload_done) out[n++] = {data + payload_done, num_bytes - payload_done};
    return n;
  }
};

class TcpCommunicator final : public Communicator {
 public:
  // peers_[r]: the connection to group rank r (rank 0: every r > 0; others: r == 0, and with
  // 3+ ranks every other rank too: the mesh).
  TcpCommunicator(World world, std::vector<Socket> peers)
      : Communicator(world), peers_(std::move(peers)), out_partial_(peers_.size(), false), sent_(peers_.size(), 0) {}
  const char* backend_name() const override { return "tcp"; }
  std::vector<int64_t> wire_bytes_sent() const override { return sent_; }

  // The peers see our closed connections (or this notice) and fail in turn; rank 0
  // passes the message on to everyone else.
  [[noreturn]] void abort_job(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "snapserve: rank %d aborting the job: %s\n", world().rank(), message.c_str());
    std::fflush(stderr);
    notify_peers("comm/tcp: rank " + std::to_string(group_rank()) + " aborted the job: " + message);
    std::_Exit(exit_code);
  }

 protected:
  // Rank 0 sums the P blocks with sum_blocks_in_rank_order (rank 0's value first, f32
  // accumulator, one rounding) and sends the same bytes to everyone.
  Status do_all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    SNAP_RETURN_IF_ERROR(failed_);
    const int p = group_size();
    if (count == 0 || p == 1) return Status();
    auto* data = static_cast<uint8_t*>(buf);
    const int64_t elem = dtype_size(dtype);
    const int64_t piece = std::max<int64_t>(1, k_pair_piece_bytes / elem);
    if (p == 2) {
      // Both blocks cross at once, a piece at a time; each rank sums a piece in rank order as
      // soon as it is in (while the next one fills the socket buffers): the same bits on both.
      const int peer = 1 - group_rank();
      scratch_.resize(static_cast<size_t>(std::min(count, piece) * elem));
      for (int64_t at = 0; at < count; at += piece) {
        const int64_t n = std::min(piece, count - at);
        uint8_t* mine = data + at * elem;
        SNAP_RETURN_IF_ERROR(exchange({send_to(peer, mine, static_cast<uint64_t>(n * elem)),
                                       recv_from(peer, scratch_.data(), static_cast<uint64_t>(n * elem))},
                                      CommOp::all_reduce_sum));
        if (group_rank() == 0)
          sum_pair_in_rank_order(mine, scratch_.data(), n, dtype, mine);
        else
          sum_pair_in_rank_order(scratch_.data(), mine, n, dtype, mine);
      }
      return Status();
    }
    if (count * elem <= k_star_max_bytes) return star_all_reduce(data, count, dtype);
    return mesh_all_reduce(data, count, dtype);
  }

  Status do_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    SNAP_RETURN_IF_ERROR(failed_);
    const int p = group_size();
    const uint64_t bytes = static_cast<uint64_t>(count) * dtype_size(dtype);
    auto* out = static_cast<uint8_t*>(recv);
    if (count == 0) return Status();
    if (p == 2) {  // the two blocks cross at once
      const int peer = 1 - group_rank();
      uint8_t* mine = out + group_rank() * bytes;
      if (send != mine) std::memmove(mine, send, bytes);
      return exchange({send_to(peer, mine, bytes), recv_from(peer, out + peer * bytes, bytes)}, CommOp::all_gather);
    }
    // The mesh: every rank sends its block to every other rank and receives theirs, at once.
    uint8_t* mine = out + group_rank() * bytes;
    if (send != mine) std::memmove(mine, send, bytes);
    std::vector<Transfer> ts;
    for (int r = 0; r < p; ++r) {
      if (r == group_rank()) continue;
      ts.push_back(send_to(r, mine, bytes));
      ts.push_back(recv_from(r, out + r * bytes, bytes));
    }
    return exchange(std::move(ts), CommOp::all_gather);
  }

  Status do_broadcast(void* buf, int64_t count, DType dtype, int root) override {
    return do_broadcast_bytes(buf, count * dtype_size(dtype), root);
  }

  // A root other than 0 first hands its bytes to rank 0, which sends them on to the rest.
  Status do_broadcast_bytes(void* buf, int64_t num_bytes, int root) override {
    SNAP_RETURN_IF_ERROR(failed_);
    if (num_bytes == 0 || group_size() == 1) return Status();
    auto* data = static_cast<uint8_t*>(buf);
    const auto bytes = static_cast<uint64_t>(num_bytes);
    const int me = group_rank();
    if (me == 0) {
      if (root != 0) SNAP_RETURN_IF_ERROR(exchange({recv_from(root, data, bytes)}, CommOp::broadcast));
      return send_to_all(data, bytes, root, CommOp::broadcast);
    }
    if (me == root) return exchange({send_to(0, data, bytes)}, CommOp::broadcast);
    return exchange({recv_from(0, data, bytes)}, CommOp::broadcast);
  }

  // Empty messages: everyone reports to rank 0, rank 0 releases everyone.
  Status do_barrier() override {
    SNAP_RETURN_IF_ERROR(failed_);
    const int p = group_size();
    if (p == 1) return Status();
    if (group_rank() != 0) {
      SNAP_RETURN_IF_ERROR(exchange({send_to(0, nullptr, 0)}, CommOp::barrier));
      return exchange({recv_from(0, nullptr, 0)}, CommOp::barrier);
    }
    std::vector<Transfer> ts;
    for (int r = 1; r < p; ++r) ts.push_back(recv_from(r, nullptr, 0));
    SNAP_RETURN_IF_ERROR(exchange(std::move(ts), CommOp::barrier));
    return send_to_all(nullptr, 0, -1, CommOp::barrier);
  }

 private:
  static Transfer send_to(int peer, uint8_t* data, uint64_t n) { return Transfer{peer, true, data, n}; }
  static Transfer recv_from(int peer, uint8_t* data, uint64_t n) { return Transfer{peer, false, data, n}; }

  // Rank 0: `data` to every rank except 0 and `skip`.
  Status send_to_all(uint8_t* data, uint64_t n, int skip, CommOp op) {
    std::vector<Transfer> ts;
    for (int r = 1; r < group_size(); ++r) {
      if (r != skip) ts.push_back(send_to(r, data, n));
    }
    return exchange(std::move(ts), op);
  }

  // 3+ ranks, a small block (up to k_star_max_bytes: decode steps' hidden states): through
  // rank 0, which sums the P blocks in rank order and sends the sum back. Rank 0 moves (P-1)·n
  // bytes each way, but workers send one message and receive one instead of 2(P-1) each.
  Status star_all_reduce(uint8_t* data, int64_t count, DType dtype) {
    const int p = group_size();
    const auto bytes = static_cast<uint64_t>(count * dtype_size(dtype));
    if (group_rank() != 0) {
      SNAP_RETURN_IF_ERROR(exchange({send_to(0, data, bytes)}, CommOp::all_reduce_sum));
      return exchange({recv_from(0, data, bytes)}, CommOp::all_reduce_sum);
    }
    scratch_.resize(static_cast<size_t>(p) * bytes);  // block r: rank r's
    std::vector<Transfer> ts;
    for (int r = 1; r < p; ++r) ts.push_back(recv_from(r, scratch_.data() + r * bytes, bytes));
    SNAP_RETURN_IF_ERROR(exchange(std::move(ts), CommOp::all_reduce_sum));
    std::memcpy(scratch_.data(), data, bytes);
    sum_blocks_in_rank_order(scratch_.data(), p, count, count, dtype, data);
    return send_to_all(data, bytes, -1, CommOp::all_reduce_sum);
  }

  // 3+ ranks: a reduce-scatter then an all-gather over the mesh (the file's comment), in pieces
  // of at most k_pair_piece_bytes per message. Round 0 is piece 0's reduce-scatter; round k + 1
  // is piece k's all-gather and piece k + 1's reduce-scatter (exchange() keeps the order of
  // two messages to one peer), each piece summed as soon as its round is in.
  Status mesh_all_reduce(uint8_t* data, int64_t count, DType dtype) {
    const int p = group_size(), me = group_rank();
    const int64_t elem = dtype_size(dtype);
    const int64_t piece = std::max<int64_t>(1, k_pair_piece_bytes / elem);
    // Chunk r is elements [lo(r), lo(r + 1)); the first count % p chunks have one more.
    const auto lo = [&](int r) { return count / p * r + std::min<int64_t>(r, count % p); };
    const auto len = [&](int r, int64_t k) {  // elements in piece k of chunk r
      return std::clamp<int64_t>(lo(r + 1) - lo(r) - k * piece, 0, piece);
    };
    const auto at = [&](int r, int64_t k) { return data + (lo(r) + k * piece) * elem; };
    const auto bytes = [&](int r, int64_t k) { return static_cast<uint64_t>(len(r, k) * elem); };
    const int64_t stride = std::min(piece, lo(1) - lo(0));  // chunk 0 is the longest
    const int64_t pieces = (lo(1) - lo(0) + piece - 1) / piece;
    scratch_.resize(static_cast<size_t>(p * stride * elem));  // [P × piece]: block r is rank r's piece
    const auto reduce_scatter = [&](int64_t k, std::vector<Transfer>* ts) {
      for (int r = 0; r < p; ++r) {
        if (r == me) continue;
        if (len(r, k) > 0) ts->push_back(send_to(r, at(r, k), bytes(r, k)));
        if (len(me, k) > 0) ts->push_back(recv_from(r, scratch_.data() + r * stride * elem, bytes(me, k)));
      }
    };
    const auto all_gather = [&](int64_t k, std::vector<Transfer>* ts) {
      for (int r = 0; r < p; ++r) {
        if (r == me) continue;
        if (len(me, k) > 0) ts->push_back(send_to(r, at(me, k), bytes(me, k)));
        if (len(r, k) > 0) ts->push_back(recv_from(r, at(r, k), bytes(r, k)));
      }
    };
    const auto reduce = [&](int64_t k) {
      const int64_t n = len(me, k);
      if (n == 0) return;
      std::memcpy(scratch_.data() + me * stride * elem, at(me, k), static_cast<size_t>(n * elem));
      sum_blocks_in_rank_order(scratch_.data(), p, stride, n, dtype, at(me, k));
    };
    std::vector<Transfer> ts;
    reduce_scatter(0, &ts);
    SNAP_RETURN_IF_ERROR(exchange(std::move(ts), CommOp::all_reduce_sum));
    reduce(0);
    for (int64_t k = 0; k < pieces; ++k) {
      ts.clear();
      all_gather(k, &ts);  // before the next piece's messages to the same peers: the same order on both ends
      if (k + 1 < pieces) reduce_scatter(k + 1, &ts);
      SNAP_RETURN_IF_ERROR(exchange(std::move(ts), CommOp::all_reduce_sum));
      if (k + 1 < pieces) reduce(k + 1);
    }
    return Status();
  }

  // Moves every transfer to completion, all peers at once (poll); two transfers to (or from)
  // one peer run in list order. The first failure breaks the communicator: see fail(). Inside
  // a step (all_reduce_sum, all_gather, barrier) the armed collective timeout bounds the wait;
  // rank 0 names the ranks it waited for. The others wait k_worker_grace longer, so that rank
  // 0's notice, which names the culprit, reaches them first (a mesh worker that waits for
  // another worker watches rank 0's connection for it). Broadcasts wait for ever (a worker
  // waits there for an idle leader's next step plan) unless bound_broadcasts() bounds them.
  Status exchange(std::vector<Transfer> ts, CommOp op) {
    const std::chrono::milliseconds limit = op == CommOp::broadcast ? broadcast_timeout() : collective_timeout();
    const char* flag = op == CommOp::broadcast ? broadcast_timeout_flag() : collective_timeout_flag();
    const bool bounded = limit.count() > 0;
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline =
        bounded ? Clock::now() + limit + (group_rank() == 0 ? std::chrono::milliseconds(0) : k_worker_grace)
                : Clock::time_point::max();
    for (Transfer& t : ts) {
      if (t.send) encode_header(t.header, kind_of(op), t.num_bytes);
    }
    current_ = &ts;  // fail() finishes the half-sent ones
    struct Done {
      std::vector<Transfer>*& current;
      ~Done() { current = nullptr; }
    } done{current_};
    // A worker in the mesh may have nothing left to move with rank 0 while it waits for another
    // rank, whom rank 0 may already have given up on: it still watches rank 0's connection, so
    // that rank 0's abort notice (which names the culprit) reaches it, until the next bytes
    // there are a message of a later collective or the connection's end.
    const bool watch_leader = group_rank() != 0 && group_size() > 2;
    bool leader_done = false;
    std::vector<pollfd> fds;
    std::vector<Transfer*> polled;
    for (;;) {
      fds.clear();
      polled.clear();
      bool reading_leader = false;
      for (size_t i = 0; i < ts.size(); ++i) {
        Transfer& t = ts[i];
        if (t.finished()) continue;
        bool queued = false;  // behind an earlier transfer to (or from) the same peer
        for (size_t j = 0; j < i && !queued; ++j)
          queued = !ts[j].finished() && ts[j].peer == t.peer && ts[j].send == t.send;
        if (queued) continue;
        reading_leader = reading_leader || (t.peer == 0 && !t.send);
        fds.push_back(pollfd{peers_[t.peer].fd(), static_cast<short>(t.send ? POLLOUT : POLLIN), 0});
        polled.push_back(&t);
      }
      if (fds.empty()) return Status();
      const bool watching = watch_leader && !reading_leader && !leader_done;
      if (watching) {
        fds.push_back(pollfd{peers_[0].fd(), POLLIN, 0});
        polled.push_back(nullptr);
      }
      int wait_ms = -1;
      if (bounded) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
          if (watching) polled.pop_back();
          return fail(timed_out(polled, op, limit, flag, start));
        }
        wait_ms = static_cast<int>(std::min<int64_t>(left, 1 << 30));
      }
      if (::poll(fds.data(), fds.size(), wait_ms) < 0) {
        if (errno == EINTR) continue;
        return fail(internal_error(std::string("comm/tcp: poll failed during ") + comm_op_name(op) + ": " +
                                   std::strerror(errno)));
      }
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (polled[i] == nullptr) {  // rank 0's connection, watched
          Status s = leader_notice(&leader_done);
          if (!s.ok()) return fail(std::move(s));
          continue;
        }
        Transfer& t = *polled[i];
        if (t.send) out_partial_[t.peer] = true;
        Status s = t.send ? step_send(t, op) : step_recv(t, op);
        if (!s.ok()) return fail(std::move(s));
        if (t.send && t.finished()) out_partial_[t.peer] = false;
      }
    }
  }

  // "comm/tcp: rank 0: all_reduce_sum waited 120.0 s for rank 2 (--collective-timeout 120 s): it died or hangs"
  Status timed_out(const std::vector<Transfer*>& waiting, CommOp op, std::chrono::milliseconds limit, const char* flag,
                   Clock::time_point start) const {
    std::vector<int> peers;
    for (const Transfer* t : waiting)
      if (std::find(peers.begin(), peers.end(), t->peer) == peers.end()) peers.push_back(t->peer);
    std::sort(peers.begin(), peers.end());
    std::string who = peers.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < peers.size(); ++i) who += (i ? ", " : "") + std::to_string(peers[i]);
    char secs[112];
    std::snprintf(secs, sizeof secs, "%.1f s for %s (%s %g s)", std::chrono::duration<double>(Clock::now() - start).count(),
                  who.c_str(), flag, limit.count() / 1000.0);
    return internal_error("comm/tcp: rank " + std::to_string(group_rank()) + ": " + comm_op_name(op) + " waited " + secs +
                          ": " + (peers.size() == 1 ? "it" : "they") + " died or hang" + (peers.size() == 1 ? "s" : ""));
  }

  Status closed(int peer, CommOp op) const {
    return internal_error("comm/tcp: rank " + std::to_string(peer) + " closed the connection during " +
                          comm_op_name(op));
  }

  // Sends until the socket would block or the message is out.
  Status step_send(Transfer& t, CommOp op) {
    const int fd = peers_[t.peer].fd();
    while (!t.finished()) {
      iovec iov[2];
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = t.rest(iov);
      const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Status();
      if (n <= 0) {
        // The peer may have said why before it closed.
        Status notice = pending_notice(fd);
        return notice.ok() ? closed(t.peer, op) : notice;
      }
      t.done += static_cast<uint64_t>(n);
      sent_[static_cast<size_t>(t.peer)] += n;
    }
    return Status();
  }

  // Receives until the socket would block or the message is in; checks the header first.
  Status step_recv(Transfer& t, CommOp op) {
    const int fd = peers_[t.peer].fd();
    while (!t.finished()) {
      const bool in_header = t.done < k_header_bytes;
      uint8_t* dst = in_header ? t.header + t.done : t.data + (t.done - k_header_bytes);
      const uint64_t want = in_header ? k_header_bytes - t.done : t.num_bytes - (t.done - k_header_bytes);
      const ssize_t n = ::recv(fd, dst, want, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Status();
      if (n <= 0) return closed(t.peer, op);
      t.done += static_cast<uint64_t>(n);
      if (in_header && t.done == k_header_bytes) SNAP_RETURN_IF_ERROR(check_header(t, op));
    }
    return Status();
  }

  Status check_header(const Transfer& t, CommOp op) {
    const Header h = decode_header(t.header);
    switch (tcp_wire::check_header(h, op, t.num_bytes)) {
      case HeaderVerdict::ok: return Status();
      case HeaderVerdict::abort_notice:
      case HeaderVerdict::notice_too_long: return read_notice(peers_[t.peer].fd(), h.num_bytes);
      case HeaderVerdict::bad_magic:
        return internal_error("comm/tcp: rank " + std::to_string(t.peer) + " sent a bad message header during " +
                              comm_op_name(op));
      case HeaderVerdict::mismatch: break;
    }
    return internal_error("comm/tcp: rank " + std::to_string(t.peer) + " sent " + kind_name(h.kind) + " of " +
                          std::to_string(h.num_bytes) + " bytes while this rank is in " + comm_op_name(op) + " of " +
                          std::to_string(t.num_bytes) + " bytes (ranks called different collectives)");
  }

  // The text of an abort notice whose header was just read, as this rank's error.
  static Status read_notice(int fd, uint64_t len) {
    std::string text(std::min<uint64_t>(len, k_max_notice), '\0');
    if (len > k_max_notice || recv_all(fd, text.data(), text.size(), Clock::now() + k_notice_time) != Io::ok) {
      return internal_error("comm/tcp: a peer aborted (its message was lost)");
    }
    return internal_error(text);
  }

  // Rank 0's watched connection is readable: an abort notice (its message, as this rank's
  // error), or the start of a later message or the connection's end (*done: stop watching).
  // An end is no error here: rank 0 may have finished this collective, its last, and exited
  // while this rank still waits for another; had it died, the ranks that wait for it fail
  // and say so, and this rank meets the closed connection at its next message from rank 0.
  Status leader_notice(bool* done) {
    const int fd = peers_[0].fd();
    uint8_t header[k_header_bytes];
    const ssize_t n = ::recv(fd, header, sizeof header, MSG_DONTWAIT | MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Status();
    if (n <= 0) {
      *done = true;
      return Status();
    }
    if (n < static_cast<ssize_t>(sizeof header)) return Status();  // the rest of the header is on its way
    const Header h = decode_header(header);
    if (h.magic != k_magic || h.kind != k_kind_abort) {
      *done = true;
      return Status();
    }
    ::recv(fd, header, sizeof header, MSG_DONTWAIT);
    return read_notice(fd, h.num_bytes);
  }

  // After a failed send: an abort notice waiting in the receive queue, if any (ok: none).
  static Status pending_notice(int fd) {
    uint8_t header[k_header_bytes];
    if (::recv(fd, header, sizeof header, MSG_DONTWAIT | MSG_PEEK) != static_cast<ssize_t>(sizeof header)) {
      return Status();
    }
    const Header h = decode_header(header);
    if (h.magic != k_magic || h.kind != k_kind_abort) return Status();
    ::recv(fd, header, sizeof header, MSG_DONTWAIT);
    return read_notice(fd, h.num_bytes);
  }

  // Best effort, bounded: the notice goes only where no message is half sent (it would
  // be read as payload), and to peers that may already be gone.
  void notify_peers(const std::string& text) {
    const std::string line = text.substr(0, k_max_notice);
    uint8_t header[k_header_bytes];
    encode_header(header, k_kind_abort, line.size());
    const auto deadline = Clock::now() + k_notice_time;
    for (size_t r = 0; r < peers_.size(); ++r) {
      const int fd = peers_[r].fd();
      if (fd < 0 || out_partial_[r]) continue;
      if (send_all(fd, header, sizeof header, deadline) == Io::ok) send_all(fd, line.data(), line.size(), deadline);
    }
  }

  // The communicator is unusable after a failure: tell the peers, close every connection
  // (so a rank waiting on us wakes up), and return `s` from every later call too. Bytes
  // still unread are drained first so that close() sends a FIN rather than a reset, which
  // could discard the notice before the peer reads it.
  Status fail(Status s) {
    failed_ = s;
    // A message half sent when this rank failed is finished first (bounded), so that its peer
    // reads this rank's notice next instead of a connection closed mid-message, which would
    // name this rank rather than the culprit.
    if (current_ != nullptr) {
      const auto deadline = Clock::now() + k_notice_time;
      for (Transfer& t : *current_) {
        if (!t.send || t.done == 0 || t.finished() || peers_[t.peer].fd() < 0) continue;
        iovec iov[2];
        const int n_iov = t.rest(iov);
        Io io = Io::ok;
        for (int k = 0; k < n_iov && io == Io::ok; ++k)
          io = send_all(peers_[t.peer].fd(), iov[k].iov_base, iov[k].iov_len, deadline);
        if (io == Io::ok) {
          sent_[static_cast<size_t>(t.peer)] += static_cast<int64_t>(k_header_bytes + t.num_bytes - t.done);
          t.done = k_header_bytes + t.num_bytes;
          out_partial_[t.peer] = false;
        }
      }
    }
    notify_peers(s.message());
    uint8_t sink[1 << 16];
    for (Socket& p : peers_) {
      if (p.fd() < 0) continue;
      ::shutdown(p.fd(), SHUT_WR);
      for (int i = 0; i < 64 && ::recv(p.fd(), sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
      }
      p.reset();
    }
    return s;
  }

  std::vector<Socket> peers_;
  std::vector<bool> out_partial_;  // [peer]: a message to it is half sent
  std::vector<uint8_t> scratch_;   // all-reduce receive area: the mesh's [P × piece], a pair's [piece]
  std::vector<Transfer>* current_ = nullptr;  // the transfers of the exchange in progress
  std::vector<int64_t> sent_;                 // [peer]: bytes sent by step_send (wire_bytes_sent)
  Status failed_;                  // the first failure; ok while the communicator works
};

}  // namespace

namespace detail {

Result<std::unique_ptr<Communicator>> make_tcp_communicator(const World& world, const CommOptions& options) {
  if (world.tp_size() != world.size()) {
    return unimplemented("comm/tcp: tensor-parallel groups smaller than the world are not implemented (" +
                         world.to_string() + "); use tp size = world size or the mpi backend");
  }
  const int p = world.size();
  if (p == 1) return std::unique_ptr<Communicator>(std::make_unique<TcpCommunicator>(world, std::vector<Socket>(1)));
  if (options.port < 1 || options.port > 65535) {
    return invalid_argument("comm/tcp: port " + std::to_string(options.port) + " is not a TCP port");
  }
  if (options.leader_host.empty() && world.rank() != 0) {
    return invalid_argument("comm/tcp: rank " + std::to_string(world.rank()) +
                            " needs the rank-0 host (CommOptions::leader_host) to connect to");
  }
  const Setup st{options.leader_host + ":" + std::to_string(options.port), options.rendezvous_timeout,
                 Clock::now() + options.rendezvous_timeout, p};
  std::vector<Socket> peers;
  if (world.rank() == 0) {
    SNAP_ASSIGN_OR_RETURN(peers, lead(options.port, st));
  } else {
    // With 3+ ranks this rank listens for the ranks above it: on the rendezvous port + 1 + rank
    // (a fixed port a firewall rule can name; + 1 is the NCCL id's port), or on one the kernel
    // picks if that one is taken (ranks sharing a host).
    Socket listener;
    int mesh_port = 0;
    if (p > 2) {
      std::string error;
      if (options.port + 1 + world.rank() <= 65535) listener = listen_any(options.port + 1 + world.rank(), p + 8, &error);
      if (listener.fd() < 0) listener = listen_any(0, p + 8, &error);
      sockaddr_storage a{};
      socklen_t len = sizeof a;
      if (listener.fd() < 0 || ::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
        return st.failed("rank " + std::to_string(world.rank()) + " cannot listen for the other ranks: " + error);
      mesh_port = ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
    }
    SNAP_ASSIGN_OR_RETURN(Socket leader, follow(options.leader_host, options.port, world.rank(), mesh_port, st));
    peers.resize(static_cast<size_t>(p));
    if (p > 2) {
      SNAP_ASSIGN_OR_RETURN(std::vector<MeshAddress> mesh, receive_table(leader.fd(), st));
      peers[0] = std::move(leader);
      SNAP_RETURN_IF_ERROR(connect_mesh(world.rank(), mesh, listener, peers, st));
    } else {
      peers[0] = std::move(leader);
    }
  }
  return std::unique_ptr<Communicator>(std::make_unique<TcpCommunicator>(world, std::move(peers)));
}

}  // namespace detail
}  // namespace snap::comm
