// The target (NvmfTarget::Impl): its subsystems, the discovery subsystem, and the
// poll group its transports and controllers run in. Internal to src/nvmf; users
// include nvmf_target.h. What the parts below it share (Subsystem, TargetSide) is
// in core/target_side.h; the group itself knows no transport (core/poll_group.h).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nvmf/core/poll_group.h"
#include "nvmf/core/target_side.h"
#include "nvmf/core/transport.h"
#include "nvmf/nvmf_target.h"
#include "nvmf/tcp/tcp_transport.h"

namespace dpukv::nvme {

struct NvmfTarget::Impl final : TargetSide, Poller {
  PollGroup group;  // first: its epoll set outlives every queue that is in it

  std::map<std::string, std::unique_ptr<Subsystem>> subsystems;
  TargetStats stats;
  // Every transport of the group, TCP first; the target listens through `tcp`.
  std::vector<std::unique_ptr<Transport>> transports;
  TcpTransport* tcp = nullptr;

  // The poller of the controllers: their block devices' completions each pass,
  // keep alive every 100 ms. Transports poll their own queues.
  int poll() override;
  void tick(uint64_t now_ms) override;

  Subsystem* find_subsystem(const std::string& nqn) {
    auto it = subsystems.find(nqn);
    return it == subsystems.end() ? nullptr : it->second.get();
  }
  // Runs every transport's pass until the subsystem's controllers are gone.
  void reap_controllers_of(Subsystem* s);

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
  void release_queue(FabricsController* c, uint16_t qid) override;
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
