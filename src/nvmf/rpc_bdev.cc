#include "nvmf/rpc_bdev.h"

#include <algorithm>
#include <cctype>
#include <cerrno>

namespace dpukv::nvme {

using rpc::Json;
using rpc::Params;
using rpc::RpcError;

void register_bdev_methods(AppState& app) {
  for (const BdevKind& kind : bdev_kinds()) {
    app.rpc.add(std::string("bdev_") + kind.kind + "_create", [&app, &kind](const Json& p,
                                                                            Json* r) {
      Params a(p, kind.params);
      const bool numbered = kind.default_name != nullptr && !a.has("name");
      const std::string name = numbered
                                   ? kind.default_name + std::to_string(app.bdev_seq[kind.kind])
                                   : a.str("name", "", true);
      if (a.ok() &&
          (name.empty() || name.size() > 64 || !std::all_of(name.begin(), name.end(), [](char c) {
             return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
           })))
        a.fail("name must be 1-64 characters of [A-Za-z0-9_.-]");
      else if (a.ok() && app.bdevs.count(name))
        a.fail("bdev " + name + " already exists");
      std::unique_ptr<Bdev> b;
      Status st = a.ok() ? kind.create(a, app.bdev_limits, name, &b) : Status(Code::kInvalidValue);
      if (!a.ok()) return a.error();
      if (!st.ok()) return rpc::from_status(st, "bdev " + name);
      if (numbered) ++app.bdev_seq[kind.kind];
      app.bdevs[name] = std::shared_ptr<Bdev>(std::move(b));
      *r = name;
      return RpcError{};
    });
  }
  app.rpc.add("bdev_get_bdevs", [&app](const Json& p, Json* r) {
    Params a(p, {"name", "timeout"});
    std::string name = a.str("name");
    if (!a.ok()) return a.error();
    if (!name.empty() && !app.bdevs.count(name))
      return RpcError{-ENODEV, "bdev " + name + ": not found"};
    *r = Json::array();
    for (const auto& [n, b] : app.bdevs) {
      if (!name.empty() && n != name) continue;
      const BdevStats& s = b->stats();
      r->push_back(Json{{"name", n},
                        {"product_name", b->kind()},
                        {"block_size", b->block_size()},
                        {"num_blocks", b->num_blocks()},
                        {"claimed", app.target->uses_bdev(b.get())},
                        {"stats",
                         {{"reads", s.reads},
                          {"writes", s.writes},
                          {"bytes_read", s.bytes_read},
                          {"bytes_written", s.bytes_written},
                          {"errors", s.errors}}}});
    }
    return RpcError{};
  });
  app.rpc.add("bdev_delete", [&app](const Json& p, Json* r) {
    Params a(p, {"name"});
    std::string name = a.str("name", "", true);
    if (!a.ok()) return a.error();
    auto it = app.bdevs.find(name);
    if (it == app.bdevs.end()) return RpcError{-ENODEV, "bdev " + name + ": not found"};
    if (app.target->uses_bdev(it->second.get()))
      return RpcError{
          -EBUSY, "bdev " + name + " is a namespace of a subsystem; remove the namespace first"};
    app.bdevs.erase(it);
    *r = true;
    return RpcError{};
  });
}

}  // namespace dpukv::nvme
