// Scalar half-precision conversions, exact and deterministic: the reference the
// SIMD paths are checked against bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace dpukv {

inline float bits_to_f32(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float bf16_to_f32(uint16_t h) {
  return bits_to_f32(static_cast<uint32_t>(h) << 16);
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t b = f32_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bits_to_f32(sign);
    // Subnormal: normalize.
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    man &= 0x3ffu;
    return bits_to_f32(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (man << 13));
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

// IEEE round to nearest even, with overflow to infinity and subnormals.
inline uint16_t f32_to_fp16(float f) {
  const uint32_t b = f32_to_bits(f);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t absb = b & 0x7fffffffu;
  if (absb > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absb >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (absb < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (absb < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absb >> 23;
    const uint32_t m = (absb & 0x7fffffu) | 0x800000u;
    // Value = m * 2^(e-150); half subnormal unit = 2^-24. Units = m * 2^(e-126).
    const uint32_t rshift = 126 - e;  // in [14, 24]
    uint32_t units = m >> rshift;
    const uint32_t rem = m & ((1u << rshift) - 1);
    const uint32_t half = 1u << (rshift - 1);
    if (rem > half || (rem == half && (units & 1u))) ++units;
    return static_cast<uint16_t>(sign | units);
  }
  uint32_t h = ((absb - 0x38000000u) >> 13);  // rebias exponent, keep 10 mantissa bits
  const uint32_t rem = absb & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace dpukv
