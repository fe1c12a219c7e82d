// Tests only: little-endian fields of a page the tests read at the specification's
// byte offsets.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace dpukv::nvme::test_bytes {

inline uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline std::string ascii(const uint8_t* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

}  // namespace dpukv::nvme::test_bytes
