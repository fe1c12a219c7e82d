#include "runtime/progress_engine.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "runtime/context.h"
#include "runtime/log.h"

namespace dpukv {

Status ProgressEngine::create(std::unique_ptr<ProgressEngine>* out) {
  if (out == nullptr) return Code::kInvalidValue;
  std::unique_ptr<ProgressEngine> pe(new ProgressEngine());
  pe->efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (pe->efd_ < 0) return Code::kDriver;
  *out = std::move(pe);
  return Code::kSuccess;
}

ProgressEngine::~ProgressEngine() {
  if (!ctxs_.empty()) LOG_CRIT("progress engine destroyed with %zu contexts", ctxs_.size());
  if (efd_ >= 0) ::close(efd_);
}

bool ProgressEngine::progress() {
  bool did = false;
  // Index loop: a callback may not add contexts, but it may stop one.
  for (size_t i = 0; i < ctxs_.size(); ++i) did |= ctxs_[i]->progress_once();
  return did;
}

Status ProgressEngine::request_notification() {
  bool pending = false;
  for (Context* c : ctxs_) pending |= c->arm_notification();
  if (pending) notify();
  return Code::kSuccess;
}

Status ProgressEngine::clear_notification() {
  uint64_t v;
  ssize_t r = ::read(efd_, &v, sizeof(v));
  (void)r;  // EAGAIN when nothing was signalled
  return Code::kSuccess;
}

void ProgressEngine::notify() {
  const uint64_t one = 1;
  ssize_t r = ::write(efd_, &one, sizeof(one));
  (void)r;  // cannot overflow in practice: the reader clears it
}

void ProgressEngine::connect(Context* ctx) {
  ctxs_.push_back(ctx);
}

void ProgressEngine::disconnect(Context* ctx) {
  ctxs_.erase(std::remove(ctxs_.begin(), ctxs_.end(), ctx), ctxs_.end());
}

}  // namespace dpukv
