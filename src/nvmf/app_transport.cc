#include "nvmf/app_transport.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>

namespace dpukv::nvme {

using rpc::Json;
using rpc::RpcError;

// ---- TCP ----------------------------------------------------------------------

RpcError TcpAppTransport::create(const TransportOptions& o) {
  if (created_) return RpcError{-EEXIST, "transport TCP already exists"};
  if (Status st = target_->set_tcp_options(o.tcp); !st.ok())
    return rpc::from_status(st, "TCP transport options");
  created_ = true;
  return {};
}

Json TcpAppTransport::describe() const {
  const TcpTransportOptions& o = target_->options();
  return Json{{"trtype", "TCP"},
              {"max_queue_depth", o.max_queue_depth},
              {"max_io_qpairs_per_ctrlr", o.max_io_queues},
              {"in_capsule_data_size", o.in_capsule_data_size},
              {"max_io_size", o.max_io_size},
              {"c2h_success", o.c2h_success}};
}

void TcpAppTransport::parse_address(rpc::Params& l, ListenAddress* a) const {
  const std::string svc = l.str("trsvcid", "4420");
  const std::string fam = l.str("adrfam", "IPv4");
  if (!l.ok()) return;
  char* end = nullptr;
  const unsigned long v = std::strtoul(svc.c_str(), &end, 10);
  if (svc.empty() || *end != '\0' || v > 65535) l.fail("trsvcid must be a port number");
  if (fam != "IPv4" && fam != "ipv4") l.fail("adrfam: only IPv4");
  a->port = static_cast<uint16_t>(v);
}

RpcError TcpAppTransport::add_listener(const std::string& nqn, const ListenAddress& a) {
  if (Status st = target_->add_listener(nqn, a.traddr, a.port); !st.ok())
    return rpc::from_status(st, "listener " + a.traddr + ":" + std::to_string(a.port));
  return {};
}

RpcError TcpAppTransport::remove_listener(const std::string& nqn, const ListenAddress& a) {
  if (Status st = target_->remove_listener(nqn, a.traddr, a.port); !st.ok())
    return rpc::from_status(st, "listener " + a.traddr + ":" + std::to_string(a.port));
  return {};
}

void TcpAppTransport::list_listeners(const SubsystemInfo& s, Json* out) const {
  for (const auto& l : s.listeners) {  // "tcp:ADDR:PORT"
    const size_t a1 = l.find(':'), a2 = l.rfind(':');
    out->push_back(Json{{"trtype", "TCP"},
                        {"adrfam", "IPv4"},
                        {"traddr", l.substr(a1 + 1, a2 - a1 - 1)},
                        {"trsvcid", l.substr(a2 + 1)}});
  }
}

Json TcpAppTransport::stats() {
  const TargetStats s = target_->stats();
  return Json{{"trtype", "TCP"},
              {"connections", s.connections},
              {"active_connections", s.active_connections},
              {"pdus_in", s.pdus_in},
              {"pdus_out", s.pdus_out},
              {"commands", s.commands},
              {"errors", s.errors},
              {"term_reqs_sent", s.term_reqs_sent},
              {"connect_rejects", s.connect_rejects},
              {"keep_alive_expiries", s.keep_alive_expiries},
              {"icreq_timeouts", s.icreq_timeouts},
              {"connect_timeouts", s.connect_timeouts},
              {"pdu_timeouts", s.pdu_timeouts},
              {"connections_refused", s.connections_refused},
              {"accept_errors", s.accept_errors}};
}

// ---- VFIOUSER -----------------------------------------------------------------

VfioUserAppTransport::~VfioUserAppTransport() {
  for (const auto& f : functions_) {
    const std::string id = f.id;
    (void)target_->run_on_poller([&] { return vfio_->destroy_function(id); });
  }
}

RpcError VfioUserAppTransport::create(const TransportOptions& o) {
  if (created_) return RpcError{-EEXIST, "transport VFIOUSER already exists"};
  created_ = true;
  mappable_bar0_ = o.mappable_bar0;
  return {};
}

Json VfioUserAppTransport::describe() const {
  return Json{{"trtype", "VFIOUSER"},
              {"max_queue_depth", 1024},
              {"max_io_qpairs_per_ctrlr", 31},
              {"max_io_size", 1u << 20}};
}

RpcError VfioUserAppTransport::add_listener(const std::string& nqn, const ListenAddress& a) {
  std::error_code ec;
  std::filesystem::create_directories(a.traddr, ec);
  Json out;
  return make_function(nqn, a.traddr + "/cntrl", "", &out);
}

RpcError VfioUserAppTransport::remove_listener(const std::string& nqn, const ListenAddress& a) {
  auto it = std::find_if(functions_.begin(), functions_.end(), [&](const Function& f) {
    return f.nqn == nqn && f.socket_path == a.traddr + "/cntrl";
  });
  if (it == functions_.end()) return RpcError{-ENODEV, "listener " + a.traddr + ": not found"};
  (void)destroy_function(it->id);  // the function is gone from the list either way
  return {};
}

void VfioUserAppTransport::list_listeners(const SubsystemInfo& s, Json* out) const {
  for (const auto& f : functions_)
    if (f.nqn == s.nqn)
      out->push_back(Json{{"trtype", "VFIOUSER"}, {"traddr", f.socket_path}, {"function", f.id}});
}

std::vector<FunctionInfo> VfioUserAppTransport::function_infos() {
  std::vector<FunctionInfo> infos;
  (void)target_->run_on_poller([&] {
    infos = vfio_->list_functions();
    return Status(Code::kSuccess);
  });
  return infos;
}

Json VfioUserAppTransport::stats() {
  Json fns = Json::array();
  for (const auto& f : function_infos())
    fns.push_back(Json{{"id", f.id},
                       {"io_commands", f.stats.io_commands},
                       {"admin_commands", f.stats.admin_commands},
                       {"errors", f.stats.errors},
                       {"interrupts", f.stats.interrupts}});
  return Json{{"trtype", "VFIOUSER"}, {"functions", fns}};
}

void VfioUserAppTransport::subsystem_deleted(const std::string& nqn) {
  for (size_t i = 0; i < functions_.size();)
    if (functions_[i].nqn == nqn)
      (void)destroy_function(functions_[i].id);
    else
      ++i;
}

// An emulated PCIe function (vfio-user) that serves a subsystem's namespaces.
RpcError VfioUserAppTransport::make_function(const std::string& nqn, const std::string& path,
                                             const std::string& want, Json* out) {
  std::shared_ptr<NamespaceSet> ns = target_->namespace_set(nqn);
  if (!ns) return RpcError{-ENODEV, "subsystem " + nqn + ": not found"};
  FunctionSpec spec;
  spec.id = want;
  spec.socket_path = path;
  spec.namespace_set = ns;
  for (const SubsystemInfo& s : target_->subsystems())
    if (s.nqn == nqn) {
      spec.config.controller.serial = s.serial;
      spec.config.controller.model = s.model;
      spec.config.controller.subnqn = s.nqn;
    }
  spec.config.mappable_doorbells = mappable_bar0_;
  std::string id;
  Status st = target_->run_on_poller([&] { return vfio_->create_function(spec, &id); });
  if (!st.ok()) return rpc::from_status(st, "function at " + path);
  functions_.push_back(Function{id, nqn, path});
  *out = Json{
      {"id", id}, {"socket_path", path}, {"state", hotplug_state_name(HotplugState::kPowerOn)}};
  return {};
}

RpcError VfioUserAppTransport::destroy_function(const std::string& id) {
  auto it = std::find_if(functions_.begin(), functions_.end(),
                         [&](const Function& f) { return f.id == id; });
  if (it == functions_.end()) return RpcError{-ENODEV, "function " + id + ": not found"};
  Status st = target_->run_on_poller([&] { return vfio_->destroy_function(id); });
  functions_.erase(it);
  return st.ok() ? RpcError{} : rpc::from_status(st, "function " + id);
}

Json VfioUserAppTransport::list_functions() {
  Json r = Json::array();
  for (const auto& f : function_infos()) {
    std::string nqn;
    for (const auto& x : functions_)
      if (x.id == f.id) nqn = x.nqn;
    r.push_back(Json{{"id", f.id},
                     {"manager", "vfio-user"},
                     {"socket_path", f.socket_path},
                     {"state", hotplug_state_name(f.state)},
                     {"nqn", nqn},
                     {"client_connected", f.client_connected},
                     {"io_queues", f.io_queues}});
  }
  return r;
}

}  // namespace dpukv::nvme
