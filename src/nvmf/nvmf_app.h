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

#include "nvmf/app_state.h"

namespace dpukv::nvme {

class NvmfApp {
 public:
  static Status create(const AppOptions& o, std::unique_ptr<NvmfApp>* out);
  ~NvmfApp();
  NvmfApp(const NvmfApp&) = delete;
  NvmfApp& operator=(const NvmfApp&) = delete;

  // Replays a config file through the RPC methods; the first failing call stops it.
  Status load_config(const std::string& path, std::string* error);
  // Handles one JSON-RPC request object as the socket would (tests, the fuzzer).
  rpc::Json dispatch(const rpc::Json& request) { return app_.rpc.dispatch(request); }

 private:
  NvmfApp() = default;
  void register_framework_methods();
  rpc::RpcError framework_start_init();

  AppState app_;  // what the methods act on (nvmf/app_state.h)
};

}  // namespace dpukv::nvme
