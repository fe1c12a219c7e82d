// JSON-RPC methods of the emulation manager, named as the BlueField NVMe
// application names them (nvmf_doca_*): managers, and functions created,
// destroyed and listed.
#include "nvmf/nvmf_app.h"

namespace dpukv::nvme {

using rpc::Json;
using rpc::Params;
using rpc::RpcError;

void NvmfApp::register_emulation_methods() {
  rpc_.add("nvmf_doca_get_managers", [this](const Json& p, Json* r) {
    Params a(p, {});
    if (!a.ok()) return a.error();
    *r = Json::array(
        {Json{{"name", "vfio-user"},
              {"description", "emulated PCIe NVMe functions served over vfio-user sockets"},
              {"functions", vfio_user_->num_functions()}}});
    return RpcError{};
  });
  rpc_.add("nvmf_doca_create_function", [this](const Json& p, Json* r) {
    Params a(p, {"manager", "nqn", "socket_path", "id"});
    std::string mgr = a.str("manager", "vfio-user");
    std::string nqn = a.str("nqn", "", true);
    std::string path =
        a.str("socket_path",
              "/var/tmp/dpukv-vfio-user-" + std::to_string(vfio_user_->num_functions()) + ".sock");
    std::string want = a.str("id");
    if (a.ok() && mgr != "vfio-user")
      a.fail("manager must be vfio-user (see nvmf_doca_get_managers)");
    if (a.ok() && (path.empty() || path.size() > 100))
      a.fail("socket_path must be 1-100 characters");
    if (!a.ok()) return a.error();
    return vfio_user_->make_function(nqn, path, want, r);
  });
  rpc_.add("nvmf_doca_destroy_function", [this](const Json& p, Json* r) {
    Params a(p, {"id", "manager"});
    std::string id = a.str("id", "", true);
    if (!a.ok()) return a.error();
    if (RpcError e = vfio_user_->destroy_function(id); !e.ok()) return e;
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_doca_list_functions", [this](const Json& p, Json* r) {
    Params a(p, {"manager"});
    if (!a.ok()) return a.error();
    *r = vfio_user_->list_functions();
    return RpcError{};
  });
}

}  // namespace dpukv::nvme
