// The checksum every chunk carries (xxh3-64), on the bulk paths that hash whole
// chunks (copy engines, reloads). XXH3's digest is the same whatever SIMD computes
// it; Debian's libxxhash exports its run-time dispatch on x86-64 (SSE2, AVX2 or
// AVX-512 by what the CPU has), whereas its plain XXH3_64bits is built for SSE2.
// Where the CPU hashes slowly, the GPU's link outruns one core (issue 22's
// figures: 6 GB/s a core on the H200 machine's Xeon, 55 GB/s the link).
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#define XXH_DISPATCH_DISABLE_REPLACE  // its names, not XXH3_64bits redefined for every includer
#include <xxh_x86dispatch.h>
#define DPUKV_XXH3_DISPATCH 1
#endif

namespace dpukv {

inline uint64_t chunk_checksum(const void* p, size_t n) {
#ifdef DPUKV_XXH3_DISPATCH
  return XXH3_64bits_dispatch(p, n);
#else
  return XXH3_64bits(p, n);
#endif
}

// A streamed checksum's next piece (the DMA engine hashes as it copies).
inline void chunk_checksum_update(XXH3_state_t* s, const void* p, size_t n) {
#ifdef DPUKV_XXH3_DISPATCH
  (void)XXH3_64bits_update_dispatch(s, p, n);
#else
  (void)XXH3_64bits_update(s, p, n);
#endif
}

}  // namespace dpukv
