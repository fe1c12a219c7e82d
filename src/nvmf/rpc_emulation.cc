#include "nvmf/rpc_emulation.h"

namespace dpukv::nvme {

using rpc::Json;
using rpc::Params;
using rpc::RpcError;

void register_emulation_methods(AppState& app) {
  app.rpc.add("nvmf_doca_get_managers", [&app](const Json& p, Json* r) {
    Params a(p, {});
    if (!a.ok()) return a.error();
    *r = Json::array(
        {Json{{"name", "vfio-user"},
              {"description", "emulated PCIe NVMe functions served over vfio-user sockets"},
              {"functions", app.vfio_user->num_functions()}}});
    return RpcError{};
  });
  app.rpc.add("nvmf_doca_create_function", [&app](const Json& p, Json* r) {
    Params a(p, {"manager", "nqn", "socket_path", "id"});
    std::string mgr = a.str("manager", "vfio-user");
    std::string nqn = a.str("nqn", "", true);
    std::string path =
        a.str("socket_path", "/var/tmp/dpukv-vfio-user-" +
                                 std::to_string(app.vfio_user->num_functions()) + ".sock");
    std::string want = a.str("id");
    if (a.ok() && mgr != "vfio-user")
      a.fail("manager must be vfio-user (see nvmf_doca_get_managers)");
    if (a.ok() && (path.empty() || path.size() > 100))
      a.fail("socket_path must be 1-100 characters");
    if (!a.ok()) return a.error();
    return app.vfio_user->make_function(nqn, path, want, r);
  });
  app.rpc.add("nvmf_doca_destroy_function", [&app](const Json& p, Json* r) {
    Params a(p, {"id", "manager"});
    std::string id = a.str("id", "", true);
    if (!a.ok()) return a.error();
    if (RpcError e = app.vfio_user->destroy_function(id); !e.ok()) return e;
    *r = true;
    return RpcError{};
  });
  app.rpc.add("nvmf_doca_list_functions", [&app](const Json& p, Json* r) {
    Params a(p, {"manager"});
    if (!a.ok()) return a.error();
    *r = app.vfio_user->list_functions();
    return RpcError{};
  });
}

}  // namespace dpukv::nvme
