#include "runtime/host_port.h"

namespace dpukv {

bool parse_host_port(const std::string& text, std::string* host, uint16_t* port,
                     uint16_t default_port) {
  const size_t colon = text.rfind(':');
  const std::string digits = colon == std::string::npos ? "" : text.substr(colon + 1);
  *host = colon == std::string::npos ? text : text.substr(0, colon);
  if (host->empty()) return false;
  if (digits.empty()) {
    *port = default_port;
    return default_port != 0;
  }
  if (digits.size() > 5) return false;
  uint32_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  if (v > 65535) return false;
  *port = static_cast<uint16_t>(v);
  return true;
}

}  // namespace dpukv
