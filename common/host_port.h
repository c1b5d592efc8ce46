// "HOST", "HOST:PORT", "[IPV6]" and "[IPV6]:PORT" into a host and a port (0 when not
// given). An unbracketed address with several ':' is a bare IPv6 host. Errors are a short
// reason for the caller to prefix with the flag or URL it came from.
#pragma once

#include <string>

#include "common/status.h"

namespace snap {

struct HostPort {
  std::string host;
  int port = 0;  // 0: not given
};

Result<HostPort> parse_host_port(const std::string& text);

}  // namespace snap
