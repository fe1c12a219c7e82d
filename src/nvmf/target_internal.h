// The target's poll group (NvmfTarget::Impl): its subsystems, listeners and every
// TCP connection. Internal to src/nvmf; users include nvmf_target.h. What the
// parts below it share (Subsystem, TargetSide) is in core/target_side.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nvme/tcp_wire.h"
#include "nvmf/core/poll_watcher.h"
#include "nvmf/core/target_side.h"
#include "nvmf/nvmf_target.h"
#include "runtime/call_queue.h"
#include "runtime/clock.h"

namespace dpukv::nvme {

class TcpConnection;

struct Listener final : PollWatcher {
  Listener() : PollWatcher(Kind::kListener) {}
  std::string key;  // "tcp:ADDR:PORT"
  int fd = -1;
  uint16_t port = 0;
  uint32_t connections = 0;      // open connections it accepted
  uint64_t paused_until_ms = 0;  // out of descriptors: not watched until then (0: watched)
};

struct NvmfTarget::Impl final : TargetSide {
  TcpTransportOptions opts;
  int epfd = -1, wake_fd = -1;
  struct WakeWatcher final : PollWatcher {
    WakeWatcher() : PollWatcher(Kind::kWake) {}
  } wake_watcher;
  std::thread thread;
  std::atomic<bool> stop{false};
  CallQueue calls;

  std::map<std::string, std::unique_ptr<Subsystem>> subsystems;
  std::vector<std::unique_ptr<Listener>> listeners;
  std::vector<std::unique_ptr<TcpConnection>> conns;
  TargetStats stats;
  EmulationManager* emu = nullptr;

  void run();
  void accept_on(Listener* l);
  // Every 100 ms: connections past their ICReq deadline closed, paused listeners
  // watched again.
  void check_deadlines(uint64_t now_ms);
  Listener* listener_of(const TcpConnection& c);
  void close_controller(FabricsController* c, const char* why);
  void reap_closed();
  Subsystem* find_subsystem(const std::string& nqn) {
    auto it = subsystems.find(nqn);
    return it == subsystems.end() ? nullptr : it->second.get();
  }

  // The discovery subsystem (nqn.2014-08.org.nvmexpress.discovery): not one of
  // `subsystems` (it is not configured, listed or deleted as they are), but a
  // host connects to it on any listener and reads the discovery log.
  Subsystem discovery = make_discovery();
  uint64_t discovery_genctr = 0;  // GENCTR: bumped by every change the log shows
  static Subsystem make_discovery();
  Subsystem* connect_target(const std::string& nqn) override {
    return nqn == kDiscoveryNqn ? &discovery : find_subsystem(nqn);
  }
  TargetStats& counters() override { return stats; }
  template <class F>
  void each_subsystem(F f) {
    f(discovery);
    for (auto& s : subsystems) f(*s.second);
  }
  // Subsystems or listeners changed: a new GENCTR, and a notice to hosts that asked.
  void discovery_changed();
  std::vector<uint8_t> discovery_log(const std::string& hostnqn) const override;
};

}  // namespace dpukv::nvme
