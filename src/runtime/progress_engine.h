// Progress engine (doca_pe): the one thread that owns a set of contexts drives
// them by calling progress(). Completion and state-change callbacks run inline,
// inside progress(), on that thread.
//
// Sleeping instead of spinning, the doca_pe notification protocol:
//   if (!pe.progress()) {               // nothing to do right now
//     pe.request_notification();      // arm every context
//     epoll_wait/poll on pe.notification_handle();
//     pe.clear_notification();        // disarm; then progress() again
//   }
// Arming re-checks the contexts' queues and signals the handle at once if work is
// already there, so a completion that lands between the last progress() and the
// arm still wakes the sleeper. Do not call progress() between arm and wait: a
// peer that sees us awake will not ring our doorbell.
//
// Contexts driven by file descriptors (sockets, timers, doorbell eventfds) register
// them with watch_fd(); notification_handle() is an epoll fd over all of them plus
// the engine's own eventfd, so one epoll_wait sleeps on every source. progress()
// asks the kernel for ready fds only while some are watched: an engine with only
// DMA contexts makes no syscall per call.
//
// Thread safety: everything except notify() belongs to the owning thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/status.h"

namespace dpukv {

class Context;

// Receives readiness of a watched fd inside progress(). A watcher must stay alive
// until unwatch_fd() returns; events already fetched for it in the same progress()
// call are dropped when it is unwatched. Fds are level-triggered and a ready fd
// counts as work: by the end of the pass its fd must be drained (by the watcher or
// by its context's poll()) or stay ready only while there is work. An fd that
// stays ready with nothing to do keeps the engine from ever sleeping (UCX's event
// fd did that until UcxNode re-armed it in its watcher).
class FdWatcher {
 public:
  virtual void on_fd_ready(uint32_t epoll_events) = 0;

 protected:
  ~FdWatcher() = default;
};

class ProgressEngine {
 public:
  static Status create(std::unique_ptr<ProgressEngine>* out);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Runs pending completions of every connected context. True if anything happened.
  bool progress();

  // An epoll fd, readable when an armed context has work or a watched fd is ready.
  // Stays valid for the engine's lifetime; never close it.
  int notification_handle() const { return epfd_; }
  Status request_notification();
  Status clear_notification();

  // Called by contexts (engine threads included) to wake an armed sleeper.
  void notify();

  // Adaptive spin-then-sleep: calls progress() until it does work, spinning for up
  // to spin_ns of idleness, then sleeps in epoll for up to timeout_ms (-1: forever).
  // A busy owner never makes a syscall per event; an idle one does not burn a core.
  // Returns true if progress() did work.
  bool wait(uint64_t spin_ns, int timeout_ms);

  size_t num_contexts() const { return ctxs_.size(); }

  // Level-triggered epoll registration (EPOLLIN/EPOLLOUT...).
  Status watch_fd(int fd, uint32_t events, FdWatcher* w);
  Status modify_fd(int fd, uint32_t events, FdWatcher* w);
  void unwatch_fd(int fd, FdWatcher* w);

 private:
  friend class Context;
  ProgressEngine() = default;
  void connect(Context* ctx);
  void disconnect(Context* ctx);
  bool poll_fds();
  std::vector<Context*> ctxs_;  // changed only at context creation/destruction
  int efd_ = -1;
  int epfd_ = -1;
  size_t num_watched_ = 0;
  // Watchers unwatched during the current dispatch loop; their pending events are skipped.
  std::vector<FdWatcher*> dead_;
  bool dispatching_ = false;
};

}  // namespace dpukv
