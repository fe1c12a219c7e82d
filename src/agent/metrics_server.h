// The /metrics endpoint: a small HTTP/1.0 server on the agent's progress engine
// that never blocks it. Every socket is non-blocking; each connection has a
// bounded request buffer (4 KiB), a deadline (2 s from accept, then it is closed).
// At most 256 are open at once and 8 per peer address; at either limit the
// oldest connection still sending its request makes room for the new one, so
// slow or silent connections cannot lock a scraper out. At the descriptor limit
// the listener rests for 100 ms instead of spinning.
// The body is made by the owner's callback on the engine's thread, so it reads
// the agent's counters without locks.
//
// Threading: one progress engine; every call on its thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/progress_engine.h"
#include "runtime/status.h"

namespace dpukv {

class MetricsServer {
 public:
  struct Counters {
    uint64_t served = 0, not_found = 0, refused_busy = 0, timed_out = 0, bad_requests = 0;
    uint64_t evicted = 0;  // slow connections closed to make room for a new one
  };
  static constexpr size_t kMaxConnections = 256;
  static constexpr size_t kMaxPerPeer = 8;
  static constexpr size_t kMaxRequest = 4096;
  static constexpr uint64_t kTimeoutNs = 2000000000ull;

  // Listens on address:port (port 0: any free port; see port()). The error is
  // logged with its cause (address in use, bad address, ...).
  static Status create(ProgressEngine* pe, const std::string& address, int port,
                       std::function<std::string()> body, std::unique_ptr<MetricsServer>* out);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // Closes connections past their deadline; call now and then (the agent's tick).
  void sweep();
  const Counters& counters() const { return counters_; }

 private:
  struct Conn;
  struct Listener final : FdWatcher {
    MetricsServer* owner = nullptr;
    void on_fd_ready(uint32_t) override { owner->accept_all(); }
  };
  MetricsServer() = default;
  void accept_all();
  void on_conn(Conn* c, uint32_t events);
  void respond(Conn* c);
  void close_conn(Conn* c);
  // Room for a connection from peer: false if none can be made.
  bool make_room(uint32_t peer);

  ProgressEngine* pe_ = nullptr;
  int listen_fd_ = -1;
  int port_ = 0;
  Listener listener_;
  std::function<std::string()> body_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<std::unique_ptr<Conn>> closed_;  // freed at the next sweep, not in their callback
  Counters counters_;
  uint64_t paused_until_ns_ = 0;  // the listener is not watched until then (out of descriptors)
};

}  // namespace dpukv
