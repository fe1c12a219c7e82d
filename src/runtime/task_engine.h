// The task lifecycle every software engine context shares (DMA, compress): a
// fixed task pool, validation at submit whose failures still complete through the
// callbacks (on the next progress()), engine threads behind rings, and completion
// through a success or an error callback, with SHUTDOWN for tasks completing while
// the context stops.
//
// Task must have these members, visible to TaskEngine<Task> (a friend):
//   State state_ (an enum with kFree, kAllocated, kInFlight), Status status_, UserData ud_.
// Owned by the context's progress-engine thread.
#pragma once

#include <memory>

#include "runtime/context.h"
#include "runtime/engine_workers.h"
#include "runtime/spsc_ring.h"
#include "runtime/task_pool.h"

namespace dpukv {

template <typename Task>
class TaskEngine {
 public:
  using Cb = void (*)(Task* task, UserData task_ud, UserData ctx_ud);
  using ExecFn = typename EngineWorkers<Task>::ExecFn;

  // Context configuration (the caller checks IDLE).
  Status configure(Cb on_done, Cb on_error, uint32_t num_tasks) {
    if (on_done == nullptr || on_error == nullptr || num_tasks == 0) return Code::kInvalidValue;
    DPUKV_RETURN_IF_ERROR(pool_.reset(num_tasks));
    on_done_ = on_done;
    on_error_ = on_error;
    return Code::kSuccess;
  }

  Status start(EngineWorkersOptions wo, ExecFn exec, void* ctx, ProgressEngine* pe) {
    if (pool_.size() == 0) return Code::kBadState;  // not configured
    rejected_ = std::make_unique<SpscRing<Task*>>(pool_.size());
    wo.cq_depth = pool_.size();  // every task may be completed at once
    return workers_.start(wo, exec, ctx, pe);
  }
  void flush() { workers_.flush(); }
  // True once nothing is in flight and every task is free; stops the threads.
  bool drained() {
    if (inflight_ != 0 || pool_.outstanding() != 0) return false;
    workers_.stop();
    rejected_.reset();
    return true;
  }
  void stop_threads() { workers_.stop(); }

  // A task from the pool, in the allocated state; nullptr when the pool is empty.
  Task* alloc() {
    Task* t = pool_.alloc();
    if (t == nullptr) return nullptr;
    t->status_ = Code::kSuccess;
    t->state_ = Task::State::kAllocated;
    return t;
  }
  bool allocated(const Task* t) const {
    return pool_.owns(t) && t->state_ == Task::State::kAllocated;
  }
  Status free(Task* t) {
    if (!allocated(t)) return Code::kInvalidValue;
    t->state_ = Task::State::kFree;
    pool_.free(t);
    return Code::kSuccess;
  }

  // validation: the caller's verdict on the task's buffers. A failed task is
  // accepted and completes with that status; AGAIN when every queue is full.
  Status submit(Task* t, Status validation) {
    t->state_ = Task::State::kInFlight;
    if (!validation.ok()) {
      t->status_ = validation;
      (void)rejected_->push(t);  // sized to the pool: cannot fail
      ++inflight_;
      return Code::kSuccess;
    }
    if (!workers_.submit(t)) {
      t->state_ = Task::State::kAllocated;
      return Code::kAgain;
    }
    ++inflight_;
    return Code::kSuccess;
  }

  size_t poll(bool stopping, UserData ctx_ud) {
    constexpr size_t kBatch = 64;
    Task* batch[kBatch];
    size_t events = 0, n;
    if (rejected_) {
      while ((n = rejected_->pop_bulk(batch, kBatch)) != 0) {
        for (size_t i = 0; i < n; ++i) complete(batch[i], stopping, ctx_ud);
        events += n;
      }
    }
    while ((n = workers_.poll(batch, kBatch)) != 0) {
      for (size_t i = 0; i < n; ++i) complete(batch[i], stopping, ctx_ud);
      events += n;
    }
    return events;
  }

  bool arm() { return workers_.arm() || (rejected_ && !rejected_->empty()); }
  uint32_t inflight() const { return inflight_; }

 private:
  void complete(Task* t, bool stopping, UserData ctx_ud) {
    --inflight_;
    t->state_ = Task::State::kAllocated;
    if (stopping && t->status_.ok()) t->status_ = Code::kShutdown;
    // The callback may free or resubmit the task.
    (t->status_.ok() ? on_done_ : on_error_)(t, t->ud_, ctx_ud);
  }

  Cb on_done_ = nullptr, on_error_ = nullptr;
  TaskPool<Task> pool_;
  std::unique_ptr<SpscRing<Task*>> rejected_;
  EngineWorkers<Task> workers_;
  uint32_t inflight_ = 0;
};

}  // namespace dpukv
