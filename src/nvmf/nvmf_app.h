// `dpukv nvme`: the NVMe-oF target application. Block devices, the NVMe/TCP and
// vfio-user transports in one poll group, subsystems, and the vfio-user emulation
// manager, all configured through a JSON-RPC server whose method names and
// framing follow SPDK's (rpc_get_methods, bdev_*, nvmf_*), plus the BlueField
// application's emulation-manager methods (nvmf_doca_*). A JSON config file in
// SPDK's format ({"subsystems": [{"subsystem": ..., "config": [{"method", "params"}]}]})
// is replayed through the same methods at start.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nvmf/app_transport.h"
#include "nvmf/bdev/bdev.h"
#include "nvmf/bdev/bdev_registry.h"
#include "nvmf/nvmf_target.h"
#include "nvmf/vfio_user/emulation_manager.h"
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

class NvmfApp {
 public:
  static Status create(const AppOptions& o, std::unique_ptr<NvmfApp>* out);
  ~NvmfApp();
  NvmfApp(const NvmfApp&) = delete;
  NvmfApp& operator=(const NvmfApp&) = delete;

  // Replays a config file through the RPC methods; the first failing call stops it.
  Status load_config(const std::string& path, std::string* error);
  rpc::JsonRpcServer& rpc() { return rpc_; }
  NvmfTarget& target() { return *target_; }

 private:
  NvmfApp() = default;
  // The methods, one file per area: nvmf_app.cc (framework), rpc_bdev.cc,
  // rpc_transport.cc (transports and listeners), rpc_subsystem.cc, rpc_emulation.cc.
  void register_framework_methods();
  void register_bdev_methods();
  void register_transport_methods();
  void register_subsystem_methods();
  void register_emulation_methods();
  rpc::RpcError framework_start_init();
  AppTransport* find_transport(const std::string& trtype);  // any case; null if unknown

  AppOptions opts_;
  rpc::JsonRpcServer rpc_;
  std::unique_ptr<NvmfTarget> target_;
  std::unique_ptr<EmulationManager> emu_;
  std::map<std::string, std::shared_ptr<Bdev>> bdevs_;  // RPC thread only
  std::map<std::string, uint32_t> bdev_seq_;            // numbering of unnamed bdevs, per kind
  BdevLimits bdev_limits_;
  std::unique_ptr<TcpAppTransport> tcp_;
  std::unique_ptr<VfioUserAppTransport> vfio_user_;
  AppTransport* transports_[2] = {};  // the table every trtype is looked up in
};

}  // namespace dpukv::nvme
