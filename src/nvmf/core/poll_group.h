// A poll group: one thread that owns an epoll set and a list of pollers (the
// target's controllers, each transport), as SPDK's nvmf poll group polls each
// transport's group in turn. It busy-polls while there is work and sleeps in
// epoll_wait after 2 ms idle; configuration from other threads runs on it through
// call(). It knows no transport: a watched fd is a PollWatcher that handles its own
// events, a poller says how much work its pass did.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/call_queue.h"
#include "runtime/status.h"

namespace dpukv::nvme {

// What an fd in the epoll set stands for: the object that handles its readiness
// (a listening socket accepts, a queue pair's socket reads its PDUs). No bare
// pointer to guess at, no search per event.
//
// A handler function, not a virtual method: UBSan's vptr check, on the first call
// of a (type, vtable) pair, opens a pipe to probe the vtable (sanitizer_common's
// IsAccessibleMemoryRange) and reports "invalid vptr" when that fails, which it
// does when the process is out of descriptors: when a listener must keep going
// (NvmfTest.OutOfDescriptorsTheTargetDoesNotSpinAndRecovers). A handler casts to
// its own final class, as the target's code did before this group.
class PollWatcher {
 public:
  // The fd is ready (epoll's events). Returns the work done.
  using Handler = int (*)(PollWatcher* self, uint32_t events);
  explicit PollWatcher(Handler h) : handler_(h) {}
  int on_event(uint32_t events) { return handler_(this, events); }

 protected:
  ~PollWatcher() = default;  // owned as what it is, never deleted as a watcher

 private:
  Handler handler_;
};

// A participant in each pass of the loop.
class Poller {
 public:
  // One pass: completions reaped, output sent, closed queues reaped. Returns the
  // work done (0 lets the group fall asleep).
  virtual int poll() = 0;
  // Every 100 ms: deadlines (keep alive, a stalled host).
  virtual void tick(uint64_t now_ms) = 0;

 protected:
  ~Poller() = default;
};

class PollGroup {
 public:
  PollGroup();   // makes the epoll set (start() says if that failed)
  ~PollGroup();  // stops, then closes the set
  PollGroup(const PollGroup&) = delete;
  PollGroup& operator=(const PollGroup&) = delete;

  // Starts the thread (pinned to cpu unless -1). Pollers and watchers may be
  // added before, or on the thread after.
  Status start(int cpu);
  // Ends the loop and joins the thread; the set stays open for the owner's
  // teardown (close() of a queue takes its fd out of it).
  void stop();
  bool on_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Runs fn on the poll thread and returns its result (from another thread).
  // Before start() and after stop() no poll thread runs, and the caller runs fn
  // itself (the owner's set-up and teardown) instead of waiting forever.
  Status call(std::function<Status()> fn) {
    if (!thread_.joinable()) return fn();
    return calls_.call(std::move(fn));
  }

  // The epoll set (a queue pair takes its own fd out of it when it closes).
  int epoll_fd() const { return epfd_; }
  // Watches fd for events (EPOLLIN, or 0 to keep it in the set unwatched).
  bool watch(int fd, uint32_t events, PollWatcher* w);
  bool rewatch(int fd, uint32_t events, PollWatcher* w);
  void unwatch(int fd);

  // Pollers run in the order added. Poll thread (or before start).
  void add_poller(Poller* p) { pollers_.push_back(p); }
  void remove_poller(Poller* p);

 private:
  struct Wake final : PollWatcher {
    Wake() : PollWatcher(&drain) {}
    static int drain(PollWatcher* self, uint32_t);
    int fd = -1;
  };
  void run(int cpu);

  int epfd_ = -1;
  Wake wake_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  CallQueue calls_;
  std::vector<Poller*> pollers_;
};

}  // namespace dpukv::nvme
