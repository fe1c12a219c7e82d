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

}  // namespace dpukv
