// What the target's parts below its poll group share: the TCP transport's
// options and figures, a subsystem as Connect finds it, and TargetSide, the
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

struct TcpTransportOptions {
  uint32_t in_capsule_data_size = 8192;
  uint32_t max_io_size = 128 * 1024;  // MDTS (4 KiB pages): 2^5
  uint32_t max_h2c_data = 128 * 1024;
  uint16_t max_queue_depth = 128;
  uint16_t max_io_queues = 8;
  uint32_t keep_alive_grace_ms = 1000;  // beyond the host's KATO before a controller is torn down
  bool c2h_success = true;              // C2HData with SUCCESS instead of a response capsule
  int cpu = -1;                         // pin the poll-group thread
  // A connection that has not sent its ICReq by then is closed: a silent peer holds
  // a socket and a receive buffer, and nothing else ever times it out.
  uint32_t icreq_timeout_ms = 10000;
  // After its ICReq, a connection must send a Fabrics Connect within this: until
  // then it holds a socket and a buffer for nothing.
  uint32_t connect_timeout_ms = 10000;
  // Once a PDU's header has arrived, the rest of it must within this (a host that
  // sends half a capsule and stops is closed, not waited for).
  uint32_t pdu_timeout_ms = 10000;
  // An association whose host asked for no keep alive (KATO 0) ends after this
  // long without a command, as SPDK's discovery controllers do after 2 minutes.
  uint32_t no_kato_timeout_ms = 120000;
  // Connections one listener keeps at once; more are accepted and closed at once.
  // A host opens one per queue (an admin queue and up to max_io_queues).
  uint32_t max_connections_per_listener = 1024;
};

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
