#include "runtime/host_port.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

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

bool resolve_ipv4(const std::string& host, std::string* addr, std::string* why) {
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) {
    *addr = host;
    return true;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    *why = rc != 0 ? gai_strerror(rc) : "no IPv4 address";
    return false;
  }
  char text[INET_ADDRSTRLEN];
  const auto* sin = reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  const bool ok = inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text) != nullptr;
  freeaddrinfo(res);
  if (!ok) {
    *why = "no IPv4 address";
    return false;
  }
  *addr = text;
  return true;
}

}  // namespace dpukv
