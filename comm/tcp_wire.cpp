// The TCP communicator's wire format: header coding and the checks of what peers send.
#include "comm/tcp_wire.h"

#include <endian.h>

#include <cstring>

namespace snap::comm::tcp_wire {

void encode_header(uint8_t* out, uint32_t kind, uint64_t num_bytes) {
  const uint32_t w[2] = {htole32(k_magic), htole32(kind)};
  const uint64_t n = htole64(num_bytes);
  std::memcpy(out, w, 8);
  std::memcpy(out + 8, &n, 8);
}

Header decode_header(const uint8_t* in) {
  uint32_t w[2];
  uint64_t n;
  std::memcpy(w, in, 8);
  std::memcpy(&n, in + 8, 8);
  return {le32toh(w[0]), le32toh(w[1]), le64toh(n)};
}

uint32_t kind_of(CommOp op) { return static_cast<uint32_t>(op) + 1; }

std::string kind_name(uint32_t kind) {
  if (kind >= 1 && kind <= k_num_comm_ops) return comm_op_name(static_cast<CommOp>(kind - 1));
  if (kind == k_kind_abort) return "an abort notice";
  return "kind " + std::to_string(kind);
}

HeaderVerdict check_header(const Header& h, CommOp op, uint64_t expected_bytes) {
  if (h.magic != k_magic) return HeaderVerdict::bad_magic;
  if (h.kind == k_kind_abort) return h.num_bytes > k_max_notice ? HeaderVerdict::notice_too_long : HeaderVerdict::abort_notice;
  if (h.kind != kind_of(op) || h.num_bytes != expected_bytes) return HeaderVerdict::mismatch;
  return HeaderVerdict::ok;
}

HelloVerdict check_hello(const uint32_t hello[3], const std::vector<bool>& joined) {
  if (hello[0] != k_magic) return HelloVerdict::not_ours;
  if (hello[2] != joined.size()) return HelloVerdict::bad_size;
  const uint32_t rank = hello[1];
  if (rank < 1 || rank >= joined.size() || joined[rank]) return HelloVerdict::bad_rank;
  return HelloVerdict::ok;
}

}  // namespace snap::comm::tcp_wire
