// What the NVMe-oF application's JSON-RPC methods act on, shared by the method
// groups (rpc_bdev, rpc_transport, rpc_subsystem, rpc_emulation, each registering
// its methods on `rpc`) and owned by NvmfApp: the target (which owns its
// transports, vfio-user's emulation manager among them), the block devices, and the table every
// trtype is looked up in. Every method runs on the RPC thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nvmf/app_transport.h"
#include "nvmf/bdev/bdev.h"
#include "nvmf/bdev/bdev_registry.h"
#include "nvmf/nvmf_target.h"
#include "rpc/jsonrpc_server.h"

namespace dpukv::nvme {

struct AppOptions {
  std::string rpc_socket = "/var/tmp/dpukv-nvme.sock";
  std::string config;                     // SPDK-style JSON config, replayed at start
  bool wait_for_rpc = false;              // serve only startup methods until framework_start_init
  std::vector<std::string> rpcs_allowed;  // empty: every method
  int cpu = -1;                           // pin the poll group
  uint64_t max_malloc_bytes = 0;          // per malloc bdev; 0: half the physical memory
};

struct AppState {
  AppOptions opts;
  rpc::JsonRpcServer rpc;
  std::unique_ptr<NvmfTarget> target;
  std::map<std::string, std::shared_ptr<Bdev>> bdevs;  // RPC thread only
  std::map<std::string, uint32_t> bdev_seq;            // numbering of unnamed bdevs, per kind
  BdevLimits bdev_limits;
  std::unique_ptr<TcpAppTransport> tcp;
  std::unique_ptr<VfioUserAppTransport> vfio_user;
  AppTransport* transports[2] = {};  // the table every trtype is looked up in

  AppTransport* find_transport(const std::string& trtype);  // any case; null if unknown
};

}  // namespace dpukv::nvme
