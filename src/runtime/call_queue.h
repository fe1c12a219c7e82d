// Calls posted to a polling thread: another thread hands over a function and
// waits for its result; the polling thread runs what is pending once per loop
// (one atomic load when nothing is). How configuration reaches a poll group
// without locks on its data path.
#pragma once

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "runtime/status.h"

namespace dpukv {

class CallQueue {
 public:
  // wake_fd: an eventfd the polling thread sleeps on (written after posting), or -1.
  explicit CallQueue(int wake_fd = -1) : wake_fd_(wake_fd) {}
  void set_wake_fd(int fd) { wake_fd_ = fd; }

  // From any thread but the polling one: runs fn there and returns its result.
  Status call(std::function<Status()> fn) {
    Call c{std::move(fn), Code::kSuccess, false};
    std::unique_lock<std::mutex> lk(mu_);
    calls_.push_back(&c);
    pending_.store(true, std::memory_order_release);
    if (wake_fd_ >= 0) {
      uint64_t one = 1;
      (void)::write(wake_fd_, &one, sizeof one);
    }
    cv_.wait(lk, [&] { return c.done; });
    return c.result;
  }

  // From the polling thread: runs every pending call. True if any ran.
  bool run_pending() {
    if (!pending_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lk(mu_);
    for (Call* c : calls_) {
      c->result = c->fn();
      c->done = true;
    }
    calls_.clear();
    pending_.store(false, std::memory_order_relaxed);
    cv_.notify_all();
    return true;
  }

 private:
  struct Call {
    std::function<Status()> fn;
    Status result;
    bool done;
  };
  int wake_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call*> calls_;
  std::atomic<bool> pending_{false};
};

}  // namespace dpukv
