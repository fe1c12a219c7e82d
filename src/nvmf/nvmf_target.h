// An NVMe over Fabrics target: subsystems (NQN, serial, namespaces from block
// devices, allowed hosts, listeners) served over the NVMe/TCP transport, the way
// SPDK's nvmf target serves them (and, on a BlueField, hosts the DOCA transport).
//
// One poll-group thread owns every connection: it busy-polls an epoll set while
// there is work (one recv and at most one send per connection per pass, however
// many PDUs they carry) and sleeps in epoll_wait after 2 ms idle. Configuration
// calls from other threads (the RPC server, the command line) run on that thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nvmf/bdev/bdev.h"
#include "nvmf/controller_core.h"
#include "nvmf/vfio_user/emulation_manager.h"

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

struct SubsystemInfo {
  std::string nqn, serial, model;
  bool allow_any_host;
  std::vector<std::string> hosts;
  std::vector<std::string> listeners;                        // "tcp:ADDR:PORT"
  std::vector<std::pair<uint32_t, std::string>> namespaces;  // nsid, bdev name
  uint32_t controllers;
};

struct TargetStats {
  uint64_t connections = 0, active_connections = 0, pdus_in = 0, pdus_out = 0;
  uint64_t commands = 0, errors = 0, term_reqs_sent = 0, connect_rejects = 0,
           keep_alive_expiries = 0;
  // Connections closed for no ICReq in time; refused over a listener's cap; accepts
  // the system refused (EMFILE, ENFILE, ENOBUFS, ENOMEM: the listener pauses).
  uint64_t icreq_timeouts = 0, connections_refused = 0, accept_errors = 0;
};

class NvmfTarget {
 public:
  static Status create(const TcpTransportOptions& o, std::unique_ptr<NvmfTarget>* out);
  ~NvmfTarget();
  NvmfTarget(const NvmfTarget&) = delete;
  NvmfTarget& operator=(const NvmfTarget&) = delete;

  // Transport options can change until the first TCP listener exists.
  Status set_tcp_options(const TcpTransportOptions& o);
  Status create_subsystem(const SubsystemConfig& c);
  Status delete_subsystem(const std::string& nqn);  // disconnects its hosts
  Status add_host(const std::string& nqn, const std::string& hostnqn);
  Status remove_host(const std::string& nqn, const std::string& hostnqn);
  Status add_namespace(const std::string& nqn, std::shared_ptr<Bdev> bdev, uint32_t nsid_hint,
                       uint32_t* nsid);
  Status remove_namespace(const std::string& nqn, uint32_t nsid);
  // Listens on addr:port (created on first use) and lets the subsystem accept there.
  Status add_listener(const std::string& nqn, const std::string& addr, uint16_t port,
                      uint16_t* bound_port = nullptr);
  Status remove_listener(const std::string& nqn, const std::string& addr, uint16_t port);

  std::vector<SubsystemInfo> subsystems();
  TargetStats stats();
  const TcpTransportOptions& options() const { return opts_; }
  // True if any subsystem uses the block device (bdev_delete refuses then).
  bool uses_bdev(const Bdev* b);
  // The subsystem's namespace set (for a vfio-user function of the subsystem); use
  // it on the poll thread only.
  std::shared_ptr<NamespaceSet> namespace_set(const std::string& nqn);

  // Polls a vfio-user emulation manager (created with own_thread = false) in this
  // target's poll group, so that both transports share one thread and one view of
  // every namespace.
  void attach_emulation(EmulationManager* m);
  // Runs fn on the poll thread (for calls into an attached emulation manager).
  Status run_on_poller(std::function<Status()> fn) { return call(std::move(fn)); }

  struct Impl;  // defined in target_internal.h

 private:
  NvmfTarget() = default;
  Status call(std::function<Status()> fn);
  TcpTransportOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpukv::nvme
