#include "runtime/crc32c.h"

#include <isa-l/crc.h>

namespace dpukv {

uint32_t crc32c(const void* data, size_t n, uint32_t prev) {
  // ISA-L's iSCSI CRC takes and returns the raw register (and an int length);
  // invert for the standard form and feed it in pieces below 2 GiB.
  auto* p = const_cast<unsigned char*>(static_cast<const unsigned char*>(data));
  uint32_t reg = ~prev;
  while (n > 0) {
    const size_t k = n < (1u << 30) ? n : (1u << 30);
    reg = crc32_iscsi(p, static_cast<int>(k), reg);
    p += k, n -= k;
  }
  return ~reg;
}

}  // namespace dpukv
