// Sync events (doca_sync_event): a 64-bit value that launches wait on and update,
// with wait-greater-than semantics, as DOCA DPA kernel launches use them.
#pragma once

#include <atomic>
#include <cstdint>

namespace dpukv {

class SyncEvent {
 public:
  explicit SyncEvent(uint64_t initial = 0) : value_(initial) {}
  SyncEvent(const SyncEvent&) = delete;
  SyncEvent& operator=(const SyncEvent&) = delete;

  uint64_t get() const { return value_.load(std::memory_order_acquire); }
  void set(uint64_t v) {
    value_.store(v, std::memory_order_release);
    value_.notify_all();
  }
  void add(uint64_t d) {
    value_.fetch_add(d, std::memory_order_acq_rel);
    value_.notify_all();
  }
  // Blocks until the value is greater than threshold: spins briefly, then sleeps.
  void wait_gt(uint64_t threshold) const {
    for (int i = 0; i < 1000; ++i)
      if (get() > threshold) return;
    for (uint64_t v = get(); v <= threshold; v = get()) value_.wait(v, std::memory_order_acquire);
  }

 private:
  std::atomic<uint64_t> value_;
};

}  // namespace dpukv
