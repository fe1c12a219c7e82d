#include "nvmf/rpc_subsystem.h"

#include <cerrno>

namespace dpukv::nvme {

using rpc::Json;
using rpc::Params;
using rpc::RpcError;

void register_subsystem_methods(AppState& app) {
  app.rpc.add("nvmf_create_subsystem", [&app](const Json& p, Json* r) {
    Params a(p, {"nqn", "serial_number", "model_number", "allow_any_host", "max_namespaces",
                 "tgt_name", "ana_reporting"});
    SubsystemConfig c;
    c.nqn = a.str("nqn", "", true);
    c.serial = a.str("serial_number", "DPUKV00000001");
    c.model = a.str("model_number", "dpukv NVMe-oF target");
    c.allow_any_host = a.boolean("allow_any_host", false);
    c.max_namespaces = static_cast<uint16_t>(a.num("max_namespaces", 32, false, 0, 32));
    if (c.max_namespaces == 0) c.max_namespaces = 32;
    if (!a.ok()) return a.error();
    if (Status st = app.target->create_subsystem(c); !st.ok())
      return st.code() == Code::kInvalidValue ? rpc::invalid(
                                                    "nqn must be nqn.* (up to 223 printable "
                                                    "characters); serial up to 20, model up to 40")
                                              : rpc::from_status(st, "subsystem " + c.nqn);
    *r = true;
    return RpcError{};
  });
  app.rpc.add("nvmf_delete_subsystem", [&app](const Json& p, Json* r) {
    Params a(p, {"nqn", "tgt_name"});
    std::string nqn = a.str("nqn", "", true);
    if (!a.ok()) return a.error();
    for (AppTransport* t : app.transports) t->subsystem_deleted(nqn);
    if (Status st = app.target->delete_subsystem(nqn); !st.ok())
      return rpc::from_status(st, "subsystem " + nqn);
    *r = true;
    return RpcError{};
  });
  app.rpc.add("nvmf_get_subsystems", [&app](const Json& p, Json* r) {
    Params a(p, {"nqn", "tgt_name"});
    std::string nqn = a.str("nqn");
    if (!a.ok()) return a.error();
    *r = Json::array();
    for (const SubsystemInfo& s : app.target->subsystems()) {
      if (!nqn.empty() && s.nqn != nqn) continue;
      Json listen = Json::array();
      for (AppTransport* t : app.transports) t->list_listeners(s, &listen);
      Json hosts = Json::array();
      for (const auto& h : s.hosts) hosts.push_back(Json{{"nqn", h}});
      Json nss = Json::array();
      for (const auto& [id, bdev] : s.namespaces)
        nss.push_back(Json{{"nsid", id}, {"bdev_name", bdev}, {"name", bdev}});
      r->push_back(Json{{"nqn", s.nqn},
                        {"subtype", "NVMe"},
                        {"listen_addresses", listen},
                        {"allow_any_host", s.allow_any_host},
                        {"hosts", hosts},
                        {"serial_number", s.serial},
                        {"model_number", s.model},
                        {"namespaces", nss},
                        {"controllers", s.controllers}});
    }
    if (!nqn.empty() && r->empty()) return RpcError{-ENODEV, "subsystem " + nqn + ": not found"};
    return RpcError{};
  });
  app.rpc.add("nvmf_subsystem_add_ns", [&app](const Json& p, Json* r) {
    Params a(p, {"nqn", "namespace", "tgt_name"});
    std::string nqn = a.str("nqn", "", true);
    const Json* ns = a.object("namespace", true);
    std::string bdev;
    uint32_t nsid = 0;
    if (a.ok()) {
      Params n(*ns, {"bdev_name", "nsid", "uuid", "nguid", "eui64"});
      bdev = n.str("bdev_name", "", true);
      nsid = static_cast<uint32_t>(n.num("nsid", 0, false, 0, ControllerCore::kMaxNamespaces));
      if (!n.ok()) a.fail("namespace: " + n.problem());
    }
    if (!a.ok()) return a.error();
    auto it = app.bdevs.find(bdev);
    if (it == app.bdevs.end()) return RpcError{-ENODEV, "bdev " + bdev + ": not found"};
    uint32_t got = 0;
    Status st = app.target->add_namespace(nqn, it->second, nsid, &got);
    if (st == Code::kNotPermitted)
      return RpcError{-EEXIST, "bdev " + bdev + " is already a namespace of " + nqn};
    if (!st.ok())
      return rpc::from_status(
          st, st.code() == Code::kBadState ? "nsid " + std::to_string(nsid) : "subsystem " + nqn);
    *r = got;
    return RpcError{};
  });
  app.rpc.add("nvmf_subsystem_remove_ns", [&app](const Json& p, Json* r) {
    Params a(p, {"nqn", "nsid", "tgt_name"});
    std::string nqn = a.str("nqn", "", true);
    uint32_t nsid =
        static_cast<uint32_t>(a.num("nsid", 0, true, 1, ControllerCore::kMaxNamespaces));
    if (!a.ok()) return a.error();
    if (Status st = app.target->remove_namespace(nqn, nsid); !st.ok())
      return rpc::from_status(st, "namespace " + std::to_string(nsid) + " of " + nqn);
    *r = true;
    return RpcError{};
  });
  app.rpc.add("nvmf_subsystem_add_host", [&app](const Json& p, Json* r) {
    Params a(p, {"nqn", "host", "tgt_name"});
    std::string nqn = a.str("nqn", "", true), host = a.str("host", "", true);
    if (!a.ok()) return a.error();
    if (Status st = app.target->add_host(nqn, host); !st.ok())
      return rpc::from_status(st, "host " + host);
    *r = true;
    return RpcError{};
  });
  app.rpc.add("nvmf_subsystem_remove_host", [&app](const Json& p, Json* r) {
    Params a(p, {"nqn", "host", "tgt_name"});
    std::string nqn = a.str("nqn", "", true), host = a.str("host", "", true);
    if (!a.ok()) return a.error();
    if (Status st = app.target->remove_host(nqn, host); !st.ok())
      return rpc::from_status(st, "host " + host);
    *r = true;
    return RpcError{};
  });
  app.rpc.add("nvmf_get_stats", [&app](const Json& p, Json* r) {
    Params a(p, {"tgt_name"});
    if (!a.ok()) return a.error();
    Json transports = Json::array();
    for (AppTransport* t : app.transports) transports.push_back(t->stats());
    *r = Json{{"poll_groups", Json::array({Json{{"name", "nvmf_tgt_poll_group_000"},
                                                {"transports", transports}}})}};
    return RpcError{};
  });
}

}  // namespace dpukv::nvme
