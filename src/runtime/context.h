// Contexts (doca_ctx): the objects that do work, each connected to one progress
// engine for its whole life.
//
//   IDLE ──start()──▶ STARTING ──(ready)──▶ RUNNING ──stop()──▶ STOPPING ──(all tasks freed)──▶
//   IDLE
//
// Configuration (task pools, callbacks) is allowed only while IDLE; otherwise
// BAD_STATE. start() returns SUCCESS if the context is RUNNING on return, or
// IN_PROGRESS if it waits in STARTING (for a connection, say). stop() flushes every
// in-flight task through its error callback with status SHUTDOWN; the context
// reaches IDLE only once every task taken from its pools has been freed, so a
// caller that holds a task must free it. stop() returns SUCCESS if IDLE on return,
// IN_PROGRESS otherwise. State changes are reported through the state callback,
// on the progress-engine thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/progress_engine.h"
#include "runtime/status.h"

namespace dpukv {

enum class CtxState : uint8_t { kIdle, kStarting, kRunning, kStopping };
const char* ctx_state_name(CtxState s);

// User data passed back to callbacks, as doca_data.
union UserData {
  void* ptr;
  uint64_t u64;
};

class Context;
using CtxStateCb = void (*)(UserData ctx_user_data, Context* ctx, CtxState prev, CtxState next);

class Context {
 public:
  virtual ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Status set_state_changed_cb(CtxStateCb cb);
  Status set_user_data(UserData ud);
  UserData user_data() const { return user_data_; }

  Status start();
  Status stop();
  CtxState state() const { return state_; }
  ProgressEngine* pe() const { return pe_; }

 protected:
  explicit Context(ProgressEngine* pe);

  // Called by start() in STARTING. SUCCESS moves to RUNNING; IN_PROGRESS stays in
  // STARTING until the subclass calls set_state(kRunning); an error returns to IDLE.
  virtual Status do_start() = 0;
  // Called by stop() after the move to STOPPING: begin flushing in-flight work.
  virtual void do_stop() = 0;
  // True once nothing is in flight and every task is back in its pool; the
  // subclass releases its resources (threads, queues) before answering true.
  virtual bool drained() = 0;
  // Delivers completions; returns the number of events handled.
  virtual size_t poll() = 0;
  // Arms wake-ups; returns true if work is already pending. The arm holds until
  // disarm_notification(), which ProgressEngine::clear_notification() calls.
  virtual bool arm_notification() = 0;
  virtual void disarm_notification() {}

  void set_state(CtxState next);
  Status require_idle() const { return state_ == CtxState::kIdle ? Status() : Code::kBadState; }

 private:
  friend class ProgressEngine;
  bool progress_once();
  ProgressEngine* pe_;
  CtxStateCb state_cb_ = nullptr;
  UserData user_data_{};
  CtxState state_ = CtxState::kIdle;
};

}  // namespace dpukv
