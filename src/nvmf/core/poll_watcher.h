// What an fd in a poll group's epoll set stands for. Every fd the target watches
// has its epoll data pointing at one of these, and the loop dispatches on kind:
// no guessing what a bare pointer is, no search of the listeners per event.
#pragma once

#include <cstdint>

namespace dpukv::nvme {

struct PollWatcher {
  enum class Kind : uint8_t {
    kWake,        // the poll group's eventfd: calls queued from other threads
    kListener,    // a listening socket: accept (nvmf/target_internal.h's Listener)
    kConnection,  // a queue pair's socket (nvmf/tcp/tcp_connection.h)
  };
  explicit PollWatcher(Kind k) : kind(k) {}
  const Kind kind;

 protected:
  ~PollWatcher() = default;  // owned as what it is, never deleted as a watcher
};

}  // namespace dpukv::nvme
