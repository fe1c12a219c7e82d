#include "engines/compress/checksum.h"

#include <isa-l/crc.h>
#include <isa-l/igzip_lib.h>
#include <xxhash.h>

namespace dpukv {

uint32_t crc32_gzip(const void* data, size_t n, uint32_t prev) {
  return crc32_gzip_refl(prev, static_cast<const unsigned char*>(data), n);
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
