// Fuzzes the JSON-RPC control plane of `dpukv nvme`: the input is framed the way
// the server frames its socket stream (json_value_end), parsed, and dispatched to
// the real methods of one long-lived application (bdevs, transports,
// subsystems, namespaces, hosts, emulation-manager queries). Methods that create
// files, directories or listening sockets are left out (--rpcs-allowed), and
// malloc bdevs are capped at 64 MiB. Every response must be a well-formed JSON-RPC
// reply; nothing may crash.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "nvmf/nvmf_app.h"
#include "runtime/log.h"

using namespace dpukv;
using namespace dpukv::nvme;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static NvmfApp* app = [] {
    log_set_level(LogSource::kLib, LogLevel::kCritical);
    AppOptions o;
    o.rpc_socket = "/tmp/dpukv-rpc-fuzz-" + std::to_string(getpid()) + ".sock";
    o.max_malloc_bytes = 64u << 20;
    o.rpcs_allowed = {"rpc_get_methods",
                      "framework_start_init",
                      "bdev_malloc_create",
                      "bdev_null_create",
                      "bdev_get_bdevs",
                      "bdev_delete",
                      "nvmf_create_transport",
                      "nvmf_get_transports",
                      "nvmf_create_subsystem",
                      "nvmf_delete_subsystem",
                      "nvmf_get_subsystems",
                      "nvmf_subsystem_add_ns",
                      "nvmf_subsystem_remove_ns",
                      "nvmf_subsystem_add_host",
                      "nvmf_subsystem_remove_host",
                      "nvmf_get_stats",
                      "nvmf_doca_get_managers",
                      "nvmf_doca_list_functions",
                      "nvmf_doca_destroy_function"};
    std::unique_ptr<NvmfApp> a;
    if (!NvmfApp::create(o, &a).ok()) abort();
    return a.release();
  }();
  std::string in(reinterpret_cast<const char*>(data), size);
  for (int n = 0; n < 8 && !in.empty(); ++n) {
    size_t end = rpc::json_value_end(in);
    if (end == 0 || end == std::string::npos) break;
    rpc::Json req = rpc::Json::parse(in.substr(0, end), nullptr, false);
    in.erase(0, end);
    if (req.is_discarded()) continue;
    rpc::Json resp = app->dispatch(req);
    if (resp.is_null()) continue;  // a notification
    if (!resp.is_object() || resp.value("jsonrpc", "") != "2.0" || !resp.contains("id") ||
        (resp.contains("result") == resp.contains("error")))
      abort();
  }
  return 0;
}
