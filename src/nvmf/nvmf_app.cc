#include "nvmf/nvmf_app.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "nvmf/rpc_bdev.h"
#include "nvmf/rpc_emulation.h"
#include "nvmf/rpc_subsystem.h"
#include "nvmf/rpc_transport.h"
#include "runtime/log.h"

namespace dpukv::nvme {

using rpc::Json;
using rpc::Params;
using rpc::RpcError;

Status NvmfApp::create(const AppOptions& o, std::unique_ptr<NvmfApp>* out) {
  std::unique_ptr<NvmfApp> a(new NvmfApp());
  a->app_.opts = o;
  a->app_.bdev_limits.max_memory_bytes = o.max_malloc_bytes != 0
                                             ? o.max_malloc_bytes
                                             : static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                                   static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 2;
  TcpTransportOptions to;
  to.cpu = o.cpu;
  if (Status st = NvmfTarget::create(to, &a->app_.target); !st.ok()) return st;
  std::unique_ptr<VfioUserTransport> vfio;
  if (Status st = VfioUserTransport::create(&vfio); !st.ok()) return st;
  auto* vu = static_cast<VfioUserTransport*>(a->app_.target->add_transport(std::move(vfio)));
  a->app_.tcp = std::make_unique<TcpAppTransport>(a->app_.target.get());
  a->app_.vfio_user = std::make_unique<VfioUserAppTransport>(a->app_.target.get(), vu);
  a->app_.transports[0] = a->app_.tcp.get();
  a->app_.transports[1] = a->app_.vfio_user.get();
  a->register_framework_methods();
  register_bdev_methods(a->app_);
  register_transport_methods(a->app_);
  register_subsystem_methods(a->app_);
  register_emulation_methods(a->app_);
  // As SPDK does: the RPC socket opens only once the configuration is applied, so
  // no call sees (or races with) a half-configured target. With --wait-for-rpc the
  // configuration is applied by framework_start_init, on the RPC thread.
  if (!o.wait_for_rpc) {
    RpcError e = a->framework_start_init();
    if (!e.ok()) {
      LOG_ERR("nvmf app: %s", e.message.c_str());
      return Code::kInvalidValue;
    }
  }
  if (Status st = a->app_.rpc.start(o.rpc_socket, o.rpcs_allowed); !st.ok()) return st;
  *out = std::move(a);
  return Code::kSuccess;
}

NvmfApp::~NvmfApp() {
  app_.rpc.stop();
  app_.vfio_user.reset();  // destroys its functions on the poll thread
  app_.tcp.reset();
  app_.target.reset();
}

AppTransport* AppState::find_transport(const std::string& trtype) {
  std::string t = trtype;
  std::transform(t.begin(), t.end(), t.begin(), ::toupper);
  for (AppTransport* tr : transports)
    if (t == tr->trtype()) return tr;
  return nullptr;
}

RpcError NvmfApp::framework_start_init() {
  if (app_.rpc.running()) return RpcError{rpc::kInvalidState, "framework is already initialized"};
  app_.rpc.set_running(true);
  if (!app_.opts.config.empty()) {
    std::string err;
    if (!load_config(app_.opts.config, &err).ok())
      return RpcError{rpc::kInternalError, "config: " + err};
  }
  return {};
}

Status NvmfApp::load_config(const std::string& path, std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = "cannot read " + path;
    return Code::kNotFound;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  Json cfg = Json::parse(ss.str(), nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object() || !cfg.contains("subsystems") ||
      !cfg["subsystems"].is_array()) {
    *error = path + ": not a JSON config with a \"subsystems\" array";
    return Code::kInvalidValue;
  }
  int id = 1;
  for (const Json& s : cfg["subsystems"]) {
    if (!s.is_object() || !s.contains("config")) continue;
    if (!s["config"].is_array()) {
      *error = path + ": \"config\" must be an array";
      return Code::kInvalidValue;
    }
    for (const Json& call : s["config"]) {
      if (!call.is_object() || !call.contains("method")) {
        *error = path + ": every config entry needs a \"method\"";
        return Code::kInvalidValue;
      }
      Json req{{"jsonrpc", "2.0"}, {"id", id++}, {"method", call["method"]}};
      if (call.contains("params")) req["params"] = call["params"];
      Json resp = app_.rpc.dispatch(req);
      if (resp.contains("error")) {
        *error = call["method"].dump() + ": " + resp["error"]["message"].get<std::string>();
        return Code::kInvalidValue;
      }
    }
  }
  return Code::kSuccess;
}

void NvmfApp::register_framework_methods() {
  app_.rpc.add(
      "rpc_get_methods",
      [this](const Json& p, Json* r) {
        Params a(p, {"current", "include_aliases"});
        bool current = a.boolean("current", false);
        if (!a.ok()) return a.error();
        *r = app_.rpc.methods(current);
        return RpcError{};
      },
      true);
  app_.rpc.add(
      "framework_start_init",
      [this](const Json& p, Json* r) {
        Params a(p, {});
        if (!a.ok()) return a.error();
        RpcError e = framework_start_init();
        *r = true;
        return e;
      },
      true);
  app_.rpc.add(
      "framework_wait_init",
      [](const Json&, Json* r) {
        *r = true;
        return RpcError{};
      },
      true);
}

}  // namespace dpukv::nvme
