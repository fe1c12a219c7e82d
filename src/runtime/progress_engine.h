// Progress engine (doca_pe): the one thread that owns a set of contexts drives
// them by calling progress(). Completion and state-change callbacks run inline,
// inside progress(), on that thread.
//
// Sleeping instead of spinning, the doca_pe notification protocol:
//   pe.request_notification();      // arm every context
//   if (!pe.progress()) epoll/poll on pe.notification_handle();
//   pe.clear_notification();
// Arming re-checks the contexts' completion queues, so a completion that lands
// between the last progress() and the arm still wakes the sleeper.
//
// Thread safety: everything except notification_handle() belongs to the owning thread.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/status.h"

namespace dpukv {

class Context;

class ProgressEngine {
 public:
  static Status create(std::unique_ptr<ProgressEngine>* out);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Runs pending completions of every connected context. True if anything happened.
  bool progress();

  // An eventfd, readable when an armed context has work. Stays valid for the
  // engine's lifetime; never close it.
  int notification_handle() const { return efd_; }
  Status request_notification();
  Status clear_notification();

  // Called by contexts (engine threads included) to wake an armed sleeper.
  void notify();

  size_t num_contexts() const { return ctxs_.size(); }

 private:
  friend class Context;
  ProgressEngine() = default;
  void connect(Context* ctx);
  void disconnect(Context* ctx);
  std::vector<Context*> ctxs_;  // changed only at context creation/destruction
  int efd_ = -1;
};

}  // namespace dpukv
