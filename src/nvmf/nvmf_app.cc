#include "nvmf/nvmf_app.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "runtime/log.h"

namespace dpukv::nvme {

using rpc::Json;
using rpc::Params;
using rpc::RpcError;

Status NvmfApp::create(const AppOptions& o, std::unique_ptr<NvmfApp>* out) {
  std::unique_ptr<NvmfApp> a(new NvmfApp());
  a->opts_ = o;
  a->bdev_limits_.max_memory_bytes = o.max_malloc_bytes != 0
                                         ? o.max_malloc_bytes
                                         : static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                               static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 2;
  TcpTransportOptions to;
  to.cpu = o.cpu;
  if (Status st = NvmfTarget::create(to, &a->target_); !st.ok()) return st;
  ManagerOptions mo;
  mo.own_thread = false;  // polled in the target's poll group
  if (Status st = EmulationManager::create(mo, &a->emu_); !st.ok()) return st;
  a->target_->attach_emulation(a->emu_.get());
  a->tcp_ = std::make_unique<TcpAppTransport>(a->target_.get());
  a->vfio_user_ = std::make_unique<VfioUserAppTransport>(a->target_.get(), a->emu_.get());
  a->transports_[0] = a->tcp_.get();
  a->transports_[1] = a->vfio_user_.get();
  a->register_framework_methods();
  a->register_bdev_methods();
  a->register_transport_methods();
  a->register_subsystem_methods();
  a->register_emulation_methods();
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
  if (Status st = a->rpc_.start(o.rpc_socket, o.rpcs_allowed); !st.ok()) return st;
  *out = std::move(a);
  return Code::kSuccess;
}

NvmfApp::~NvmfApp() {
  rpc_.stop();
  vfio_user_.reset();  // destroys its functions on the poll thread
  tcp_.reset();
  if (target_) target_->attach_emulation(nullptr);
  emu_.reset();
  target_.reset();
}

AppTransport* NvmfApp::find_transport(const std::string& trtype) {
  std::string t = trtype;
  std::transform(t.begin(), t.end(), t.begin(), ::toupper);
  for (AppTransport* tr : transports_)
    if (t == tr->trtype()) return tr;
  return nullptr;
}

RpcError NvmfApp::framework_start_init() {
  if (rpc_.running()) return RpcError{rpc::kInvalidState, "framework is already initialized"};
  rpc_.set_running(true);
  if (!opts_.config.empty()) {
    std::string err;
    if (!load_config(opts_.config, &err).ok())
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
      Json resp = rpc_.dispatch(req);
      if (resp.contains("error")) {
        *error = call["method"].dump() + ": " + resp["error"]["message"].get<std::string>();
        return Code::kInvalidValue;
      }
    }
  }
  return Code::kSuccess;
}

void NvmfApp::register_framework_methods() {
  rpc_.add(
      "rpc_get_methods",
      [this](const Json& p, Json* r) {
        Params a(p, {"current", "include_aliases"});
        bool current = a.boolean("current", false);
        if (!a.ok()) return a.error();
        *r = rpc_.methods(current);
        return RpcError{};
      },
      true);
  rpc_.add(
      "framework_start_init",
      [this](const Json& p, Json* r) {
        Params a(p, {});
        if (!a.ok()) return a.error();
        RpcError e = framework_start_init();
        *r = true;
        return e;
      },
      true);
  rpc_.add(
      "framework_wait_init",
      [](const Json&, Json* r) {
        *r = true;
        return RpcError{};
      },
      true);
}

}  // namespace dpukv::nvme
