// Software engine threads: the stand-in for a hardware engine's queues, shared by
// every software engine (DMA, compress, kernels).
//
// Each worker thread has a submission ring (owner thread → worker) and a completion
// ring (back). The owner submits round robin and polls completions; a worker runs
// exec(task) for each task it pops. Nothing is allocated and no lock is taken per
// task. A worker spins for spin_us after its last task, then sleeps on a futex word
// that the owner touches only when the worker sleeps (doorbell). When the owner's
// progress engine is armed, a worker that publishes completions signals it.
//
// Lifetimes: start() allocates; stop() joins. The owner (one thread) calls
// everything except what runs inside exec.
#pragma once

#include <immintrin.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/futex.h"
#include "runtime/log.h"
#include "runtime/progress_engine.h"
#include "runtime/spsc_ring.h"
#include "runtime/status.h"

namespace dpukv {

struct EngineWorkersOptions {
  uint32_t num_threads = 1;
  uint32_t sq_depth = 256;  // submission slots per thread
  uint32_t cq_depth = 256;  // completion slots per thread; >= tasks that can be in flight
  uint32_t spin_us = 100;
  int first_cpu = -1;  // >= 0: pin thread i to CPU first_cpu + i
};

template <typename Task>
class EngineWorkers {
 public:
  // Runs on worker thread `worker`. flushing: the context is stopping; complete the
  // task without doing its work (its status should say SHUTDOWN).
  using ExecFn = void (*)(Task* task, bool flushing, void* ctx, uint32_t worker);

  EngineWorkers() = default;
  EngineWorkers(const EngineWorkers&) = delete;
  EngineWorkers& operator=(const EngineWorkers&) = delete;
  ~EngineWorkers() { stop(); }

  Status start(const EngineWorkersOptions& o, ExecFn exec, void* ctx, ProgressEngine* pe) {
    if (!workers_.empty()) return Code::kBadState;
    flushing_.store(false);
    for (uint32_t i = 0; i < o.num_threads; ++i) {
      workers_.push_back(std::make_unique<Worker>(o.sq_depth, o.cq_depth));
      Worker* w = workers_.back().get();
      int cpu = o.first_cpu < 0 ? -1 : o.first_cpu + static_cast<int>(i);
      w->thread =
          std::thread([this, w, o, exec, ctx, pe, cpu, i] { run(w, o, exec, ctx, pe, cpu, i); });
    }
    return Code::kSuccess;
  }

  // False if every submission ring is full.
  bool submit(Task* t) {
    const size_t n = workers_.size();
    for (size_t i = 0; i < n; ++i) {
      Worker* w = workers_[next_].get();
      next_ = next_ + 1 == n ? 0 : next_ + 1;
      if (w->sq.push(t)) {
        w->ring_doorbell();
        return true;
      }
    }
    return false;
  }

  // Pops up to max completions over all workers.
  size_t poll(Task** out, size_t max) {
    size_t got = 0;
    for (size_t i = 0; i < workers_.size() && got < max; ++i)
      got += workers_[i]->cq.pop_bulk(out + got, max - got);
    return got;
  }

  // Arms the completion signal; true if completions are already waiting.
  bool arm() {
    armed_.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (auto& w : workers_)
      if (!w->cq.empty()) return true;
    return false;
  }

  void flush() {
    flushing_.store(true, std::memory_order_release);
    for (auto& w : workers_) w->ring_doorbell();
  }

  void stop() {
    for (auto& w : workers_) {
      w->quit.store(true, std::memory_order_release);
      w->sleeping.store(0);
      futex_wake(&w->sleeping);
    }
    for (auto& w : workers_)
      if (w->thread.joinable()) w->thread.join();
    workers_.clear();
    next_ = 0;
  }

  bool running() const { return !workers_.empty(); }

 private:
  struct Worker {
    Worker(size_t sq_slots, size_t cq_slots) : sq(sq_slots), cq(cq_slots) {}
    SpscRing<Task*> sq;
    SpscRing<Task*> cq;
    // Doorbell: 1 while the worker sleeps (or is about to). The owner publishes its
    // ring entry, then reads this; the worker sets it, then re-reads the ring. With a
    // seq_cst fence on both sides one of them always sees the other (Dekker).
    std::atomic<uint32_t> sleeping{0};
    std::atomic<bool> quit{false};
    std::thread thread;
    void ring_doorbell() {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (sleeping.load(std::memory_order_relaxed) != 0) {
        sleeping.store(0, std::memory_order_relaxed);
        futex_wake(&sleeping);
      }
    }
  };

  void run(Worker* w, EngineWorkersOptions o, ExecFn exec, void* ctx, ProgressEngine* pe, int cpu,
           uint32_t index) {
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (sched_setaffinity(0, sizeof(set), &set) != 0)
        LOG_WARN("cannot pin engine thread to CPU %d", cpu);
    }
    constexpr size_t kBatch = 32;
    Task* batch[kBatch];
    const auto spin = std::chrono::microseconds(o.spin_us);
    auto idle_since = std::chrono::steady_clock::now();
    bool idle = false;
    while (!w->quit.load(std::memory_order_acquire)) {
      size_t n = w->sq.pop_bulk(batch, kBatch);
      if (n == 0) {
        if (!idle) {
          idle = true;
          idle_since = std::chrono::steady_clock::now();
        }
        _mm_pause();
        if (std::chrono::steady_clock::now() - idle_since < spin) continue;
        w->sleeping.store(1, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (!w->sq.empty() || w->quit.load(std::memory_order_acquire)) {
          w->sleeping.store(0, std::memory_order_relaxed);
          continue;
        }
        futex_wait(&w->sleeping, 1);
        idle = false;
        continue;
      }
      idle = false;
      const bool flush = flushing_.load(std::memory_order_acquire);
      for (size_t i = 0; i < n; ++i) {
        exec(batch[i], flush, ctx, index);
        (void)w->cq.push(batch[i]);  // cq_depth >= tasks in flight: cannot fail
      }
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (armed_.load(std::memory_order_relaxed) && armed_.exchange(false)) pe->notify();
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  size_t next_ = 0;
  std::atomic<bool> flushing_{false};
  std::atomic<bool> armed_{false};
};

}  // namespace dpukv
