// Fixed pool of tasks of one type, sized when a context is configured (doca_task
// pools). Allocation and free are a pointer pop and push: no allocation after
// reset(). Owned by the progress-engine thread.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/status.h"

namespace dpukv {

template <typename T>
class TaskPool {
 public:
  // Sizes the pool; only while no task is out.
  Status reset(uint32_t n) {
    if (outstanding() != 0) return Code::kBadState;
    tasks_.reset(n ? new T[n] : nullptr);
    free_.reset(n ? new T*[n] : nullptr);
    size_ = num_free_ = n;
    for (uint32_t i = 0; i < n; ++i) free_[i] = &tasks_[n - 1 - i];
    return Code::kSuccess;
  }
  T* alloc() { return num_free_ ? free_[--num_free_] : nullptr; }
  void free(T* t) { free_[num_free_++] = t; }
  // True if t points at a task of this pool (validates handles from callers).
  bool owns(const T* t) const { return size_ != 0 && t >= &tasks_[0] && t < &tasks_[0] + size_; }
  uint32_t size() const { return size_; }
  // The i-th task of the pool, for one-time setup after reset().
  T& at(uint32_t i) { return tasks_[i]; }
  uint32_t outstanding() const { return size_ - num_free_; }

 private:
  std::unique_ptr<T[]> tasks_;
  std::unique_ptr<T*[]> free_;
  uint32_t size_ = 0;
  uint32_t num_free_ = 0;
};

}  // namespace dpukv
