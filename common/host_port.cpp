// parse_host_port: bracketed IPv6, one-colon host:port, or a bare host.
#include "common/host_port.h"

#include <algorithm>

namespace snap {

Result<HostPort> parse_host_port(const std::string& text) {
  HostPort out;
  std::string port;
  bool has_port = false;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) return invalid_argument("unclosed '['");
    out.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return invalid_argument("expected ':' after ']'");
      port = text.substr(close + 2);
      has_port = true;
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    out.host = text.substr(0, text.find(':'));
    port = text.substr(text.find(':') + 1);
    has_port = true;
  } else {
    out.host = text;
  }
  if (out.host.empty()) return invalid_argument("no host");
  if (!has_port) return out;
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return invalid_argument("the port must be a number in [1, 65535]");
  }
  out.port = std::stoi(port);
  return out;
}

}  // namespace snap
