// The one monotonic clock of the project (timeouts, deadlines, latencies).
#pragma once

#include <cstdint>
#include <ctime>

namespace dpukv {

inline uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}
inline uint64_t monotonic_us() {
  return monotonic_ns() / 1000;
}
inline uint64_t monotonic_ms() {
  return monotonic_ns() / 1000000;
}

}  // namespace dpukv
