// The TCP communicator's wire checks (comm/tcp_wire.h): bytes a peer, or any stray
// connection to the leader's port, sends. The input is a sequence of records: one byte
// choosing the collective and expected size, then a 16-byte message header or a 12-byte
// hello. Checks: a header decodes to what re-encodes to the same bytes; only our magic is
// ever ok; an ok header is exactly the expected collective and size; a hello is ok only for
// a free rank in range of the same world size.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/tcp_wire.h"

using namespace snap::comm;
using namespace snap::comm::tcp_wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t at = 0;
  while (at < size) {
    const uint8_t sel = data[at++];
    const CommOp op = static_cast<CommOp>(sel % k_num_comm_ops);
    if ((sel & 0x80) == 0) {
      if (size - at < k_header_bytes) break;
      const Header h = decode_header(data + at);
      uint8_t again[k_header_bytes];
      encode_header(again, h.kind, h.num_bytes);
      if (h.magic == k_magic && std::memcmp(again, data + at, k_header_bytes) != 0) std::abort();
      const uint64_t expected = (sel >> 2) & 0x1f;
      const HeaderVerdict v = check_header(h, op, expected);
      if (v != HeaderVerdict::bad_magic && h.magic != k_magic) std::abort();
      if (v == HeaderVerdict::ok && (h.kind != kind_of(op) || h.num_bytes != expected)) std::abort();
      if (v == HeaderVerdict::abort_notice && h.num_bytes > k_max_notice) std::abort();
      (void)kind_name(h.kind);
      at += k_header_bytes;
    } else {
      if (size - at < 12) break;
      uint32_t hello[3];
      std::memcpy(hello, data + at, sizeof hello);
      std::vector<bool> joined(1 + (sel & 0x07));
      for (size_t r = 1; r < joined.size(); ++r) joined[r] = (sel >> 3) & (1u << (r % 4));
      const HelloVerdict v = check_hello(hello, joined);
      if (v == HelloVerdict::ok && (hello[1] == 0 || hello[1] >= joined.size() || joined[hello[1]] ||
                                    hello[2] != joined.size() || hello[0] != k_magic)) {
        std::abort();
      }
      at += 12;
    }
  }
  return 0;
}
