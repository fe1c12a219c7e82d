#include "engines/compress/kv_byte_planes.h"

#include <immintrin.h>

namespace dpukv::kv_planes {

// Splits one row of n values into the high plane (XORed with the previous row's
// high bytes when prev is set) and the low plane.
void split_scalar(const uint16_t* cur, const uint16_t* prev, size_t n, uint8_t* hi, uint8_t* lo) {
  for (size_t i = 0; i < n; ++i) {
    uint8_t h = static_cast<uint8_t>(cur[i] >> 8);
    if (prev) h ^= static_cast<uint8_t>(prev[i] >> 8);
    hi[i] = h;
    lo[i] = static_cast<uint8_t>(cur[i]);
  }
}

__attribute__((target("avx2"))) void split_avx2(const uint16_t* cur, const uint16_t* prev, size_t n,
                                                uint8_t* hi, uint8_t* lo) {
  const __m256i mask = _mm256_set1_epi16(0xff);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur + i + 16));
    __m256i ha = _mm256_srli_epi16(a, 8), hb = _mm256_srli_epi16(b, 8);
    if (prev) {
      __m256i pa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(prev + i));
      __m256i pb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(prev + i + 16));
      ha = _mm256_xor_si256(ha, _mm256_srli_epi16(pa, 8));
      hb = _mm256_xor_si256(hb, _mm256_srli_epi16(pb, 8));
    }
    __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi16(ha, hb), 0xd8);
    __m256i l = _mm256_permute4x64_epi64(
        _mm256_packus_epi16(_mm256_and_si256(a, mask), _mm256_and_si256(b, mask)), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i), h);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), l);
  }
  split_scalar(cur + i, prev ? prev + i : nullptr, n - i, hi + i, lo + i);
}

// Inverse: out = lo | (hi ^ prev_hi) << 8, where prev is the previous output row.
void merge_scalar(const uint8_t* hi, const uint8_t* lo, const uint16_t* prev, size_t n,
                  uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    uint8_t h = hi[i];
    if (prev) h ^= static_cast<uint8_t>(prev[i] >> 8);
    out[i] = static_cast<uint16_t>(lo[i] | (h << 8));
  }
}

__attribute__((target("avx2"))) void merge_avx2(const uint8_t* hi, const uint8_t* lo,
                                                const uint16_t* prev, size_t n, uint16_t* out) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + i));
    __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + i));
    if (prev) {
      __m256i pa =
          _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(prev + i)), 8);
      __m256i pb =
          _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(prev + i + 16)), 8);
      h = _mm256_xor_si256(h, _mm256_permute4x64_epi64(_mm256_packus_epi16(pa, pb), 0xd8));
    }
    // Interleave per 128-bit lane, then put the lanes back in order.
    __m256i x = _mm256_unpacklo_epi8(l, h), y = _mm256_unpackhi_epi8(l, h);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute2x128_si256(x, y, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16),
                        _mm256_permute2x128_si256(x, y, 0x31));
  }
  merge_scalar(hi + i, lo + i, prev ? prev + i : nullptr, n - i, out + i);
}

}  // namespace dpukv::kv_planes
