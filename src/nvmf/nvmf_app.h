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

#include "nvmf/bdev/bdev.h"
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
  void register_methods();
  rpc::RpcError add_bdev(const std::string& name, std::unique_ptr<Bdev> b, Status st,
                         rpc::Json* result);
  rpc::RpcError framework_start_init();
  rpc::RpcError make_function(const std::string& nqn, const std::string& path,
                              const std::string& want, rpc::Json* out);

  AppOptions opts_;
  rpc::JsonRpcServer rpc_;
  std::unique_ptr<NvmfTarget> target_;
  std::unique_ptr<EmulationManager> emu_;
  std::map<std::string, std::shared_ptr<Bdev>> bdevs_;  // RPC thread only
  bool tcp_transport_ = false, vfiouser_transport_ = false;
  uint32_t malloc_seq_ = 0;
  uint64_t max_malloc_bytes_ = 0;
  struct Function {
    std::string id, nqn, socket_path;
  };
  std::vector<Function> functions_;  // vfio-user functions: emulated PCIe endpoints
};

}  // namespace dpukv::nvme
