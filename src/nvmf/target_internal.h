// What the target's parts share: subsystems, listeners, the controllers hosts
// create with Connect, and the poll group (NvmfTarget::Impl) that owns them and
// every TCP connection. Internal to src/nvmf; users include nvmf_target.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nvme/tcp_wire.h"
#include "nvmf/fabrics_controller.h"
#include "nvmf/nvmf_target.h"
#include "runtime/call_queue.h"
#include "runtime/clock.h"

namespace dpukv::nvme {

struct Subsystem;
class TcpConnection;

struct Subsystem {
  SubsystemConfig cfg;
  bool discovery = false;  // the discovery subsystem: reached through every listener
  std::shared_ptr<NamespaceSet> ns = std::make_shared<NamespaceSet>();
  std::vector<std::string> listeners;
  uint16_t next_cntlid = 1;
  std::vector<std::unique_ptr<FabricsController>> controllers;
  bool host_allowed(const std::string& h) const {
    return cfg.allow_any_host ||
           std::find(cfg.hosts.begin(), cfg.hosts.end(), h) != cfg.hosts.end();
  }
};

struct Listener {
  std::string key;  // "tcp:ADDR:PORT"
  int fd = -1;
  uint16_t port = 0;
  uint32_t connections = 0;      // open connections it accepted
  uint64_t paused_until_ms = 0;  // out of descriptors: not watched until then (0: watched)
};

// What the target's queues and controllers need of the target that owns them (the
// poll group, NvmfTarget::Impl): its transport's options and figures, the subsystem
// a Connect names, the discovery log. They hold this, not the target's internals.
class TargetSide {
 public:
  virtual const TcpTransportOptions& transport_options() const = 0;
  virtual TargetStats& counters() = 0;
  // What a Connect to nqn reaches: a subsystem, the discovery subsystem, or nothing.
  virtual Subsystem* connect_target(const std::string& nqn) = 0;
  // The discovery log for a host: one entry per listener of each subsystem it may use.
  virtual std::vector<uint8_t> discovery_log(const std::string& hostnqn) const = 0;

 protected:
  ~TargetSide() = default;
};

}  // namespace dpukv::nvme

namespace dpukv::nvme {

struct NvmfTarget::Impl final : TargetSide {
  TcpTransportOptions opts;
  int epfd = -1, wake_fd = -1;
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
    return nqn == tcp::kDiscoveryNqn ? &discovery : find_subsystem(nqn);
  }
  const TcpTransportOptions& transport_options() const override { return opts; }
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
