// "ADDR:PORT" as users write network endpoints (--listen, --nvme-tier, --address):
// one parser, so every flag refuses the same malformed text the same way.
#pragma once

#include <cstdint>
#include <string>

namespace dpukv {

// Splits at the last ':'; the port is 0..65535 in decimal with nothing after it.
// Without a ':' (or with an empty port) the text is only a host: *port =
// default_port if that is nonzero, else false.
bool parse_host_port(const std::string& text, std::string* host, uint16_t* port,
                     uint16_t default_port = 0);

// The dotted IPv4 address of host: itself when it is one, else the first IPv4
// address the resolver gives for the name ("localhost"). False with *why (the
// resolver's words) when there is none.
bool resolve_ipv4(const std::string& host, std::string* addr, std::string* why);

}  // namespace dpukv
