#include "nvmf/rpc_transport.h"

#include <cerrno>

#include "runtime/log.h"

namespace dpukv::nvme {

using rpc::Json;
using rpc::Params;
using rpc::RpcError;

void register_transport_methods(AppState& app) {
  app.rpc.add("nvmf_create_transport", [&app](const Json& p, Json* r) {
    // Every parameter SPDK's rpc.py may send is known: those that mean something
    // here are applied, those of other transports or of SPDK's own buffer and
    // poll-group machinery are taken and logged, and only a value that cannot
    // be honoured is refused.
    Params a(p, {"trtype",
                 "tgt_name",
                 "max_queue_depth",
                 "max_io_qpairs_per_ctrlr",
                 "in_capsule_data_size",
                 "max_io_size",
                 "io_unit_size",
                 "c2h_success",
                 "max_aq_depth",
                 "num_shared_buffers",
                 "buf_cache_size",
                 "zcopy",
                 "num_cqe",
                 "max_srq_depth",
                 "no_srq",
                 "dif_insert_or_strip",
                 "sock_priority",
                 "acceptor_backlog",
                 "abort_timeout_sec",
                 "no_wr_batching",
                 "control_msg_num",
                 "disable_mappable_bar0",
                 "disable_adaptive_irq",
                 "disable_shadow_doorbells",
                 "acceptor_poll_rate"});
    std::string tr = a.str("trtype", "", true);
    TransportOptions o;
    o.tcp = app.target->options();
    o.tcp.max_queue_depth =
        static_cast<uint16_t>(a.num("max_queue_depth", o.tcp.max_queue_depth, false, 2, 1024));
    // SPDK counts the admin queue in max_qpairs_per_ctrlr; this is I/O queues only.
    o.tcp.max_io_queues =
        static_cast<uint16_t>(a.num("max_io_qpairs_per_ctrlr", o.tcp.max_io_queues, false, 1, 64));
    o.tcp.in_capsule_data_size = static_cast<uint32_t>(
        a.num("in_capsule_data_size", o.tcp.in_capsule_data_size, false, 0, 131072));
    o.tcp.max_io_size =
        static_cast<uint32_t>(a.num("max_io_size", o.tcp.max_io_size, false, 4096, 1u << 20));
    o.tcp.c2h_success = a.boolean("c2h_success", o.tcp.c2h_success);
    o.mappable_bar0 = !a.boolean("disable_mappable_bar0", false);
    // No namespace here carries protection information, so there is nothing to
    // insert or strip: the flag changes no byte and is accepted as SPDK does.
    (void)a.boolean("dif_insert_or_strip", false);
    // Data moves without a bounce buffer already (the bdev reads into the PDU's
    // buffer); zcopy asks for what is done anyway.
    (void)a.boolean("zcopy", false);
    // RDMA only, or SPDK's shared-buffer pools and interrupt tuning, which this
    // target does not have: taken and logged.
    for (const char* k :
         {"no_srq", "no_wr_batching", "disable_adaptive_irq", "disable_shadow_doorbells"})
      if (a.boolean(k, false)) LOG_DBG("nvmf_create_transport: %s has no effect here", k);
    for (const char* k : {"io_unit_size", "max_aq_depth", "num_shared_buffers", "buf_cache_size",
                          "num_cqe", "max_srq_depth", "sock_priority", "acceptor_backlog",
                          "abort_timeout_sec", "control_msg_num", "acceptor_poll_rate"})
      if (a.has(k) && a.num(k, 0, false, 0, 1ull << 32) != 0)
        LOG_DBG("nvmf_create_transport: %s has no effect here", k);
    (void)a.str("tgt_name", "");
    AppTransport* t = a.ok() ? app.find_transport(tr) : nullptr;
    if (a.ok() && t == nullptr) a.fail("trtype must be TCP or VFIOUSER");
    if (!a.ok()) return a.error();
    if (RpcError e = t->create(o); !e.ok()) return e;
    *r = true;
    return RpcError{};
  });
  app.rpc.add("nvmf_get_transports", [&app](const Json& p, Json* r) {
    Params a(p, {"trtype", "tgt_name"});
    if (!a.ok()) return a.error();
    *r = Json::array();
    for (AppTransport* t : app.transports)
      if (t->created()) r->push_back(t->describe());
    return RpcError{};
  });

  // Reads listen_address: the transport, its address and what that transport
  // adds (a TCP port).
  auto listener = [&app](Params& a, const Json* la, AppTransport** tr, ListenAddress* addr) {
    if (!a.ok() || la == nullptr) return;
    Params l(*la, {"trtype", "traddr", "trsvcid", "adrfam"});
    const std::string name = l.str("trtype", "", true);
    addr->traddr = l.str("traddr", "", true);
    *tr = l.ok() ? app.find_transport(name) : nullptr;
    if (l.ok() && *tr == nullptr) l.fail("trtype must be TCP or VFIOUSER");
    if (l.ok()) (*tr)->parse_address(l, addr);
    if (!l.ok()) a.fail("listen_address: " + l.problem());
  };
  app.rpc.add("nvmf_subsystem_add_listener", [listener](const Json& p, Json* r) {
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
  app.rpc.add("nvmf_subsystem_remove_listener", [listener](const Json& p, Json* r) {
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
