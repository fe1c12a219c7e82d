// What the target's parts below its poll group share: the transport's figures, a
// subsystem as Connect finds it, and TargetSide, the
// interface through which queues (nvmf/tcp) and controllers reach the target that
// owns them (NvmfTarget::Impl, target_internal.h) without its internals.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvmf/core/controller_core.h"
#include "nvmf/core/fabrics_controller.h"

namespace dpukv::nvme {

struct SubsystemConfig {
  std::string nqn;
  std::string serial = "DPUKV00000001";
  std::string model = "dpukv NVMe-oF target";
  bool allow_any_host = true;
  std::vector<std::string> hosts;
  uint16_t max_namespaces = ControllerCore::kMaxNamespaces;
};

struct TargetStats {
  uint64_t connections = 0, active_connections = 0, pdus_in = 0, pdus_out = 0;
  uint64_t commands = 0, errors = 0, term_reqs_sent = 0, connect_rejects = 0,
           keep_alive_expiries = 0;
  // Connections closed for no ICReq in time; refused over a listener's cap; accepts
  // the system refused (EMFILE, ENFILE, ENOBUFS, ENOMEM: the listener pauses).
  uint64_t icreq_timeouts = 0, connections_refused = 0, accept_errors = 0;
  // Connections closed for no Connect after the ICReq, or a PDU left half sent.
  uint64_t connect_timeouts = 0, pdu_timeouts = 0;
};

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

// What the target's queues and controllers need of the target that owns them (the
// poll group, NvmfTarget::Impl): its transport's figures, the subsystem a Connect
// names, the discovery log. They hold this, not the target's internals. A
// transport's own options are given to its queues by the target that made them.
class TargetSide {
 public:
  virtual TargetStats& counters() = 0;
  // What a Connect to nqn reaches: a subsystem, the discovery subsystem, or nothing.
  virtual Subsystem* connect_target(const std::string& nqn) = 0;
  // The discovery log for a host: one entry per listener of each subsystem it may use.
  virtual std::vector<uint8_t> discovery_log(const std::string& hostnqn) const = 0;
  // A queue of c closed and its requests are back: c forgets it, and goes itself
  // with its last queue.
  virtual void release_queue(FabricsController* c, uint16_t qid) = 0;

 protected:
  ~TargetSide() = default;
};

}  // namespace dpukv::nvme
