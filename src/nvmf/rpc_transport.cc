// JSON-RPC methods for transports and their listeners: nvmf_create_transport,
// nvmf_get_transports, nvmf_subsystem_add_listener / remove_listener. The
// transport is looked up by trtype in the application's table.
#include <cerrno>

#include "nvmf/nvmf_app.h"

namespace dpukv::nvme {

using rpc::Json;
using rpc::Params;
using rpc::RpcError;

void NvmfApp::register_transport_methods() {
  rpc_.add("nvmf_create_transport", [this](const Json& p, Json* r) {
    Params a(p, {"trtype", "max_queue_depth", "max_io_qpairs_per_ctrlr", "in_capsule_data_size",
                 "max_io_size", "io_unit_size", "c2h_success", "max_aq_depth", "num_shared_buffers",
                 "buf_cache_size"});
    std::string tr = a.str("trtype", "", true);
    TcpTransportOptions o = target_->options();
    o.max_queue_depth =
        static_cast<uint16_t>(a.num("max_queue_depth", o.max_queue_depth, false, 2, 1024));
    // SPDK counts the admin queue in max_qpairs_per_ctrlr; this is I/O queues only.
    o.max_io_queues =
        static_cast<uint16_t>(a.num("max_io_qpairs_per_ctrlr", o.max_io_queues, false, 1, 64));
    o.in_capsule_data_size = static_cast<uint32_t>(
        a.num("in_capsule_data_size", o.in_capsule_data_size, false, 0, 131072));
    o.max_io_size =
        static_cast<uint32_t>(a.num("max_io_size", o.max_io_size, false, 4096, 1u << 20));
    o.c2h_success = a.boolean("c2h_success", o.c2h_success);
    a.num("io_unit_size", 0, false, 0, 1u << 20);
    a.num("max_aq_depth", 0, false, 0, 4096);
    a.num("num_shared_buffers", 0, false, 0, 1u << 20);
    a.num("buf_cache_size", 0, false, 0, 1u << 20);
    AppTransport* t = a.ok() ? find_transport(tr) : nullptr;
    if (a.ok() && t == nullptr) a.fail("trtype must be TCP or VFIOUSER");
    if (!a.ok()) return a.error();
    if (RpcError e = t->create(o); !e.ok()) return e;
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_get_transports", [this](const Json& p, Json* r) {
    Params a(p, {"trtype", "tgt_name"});
    if (!a.ok()) return a.error();
    *r = Json::array();
    for (AppTransport* t : transports_)
      if (t->created()) r->push_back(t->describe());
    return RpcError{};
  });

  // Reads listen_address: the transport, its address and what that transport
  // adds (a TCP port).
  auto listener = [this](Params& a, const Json* la, AppTransport** tr, ListenAddress* addr) {
    if (!a.ok() || la == nullptr) return;
    Params l(*la, {"trtype", "traddr", "trsvcid", "adrfam"});
    const std::string name = l.str("trtype", "", true);
    addr->traddr = l.str("traddr", "", true);
    *tr = l.ok() ? find_transport(name) : nullptr;
    if (l.ok() && *tr == nullptr) l.fail("trtype must be TCP or VFIOUSER");
    if (l.ok()) (*tr)->parse_address(l, addr);
    if (!l.ok()) a.fail("listen_address: " + l.problem());
  };
  rpc_.add("nvmf_subsystem_add_listener", [listener](const Json& p, Json* r) {
    Params a(p, {"nqn", "listen_address", "tgt_name", "secure_channel"});
    std::string nqn = a.str("nqn", "", true);
    AppTransport* tr = nullptr;
    ListenAddress addr;
    listener(a, a.object("listen_address", true), &tr, &addr);
    if (!a.ok()) return a.error();
    if (!tr->created())
      return RpcError{-EINVAL, std::string("create the ") + tr->trtype() +
                                   " transport first (nvmf_create_transport)"};
    if (RpcError e = tr->add_listener(nqn, addr); !e.ok()) return e;
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_subsystem_remove_listener", [listener](const Json& p, Json* r) {
    Params a(p, {"nqn", "listen_address", "tgt_name"});
    std::string nqn = a.str("nqn", "", true);
    AppTransport* tr = nullptr;
    ListenAddress addr;
    listener(a, a.object("listen_address", true), &tr, &addr);
    if (!a.ok()) return a.error();
    if (RpcError e = tr->remove_listener(nqn, addr); !e.ok()) return e;
    *r = true;
    return RpcError{};
  });
}

}  // namespace dpukv::nvme
