#include "runtime/context.h"

#include "runtime/log.h"

namespace dpukv {

const char* ctx_state_name(CtxState s) {
  switch (s) {
    case CtxState::kIdle:
      return "IDLE";
    case CtxState::kStarting:
      return "STARTING";
    case CtxState::kRunning:
      return "RUNNING";
    case CtxState::kStopping:
      return "STOPPING";
  }
  return "?";
}

Context::Context(ProgressEngine* pe) : pe_(pe) {
  pe_->connect(this);
}

Context::~Context() {
  if (state_ != CtxState::kIdle)
    LOG_CRIT("context destroyed in state %s; stop it and free its tasks first",
             ctx_state_name(state_));
  pe_->disconnect(this);
}

Status Context::set_state_changed_cb(CtxStateCb cb) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  state_cb_ = cb;
  return Code::kSuccess;
}

Status Context::set_user_data(UserData ud) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  user_data_ = ud;
  return Code::kSuccess;
}

void Context::set_state(CtxState next) {
  CtxState prev = state_;
  if (prev == next) return;
  state_ = next;
  LOG_DBG("context %p: %s -> %s", static_cast<void*>(this), ctx_state_name(prev),
          ctx_state_name(next));
  if (state_cb_ != nullptr) state_cb_(user_data_, this, prev, next);
}

Status Context::start() {
  DPUKV_RETURN_IF_ERROR(require_idle());
  set_state(CtxState::kStarting);
  Status st = do_start();
  if (st.ok()) {
    set_state(CtxState::kRunning);
    return Code::kSuccess;
  }
  if (st == Code::kInProgress) return st;
  set_state(CtxState::kIdle);
  return st;
}

Status Context::stop() {
  if (state_ != CtxState::kRunning && state_ != CtxState::kStarting) return Code::kBadState;
  set_state(CtxState::kStopping);
  do_stop();
  if (drained()) {
    set_state(CtxState::kIdle);
    return Code::kSuccess;
  }
  return Code::kInProgress;
}

bool Context::progress_once() {
  if (state_ == CtxState::kIdle) return false;
  size_t n = poll();
  if (state_ == CtxState::kStopping && drained()) {
    set_state(CtxState::kIdle);
    return true;
  }
  return n != 0;
}

}  // namespace dpukv
