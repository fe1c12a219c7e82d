// Byte planes of 16-bit KV values: a row of n values splits into a plane of high
// bytes (XORed with the previous row's, where K/V rows change slowly, so the
// plane is mostly zeros for the entropy coder) and a plane of low bytes; merge
// undoes it. Scalar and AVX2 forms; the codec picks one per chunk.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dpukv::kv_planes {

using SplitFn = void (*)(const uint16_t*, const uint16_t*, size_t, uint8_t*, uint8_t*);
using MergeFn = void (*)(const uint8_t*, const uint8_t*, const uint16_t*, size_t, uint16_t*);

// prev: the previous row (null for the first).
void split_scalar(const uint16_t* cur, const uint16_t* prev, size_t n, uint8_t* hi, uint8_t* lo);
__attribute__((target("avx2"))) void split_avx2(const uint16_t* cur, const uint16_t* prev, size_t n,
                                                uint8_t* hi, uint8_t* lo);
void merge_scalar(const uint8_t* hi, const uint8_t* lo, const uint16_t* prev, size_t n,
                  uint16_t* out);
__attribute__((target("avx2"))) void merge_avx2(const uint8_t* hi, const uint8_t* lo,
                                                const uint16_t* prev, size_t n, uint16_t* out);

}  // namespace dpukv::kv_planes
