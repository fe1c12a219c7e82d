// Direct futex calls on a 32-bit word. std::atomic::wait/notify in GCC 12's
// libstdc++ keeps its own waiter bookkeeping and was seen here to miss wake-ups
// (a sleeping engine thread woke only on a later timer tick, ~4 ms), so every
// doorbell in dpukv uses the syscall directly: wake only says "look again", and
// every waiter re-checks its condition after waking.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>

namespace dpukv {

// Sleeps while *word == expected (or until timeout_ns, 0 = none, or a signal).
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns = 0) {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000ull),
              static_cast<long>(timeout_ns % 1000000000ull)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected,
          timeout_ns ? &ts : nullptr, nullptr, 0);
}

inline void futex_wake(std::atomic<uint32_t>* word, int n = 1) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

}  // namespace dpukv
