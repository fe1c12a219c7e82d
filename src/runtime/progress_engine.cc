#include "runtime/progress_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <ctime>

#include "runtime/context.h"
#include "runtime/log.h"

namespace dpukv {

Status ProgressEngine::create(std::unique_ptr<ProgressEngine>* out) {
  if (out == nullptr) return Code::kInvalidValue;
  std::unique_ptr<ProgressEngine> pe(new ProgressEngine());
  pe->efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  pe->epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (pe->efd_ < 0 || pe->epfd_ < 0) return Code::kDriver;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the engine's own eventfd
  if (epoll_ctl(pe->epfd_, EPOLL_CTL_ADD, pe->efd_, &ev) != 0) return Code::kDriver;
  *out = std::move(pe);
  return Code::kSuccess;
}

ProgressEngine::~ProgressEngine() {
  if (!ctxs_.empty()) LOG_CRIT("progress engine destroyed with %zu contexts", ctxs_.size());
  if (efd_ >= 0) ::close(efd_);
  if (epfd_ >= 0) ::close(epfd_);
}

bool ProgressEngine::poll_fds() {
  if (num_watched_ == 0) return false;
  epoll_event evs[64];
  int n = epoll_wait(epfd_, evs, 64, 0);
  if (n <= 0) return false;
  bool did = false;
  dispatching_ = true;
  for (int i = 0; i < n; ++i) {
    auto* w = static_cast<FdWatcher*>(evs[i].data.ptr);
    if (w == nullptr) continue;  // our eventfd: cleared by clear_notification()
    if (!dead_.empty() && std::find(dead_.begin(), dead_.end(), w) != dead_.end()) continue;
    w->on_fd_ready(evs[i].events);
    did = true;
  }
  dispatching_ = false;
  dead_.clear();
  return did;
}

Status ProgressEngine::watch_fd(int fd, uint32_t events, FdWatcher* w) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = w;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return Code::kDriver;
  ++num_watched_;
  return Code::kSuccess;
}

Status ProgressEngine::modify_fd(int fd, uint32_t events, FdWatcher* w) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = w;
  return epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) == 0 ? Status() : Status(Code::kDriver);
}

void ProgressEngine::unwatch_fd(int fd, FdWatcher* w) {
  if (epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr) == 0) --num_watched_;
  if (dispatching_) dead_.push_back(w);
}

bool ProgressEngine::progress() {
  bool did = poll_fds();
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
  for (Context* c : ctxs_) c->disarm_notification();
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

bool ProgressEngine::wait(uint64_t spin_ns, int timeout_ms) {
  if (progress()) return true;
  timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (uint32_t i = 0;; ++i) {
    if (progress()) return true;
    if ((i & 63) == 63) {
      timespec t1;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      uint64_t ns = static_cast<uint64_t>(t1.tv_sec - t0.tv_sec) * 1000000000ull +
                    static_cast<uint64_t>(t1.tv_nsec) - static_cast<uint64_t>(t0.tv_nsec);
      if (ns >= spin_ns) break;
    }
  }
  (void)request_notification();
  epoll_event ev;
  (void)epoll_wait(epfd_, &ev, 1, timeout_ms);
  (void)clear_notification();
  return progress();
}

void ProgressEngine::connect(Context* ctx) {
  ctxs_.push_back(ctx);
}

void ProgressEngine::disconnect(Context* ctx) {
  ctxs_.erase(std::remove(ctxs_.begin(), ctxs_.end(), ctx), ctxs_.end());
}

}  // namespace dpukv
