// Sync events (doca_sync_event): a 64-bit value that launches wait on and update,
// with wait-greater-than semantics, as DOCA DPA kernel launches use them.
#pragma once

#include <atomic>
#include <cstdint>

#include "runtime/futex.h"

namespace dpukv {

class SyncEvent {
 public:
  explicit SyncEvent(uint64_t initial = 0) : value_(initial) {}
  SyncEvent(const SyncEvent&) = delete;
  SyncEvent& operator=(const SyncEvent&) = delete;

  uint64_t get() const { return value_.load(std::memory_order_acquire); }
  void set(uint64_t v) {
    value_.store(v, std::memory_order_release);
    bump();
  }
  void add(uint64_t d) {
    value_.fetch_add(d, std::memory_order_acq_rel);
    bump();
  }
  // Blocks until the value is greater than threshold: spins briefly, then sleeps on
  // a 32-bit generation word (futexes are 32-bit) that every update bumps.
  void wait_gt(uint64_t threshold) const {
    for (int i = 0; i < 1000; ++i)
      if (get() > threshold) return;
    for (;;) {
      const uint32_t g = gen_.load(std::memory_order_acquire);
      if (get() > threshold) return;
      futex_wait(&gen_, g);
    }
  }

 private:
  void bump() {
    gen_.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(&gen_, 1 << 30);
  }
  std::atomic<uint64_t> value_;
  mutable std::atomic<uint32_t> gen_{0};
};

}  // namespace dpukv
