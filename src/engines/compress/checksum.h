// Checksums the compress engine returns and the cache verifies, each computed by a
// library Debian ships (ISA-L, xxHash).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/crc32c.h"  // crc32c, with the checksums below

namespace dpukv {

// CRC-32 as gzip/zlib define it (reflected 0x04C11DB7), init 0.
uint32_t crc32_gzip(const void* data, size_t n, uint32_t prev = 0);
// Adler-32 as zlib defines it; pass 1 to start.
uint32_t adler32(const void* data, size_t n, uint32_t prev = 1);
uint32_t xxh32(const void* data, size_t n, uint32_t seed = 0);
uint64_t xxh3_64(const void* data, size_t n, uint64_t seed = 0);

}  // namespace dpukv
