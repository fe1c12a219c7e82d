// An NVMe over Fabrics target: subsystems (NQN, serial, namespaces from block
// devices, allowed hosts, listeners) served over the NVMe/TCP transport, the way
// SPDK's nvmf target serves them (and, on a BlueField, hosts the DOCA transport).
//
// One poll group (core/poll_group.h) runs the target: its controllers and every
// transport (TCP, made with the target; others added, such as vfio-user), each a
// poller of the group among equals. Configuration calls from other threads (the
// RPC server, the command line) run on its thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nvmf/bdev/bdev.h"
#include "nvmf/core/controller_core.h"
#include "nvmf/core/target_side.h"
#include "nvmf/core/transport.h"
#include "nvmf/tcp/tcp_transport_options.h"

namespace dpukv::nvme {

struct SubsystemInfo {
  std::string nqn, serial, model;
  bool allow_any_host;
  std::vector<std::string> hosts;
  std::vector<std::string> listeners;                        // "tcp:ADDR:PORT"
  std::vector<std::pair<uint32_t, std::string>> namespaces;  // nsid, bdev name
  uint32_t controllers;
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

  // Adds a transport to the poll group (vfio-user: nvmf/vfio_user/vfio_user_transport.h),
  // so that every transport shares one thread and one view of each namespace.
  // The target owns it until it stops; the pointer stays valid till then.
  Transport* add_transport(std::unique_ptr<Transport> t);
  // Runs fn on the poll thread (for calls into an added transport).
  Status run_on_poller(std::function<Status()> fn) { return call(std::move(fn)); }

  struct Impl;  // defined in target_internal.h

 private:
  NvmfTarget() = default;
  Status call(std::function<Status()> fn);
  TcpTransportOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dpukv::nvme
