// CRC-32C (Castagnoli), as iSCSI, NVMe/TCP digests and the disk log use it: one
// implementation (ISA-L), in a library of its own so that only its users link ISA-L.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dpukv {

// Standard form (init and final inversion inside); prev chains pieces (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t prev = 0);

}  // namespace dpukv
