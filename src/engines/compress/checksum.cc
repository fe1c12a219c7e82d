#include "engines/compress/checksum.h"

#include <isa-l/crc.h>
#include <isa-l/igzip_lib.h>
#include <xxhash.h>

namespace dpukv {

uint32_t crc32_gzip(const void* data, size_t n, uint32_t prev) {
  return crc32_gzip_refl(prev, static_cast<const unsigned char*>(data), n);
}

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

uint32_t adler32(const void* data, size_t n, uint32_t prev) {
  return isal_adler32(prev, static_cast<const unsigned char*>(data), n);
}

uint32_t xxh32(const void* data, size_t n, uint32_t seed) {
  return XXH32(data, n, seed);
}

uint64_t xxh3_64(const void* data, size_t n, uint64_t seed) {
  return XXH3_64bits_withSeed(data, n, seed);
}

}  // namespace dpukv
