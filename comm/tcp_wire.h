// The TCP communicator's wire format (comm/tcp.cpp), as pure functions over bytes so that
// what a peer — or anything else that connects to the leader's port — sends is checked in
// one place, and fuzzed (fuzz/fuzz_tcp_wire.cpp). Little-endian.
//   Setup: hello = u32 {magic, rank, world_size, mesh port}; reply = u32 {magic, verdict, value}
//   (with 3+ ranks, then the mesh table: comm/tcp.cpp).
//   Collectives: a 16-byte header {u32 magic, u32 kind, u64 num_bytes} + payload; kind is
//   the CommOp + 1, or k_kind_abort for an abort notice whose payload is a one-line message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace snap::comm::tcp_wire {

constexpr uint32_t k_magic = 0x54504e53;  // "SNPT": not the rendezvous' "SNAP"
constexpr uint32_t k_kind_abort = 0xff;
constexpr size_t k_header_bytes = 16;
constexpr size_t k_max_notice = 4096;  // longest abort notice accepted

struct Header {
  uint32_t magic = 0;
  uint32_t kind = 0;
  uint64_t num_bytes = 0;
};

void encode_header(uint8_t* out, uint32_t kind, uint64_t num_bytes);  // out[k_header_bytes]
Header decode_header(const uint8_t* in);                               // in[k_header_bytes]
uint32_t kind_of(CommOp op);
// "all_reduce_sum", ..., "an abort notice" or "kind 17".
std::string kind_name(uint32_t kind);

// What a header received while this rank is in `op`, expecting `expected_bytes`, means.
enum class HeaderVerdict : uint8_t {
  ok,              // the expected message: read its payload
  abort_notice,    // the peer aborted: read its num_bytes of message text
  notice_too_long, // an abort notice longer than k_max_notice: its text is not read
  bad_magic,       // not our protocol (or a misread stream)
  mismatch,        // another collective or size: the ranks called different collectives
};
HeaderVerdict check_header(const Header& h, CommOp op, uint64_t expected_bytes);

// Rank 0's view of one hello (its first three words; the fourth, the mesh port, is any value)
// while the group forms: joined[r] says whether rank r is already connected (joined.size() is
// rank 0's world size).
enum class HelloVerdict : uint8_t {
  ok,
  not_ours,      // bad magic: a stray connection (a probe); ignored, the group keeps waiting
  bad_size,      // the peer was started with another world size: the group fails
  bad_rank,      // rank 0, out of range, or joined twice: the group fails
};
HelloVerdict check_hello(const uint32_t hello[3], const std::vector<bool>& joined);

}  // namespace snap::comm::tcp_wire
