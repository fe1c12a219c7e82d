// Bounded single-producer single-consumer ring of trivially copyable items: the
// submission and completion queues between a progress-engine thread and an
// engine thread, as a hardware queue pair would be.
//
// Publication: the producer writes slots, then stores tail_ with release; the
// consumer loads tail_ with acquire and so sees the slots. The consumer stores
// head_ with release after reading slots; the producer's acquire load of head_
// guarantees the slots are free before it overwrites them. Each side caches the
// other's index so that a busy ring touches the shared cache line once per batch,
// not once per item.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

namespace dpukv {

inline constexpr size_t kCacheLine = 64;

template <typename T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  // capacity is rounded up to a power of two.
  explicit SpscRing(size_t capacity) {
    size_t cap = 1;
    while (cap < capacity) cap <<= 1;
    mask_ = cap - 1;
    slots_.reset(new T[cap]);
  }
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;

  size_t capacity() const { return mask_ + 1; }

  // Producer side.
  bool push(const T& v) {
    const uint64_t t = tail_.load(std::memory_order_relaxed);
    if (t - cached_head_ > mask_) {
      cached_head_ = head_.load(std::memory_order_acquire);
      if (t - cached_head_ > mask_) return false;
    }
    slots_[t & mask_] = v;
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }

  // Consumer side: pops up to max items into out, returns the count.
  size_t pop_bulk(T* out, size_t max) {
    const uint64_t h = head_.load(std::memory_order_relaxed);
    if (cached_tail_ - h < max) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (cached_tail_ == h) return 0;
    }
    size_t n = static_cast<size_t>(cached_tail_ - h);
    if (n > max) n = max;
    for (size_t i = 0; i < n; ++i) out[i] = slots_[(h + i) & mask_];
    head_.store(h + n, std::memory_order_release);
    return n;
  }

  bool pop(T* out) { return pop_bulk(out, 1) == 1; }

  // Consumer side: reads the oldest item without removing it.
  bool peek(T* out) {
    const uint64_t h = head_.load(std::memory_order_relaxed);
    if (cached_tail_ == h) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (cached_tail_ == h) return false;
    }
    *out = slots_[h & mask_];
    return true;
  }

  // Either side; exact only when the other side is quiescent.
  bool empty() const {
    return head_.load(std::memory_order_acquire) == tail_.load(std::memory_order_acquire);
  }
  size_t size() const {
    return static_cast<size_t>(tail_.load(std::memory_order_acquire) -
                               head_.load(std::memory_order_acquire));
  }

 private:
  alignas(kCacheLine) std::atomic<uint64_t> head_{0};  // consumer writes
  uint64_t cached_tail_ = 0;                           // consumer's copy of tail_
  alignas(kCacheLine) std::atomic<uint64_t> tail_{0};  // producer writes
  uint64_t cached_head_ = 0;                           // producer's copy of head_
  alignas(kCacheLine) size_t mask_ = 0;
  std::unique_ptr<T[]> slots_;
};

}  // namespace dpukv
