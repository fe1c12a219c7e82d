#include "nvmf/nvmf_app.h"

#include "nvmf/bdev/bdev_kv.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/log.h"

namespace dpukv::nvme {
namespace {

using rpc::Json;
using rpc::RpcError;

RpcError invalid(const std::string& msg) {
  return RpcError{rpc::kInvalidParams, "Invalid parameters: " + msg};
}

// Typed parameter access with clear errors: every field is checked for presence
// and type before use; unknown fields are refused (a typo should not pass silently).
class Params {
 public:
  Params(const Json& p, std::initializer_list<const char*> known) : p_(p) {
    if (!p.is_object()) {
      err_ = "params must be an object";
      return;
    }
    for (auto it = p.begin(); it != p.end(); ++it)
      if (std::find_if(known.begin(), known.end(), [&](const char* k) { return it.key() == k; }) ==
          known.end()) {
        err_ = "unknown parameter '" + it.key() + "'";
        return;
      }
  }
  bool has(const char* k) const { return err_.empty() && p_.contains(k); }
  std::string str(const char* k, const std::string& dflt = "", bool required = false) {
    if (!err_.empty()) return dflt;
    if (!p_.contains(k)) {
      if (required) err_ = std::string("missing '") + k + "'";
      return dflt;
    }
    // A number is taken as its decimal text only where the value is numeric text
    // by nature (trsvcid=4420 typed in a shell, a serial number); names and every
    // other string must be strings ("name": 5 is refused).
    const std::string key = k;
    if (p_[k].is_number_unsigned() && (key == "trsvcid" || key == "serial_number"))
      return p_[k].dump();
    if (!p_[k].is_string()) {
      err_ = std::string("'") + k + "' must be a string";
      return dflt;
    }
    return p_[k].get<std::string>();
  }
  uint64_t num(const char* k, uint64_t dflt, bool required, uint64_t lo, uint64_t hi) {
    if (!err_.empty()) return dflt;
    if (!p_.contains(k)) {
      if (required) err_ = std::string("missing '") + k + "'";
      return dflt;
    }
    if (!p_[k].is_number_unsigned() && !(p_[k].is_number_integer() && p_[k].get<int64_t>() >= 0)) {
      err_ = std::string("'") + k + "' must be a non-negative integer";
      return dflt;
    }
    uint64_t v = p_[k].get<uint64_t>();
    if (v < lo || v > hi) {
      err_ = std::string("'") + k + "' must be in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]";
      return dflt;
    }
    return v;
  }
  bool boolean(const char* k, bool dflt) {
    if (!err_.empty() || !p_.contains(k)) return dflt;
    if (!p_[k].is_boolean()) {
      err_ = std::string("'") + k + "' must be true or false";
      return dflt;
    }
    return p_[k].get<bool>();
  }
  const Json* object(const char* k, bool required) {
    if (!err_.empty()) return nullptr;
    if (!p_.contains(k)) {
      if (required) err_ = std::string("missing '") + k + "'";
      return nullptr;
    }
    if (!p_[k].is_object()) {
      err_ = std::string("'") + k + "' must be an object";
      return nullptr;
    }
    return &p_[k];
  }
  bool ok() const { return err_.empty(); }
  RpcError error() const { return invalid(err_); }
  void fail(const std::string& e) {
    if (err_.empty()) err_ = e;
  }

 private:
  const Json& p_;
  std::string err_;
};

RpcError from_status(Status st, const std::string& what) {
  switch (st.code()) {
    case Code::kSuccess:
      return {};
    case Code::kNotFound:
      return RpcError{-ENODEV, what + ": not found"};
    case Code::kBadState:
      return RpcError{-EEXIST, what + ": already exists or in use"};
    case Code::kInvalidValue:
      return invalid(what);
    case Code::kFull:
      return RpcError{-ENOSPC, what + ": no room"};
    case Code::kNoMemory:
      return RpcError{-ENOMEM, what + ": out of memory"};
    default:
      return RpcError{-EIO, what + ": " + std::string(st.name())};
  }
}

}  // namespace

Status NvmfApp::create(const AppOptions& o, std::unique_ptr<NvmfApp>* out) {
  std::unique_ptr<NvmfApp> a(new NvmfApp());
  a->opts_ = o;
  a->max_malloc_bytes_ = o.max_malloc_bytes != 0
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
  a->register_methods();
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
  if (target_) {
    for (const auto& f : functions_) {
      std::string id = f.id;
      (void)target_->run_on_poller([&] { return emu_->destroy_function(id); });
    }
    target_->attach_emulation(nullptr);
  }
  emu_.reset();
  target_.reset();
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

RpcError NvmfApp::add_bdev(const std::string& name, std::unique_ptr<Bdev> b, Status st,
                           Json* result) {
  if (!st.ok()) return from_status(st, "bdev " + name);
  bdevs_[name] = std::shared_ptr<Bdev>(std::move(b));
  *result = name;
  return {};
}

// An emulated PCIe function (vfio-user) that serves a subsystem's namespaces.
RpcError NvmfApp::make_function(const std::string& nqn, const std::string& path,
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
  std::string id;
  Status st = target_->run_on_poller([&] { return emu_->create_function(spec, &id); });
  if (!st.ok()) return from_status(st, "function at " + path);
  functions_.push_back(Function{id, nqn, path});
  *out = Json{
      {"id", id}, {"socket_path", path}, {"state", hotplug_state_name(HotplugState::kPowerOn)}};
  return {};
}

void NvmfApp::register_methods() {
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

  // ---- block devices ----
  auto check_name = [this](Params& a, const std::string& name) {
    if (name.empty() || name.size() > 64 || !std::all_of(name.begin(), name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
        }))
      a.fail("name must be 1-64 characters of [A-Za-z0-9_.-]");
    else if (bdevs_.count(name))
      a.fail("bdev " + name + " already exists");
  };
  rpc_.add("bdev_malloc_create", [this, check_name](const Json& p, Json* r) {
    Params a(p, {"name", "num_blocks", "block_size", "uuid"});
    std::string name = a.str("name", "Malloc" + std::to_string(malloc_seq_));
    uint64_t blocks = a.num("num_blocks", 0, true, 1, uint64_t{1} << 40);
    uint64_t bs = a.num("block_size", 512, false, 512, 4096);
    if (a.ok() && !valid_block_size(static_cast<uint32_t>(bs)))
      a.fail("block_size must be 512 or 4096");
    if (a.ok() && blocks * bs > max_malloc_bytes_)
      a.fail("num_blocks * block_size is larger than the malloc limit of " +
             std::to_string(max_malloc_bytes_) + " bytes");
    check_name(a, name);
    if (!a.ok()) return a.error();
    if (!p.contains("name")) ++malloc_seq_;
    std::unique_ptr<Bdev> b;
    Status st = create_malloc_bdev(name, blocks, static_cast<uint32_t>(bs), &b);
    return add_bdev(name, std::move(b), st, r);
  });
  rpc_.add("bdev_null_create", [this, check_name](const Json& p, Json* r) {
    Params a(p, {"name", "num_blocks", "block_size", "uuid"});
    std::string name = a.str("name", "", true);
    uint64_t blocks = a.num("num_blocks", 0, true, 1, uint64_t{1} << 40);
    uint64_t bs = a.num("block_size", 512, false, 512, 4096);
    if (a.ok() && !valid_block_size(static_cast<uint32_t>(bs)))
      a.fail("block_size must be 512 or 4096");
    check_name(a, name);
    if (!a.ok()) return a.error();
    std::unique_ptr<Bdev> b;
    Status st = create_null_bdev(name, blocks, static_cast<uint32_t>(bs), &b);
    return add_bdev(name, std::move(b), st, r);
  });
  rpc_.add("bdev_file_create", [this, check_name](const Json& p, Json* r) {
    Params a(p, {"name", "filename", "block_size", "size"});
    std::string name = a.str("name", "", true);
    std::string file = a.str("filename", "", true);
    uint64_t bs = a.num("block_size", 4096, false, 512, 4096);
    uint64_t size = a.num("size", 0, false, 0, uint64_t{1} << 44);
    if (a.ok() && !valid_block_size(static_cast<uint32_t>(bs)))
      a.fail("block_size must be 512 or 4096");
    if (a.ok() && size == 0 && !std::filesystem::exists(file))
      a.fail("filename does not exist; give size to create it");
    check_name(a, name);
    if (!a.ok()) return a.error();
    std::unique_ptr<Bdev> b;
    Status st = create_file_bdev(name, file, size, static_cast<uint32_t>(bs), &b);
    return add_bdev(name, std::move(b), st, r);
  });
  rpc_.add("bdev_kv_create", [this, check_name](const Json& p, Json* r) {
    Params a(p, {"name", "num_blocks", "block_size", "chunk_size", "memory_size", "disk_dir",
                 "disk_size"});
    std::string name = a.str("name", "", true);
    KvBdevOptions o;
    o.num_blocks = a.num("num_blocks", 0, true, 1, uint64_t{1} << 40);
    o.block_size = static_cast<uint32_t>(a.num("block_size", 4096, false, 512, 4096));
    o.chunk_bytes = static_cast<uint32_t>(a.num("chunk_size", 64 * 1024, false, 4096, 4u << 20));
    o.memory_bytes = a.num("memory_size", 64ull << 20, false, 4096, uint64_t{1} << 40);
    o.disk_dir = a.str("disk_dir");
    o.disk_bytes = a.num("disk_size", 0, false, 0, uint64_t{1} << 44);
    if (a.ok() && !valid_block_size(o.block_size)) a.fail("block_size must be 512 or 4096");
    if (a.ok() && (o.chunk_bytes % o.block_size != 0 || (o.chunk_bytes & (o.chunk_bytes - 1)) != 0))
      a.fail("chunk_size must be a power of two and a multiple of block_size");
    if (a.ok() && o.memory_bytes > max_malloc_bytes_)
      a.fail("memory_size is larger than the memory limit");
    if (a.ok() && o.memory_bytes < o.chunk_bytes)
      a.fail("memory_size must hold at least one chunk");
    if (a.ok() && o.disk_dir.empty() != (o.disk_bytes == 0))
      a.fail("disk_dir and disk_size go together");
    check_name(a, name);
    if (!a.ok()) return a.error();
    std::unique_ptr<Bdev> b;
    Status st = create_kv_bdev(name, o, &b);
    return add_bdev(name, std::move(b), st, r);
  });
  rpc_.add("bdev_get_bdevs", [this](const Json& p, Json* r) {
    Params a(p, {"name", "timeout"});
    std::string name = a.str("name");
    if (!a.ok()) return a.error();
    if (!name.empty() && !bdevs_.count(name))
      return RpcError{-ENODEV, "bdev " + name + ": not found"};
    *r = Json::array();
    for (const auto& [n, b] : bdevs_) {
      if (!name.empty() && n != name) continue;
      const BdevStats& s = b->stats();
      r->push_back(Json{{"name", n},
                        {"product_name", b->kind()},
                        {"block_size", b->block_size()},
                        {"num_blocks", b->num_blocks()},
                        {"claimed", target_->uses_bdev(b.get())},
                        {"stats",
                         {{"reads", s.reads},
                          {"writes", s.writes},
                          {"bytes_read", s.bytes_read},
                          {"bytes_written", s.bytes_written},
                          {"errors", s.errors}}}});
    }
    return RpcError{};
  });
  rpc_.add("bdev_delete", [this](const Json& p, Json* r) {
    Params a(p, {"name"});
    std::string name = a.str("name", "", true);
    if (!a.ok()) return a.error();
    auto it = bdevs_.find(name);
    if (it == bdevs_.end()) return RpcError{-ENODEV, "bdev " + name + ": not found"};
    if (target_->uses_bdev(it->second.get()))
      return RpcError{
          -EBUSY, "bdev " + name + " is a namespace of a subsystem; remove the namespace first"};
    bdevs_.erase(it);
    *r = true;
    return RpcError{};
  });

  // ---- transports ----
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
    std::string t = tr;
    std::transform(t.begin(), t.end(), t.begin(), ::toupper);
    if (a.ok() && t != "TCP" && t != "VFIOUSER") a.fail("trtype must be TCP or VFIOUSER");
    if (!a.ok()) return a.error();
    if (t == "TCP") {
      if (tcp_transport_) return RpcError{-EEXIST, "transport TCP already exists"};
      if (Status st = target_->set_tcp_options(o); !st.ok())
        return from_status(st, "TCP transport options");
      tcp_transport_ = true;
    } else {
      if (vfiouser_transport_) return RpcError{-EEXIST, "transport VFIOUSER already exists"};
      vfiouser_transport_ = true;
    }
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_get_transports", [this](const Json& p, Json* r) {
    Params a(p, {"trtype", "tgt_name"});
    if (!a.ok()) return a.error();
    *r = Json::array();
    const TcpTransportOptions& o = target_->options();
    if (tcp_transport_)
      r->push_back(Json{{"trtype", "TCP"},
                        {"max_queue_depth", o.max_queue_depth},
                        {"max_io_qpairs_per_ctrlr", o.max_io_queues},
                        {"in_capsule_data_size", o.in_capsule_data_size},
                        {"max_io_size", o.max_io_size},
                        {"c2h_success", o.c2h_success}});
    if (vfiouser_transport_)
      r->push_back(Json{{"trtype", "VFIOUSER"},
                        {"max_queue_depth", 1024},
                        {"max_io_qpairs_per_ctrlr", 31},
                        {"max_io_size", 1u << 20}});
    return RpcError{};
  });

  // ---- subsystems ----
  rpc_.add("nvmf_create_subsystem", [this](const Json& p, Json* r) {
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
    if (Status st = target_->create_subsystem(c); !st.ok())
      return st.code() == Code::kInvalidValue ? invalid(
                                                    "nqn must be nqn.* (up to 223 printable "
                                                    "characters); serial up to 20, model up to 40")
                                              : from_status(st, "subsystem " + c.nqn);
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_delete_subsystem", [this](const Json& p, Json* r) {
    Params a(p, {"nqn", "tgt_name"});
    std::string nqn = a.str("nqn", "", true);
    if (!a.ok()) return a.error();
    for (size_t i = 0; i < functions_.size();)
      if (functions_[i].nqn == nqn) {
        std::string id = functions_[i].id;
        (void)target_->run_on_poller([&] { return emu_->destroy_function(id); });
        functions_.erase(functions_.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    if (Status st = target_->delete_subsystem(nqn); !st.ok())
      return from_status(st, "subsystem " + nqn);
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_get_subsystems", [this](const Json& p, Json* r) {
    Params a(p, {"nqn", "tgt_name"});
    std::string nqn = a.str("nqn");
    if (!a.ok()) return a.error();
    *r = Json::array();
    for (const SubsystemInfo& s : target_->subsystems()) {
      if (!nqn.empty() && s.nqn != nqn) continue;
      Json listen = Json::array();
      for (const auto& l : s.listeners) {  // "tcp:ADDR:PORT"
        size_t a1 = l.find(':'), a2 = l.rfind(':');
        listen.push_back(Json{{"trtype", "TCP"},
                              {"adrfam", "IPv4"},
                              {"traddr", l.substr(a1 + 1, a2 - a1 - 1)},
                              {"trsvcid", l.substr(a2 + 1)}});
      }
      for (const auto& f : functions_)
        if (f.nqn == s.nqn)
          listen.push_back(
              Json{{"trtype", "VFIOUSER"}, {"traddr", f.socket_path}, {"function", f.id}});
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
  auto listener = [](Params& a, const Json* la, std::string* tr, std::string* addr,
                     uint16_t* port) {
    if (!a.ok() || la == nullptr) return;
    Params l(*la, {"trtype", "traddr", "trsvcid", "adrfam"});
    *tr = l.str("trtype", "", true);
    *addr = l.str("traddr", "", true);
    std::string svc = l.str("trsvcid", "4420");
    std::string fam = l.str("adrfam", "IPv4");
    std::transform(tr->begin(), tr->end(), tr->begin(), ::toupper);
    if (l.ok() && *tr != "TCP" && *tr != "VFIOUSER") l.fail("trtype must be TCP or VFIOUSER");
    if (l.ok() && *tr == "TCP") {
      char* end = nullptr;
      unsigned long v = std::strtoul(svc.c_str(), &end, 10);
      if (svc.empty() || *end != '\0' || v > 65535) l.fail("trsvcid must be a port number");
      if (fam != "IPv4" && fam != "ipv4") l.fail("adrfam: only IPv4");
      *port = static_cast<uint16_t>(v);
    }
    if (!l.ok()) a.fail("listen_address: " + l.error().message.substr(20));
  };
  rpc_.add("nvmf_subsystem_add_listener", [this, listener](const Json& p, Json* r) {
    Params a(p, {"nqn", "listen_address", "tgt_name", "secure_channel"});
    std::string nqn = a.str("nqn", "", true), tr, addr;
    uint16_t port = 0;
    listener(a, a.object("listen_address", true), &tr, &addr, &port);
    if (!a.ok()) return a.error();
    if (tr == "TCP") {
      if (!tcp_transport_)
        return RpcError{-EINVAL, "create the TCP transport first (nvmf_create_transport)"};
      if (Status st = target_->add_listener(nqn, addr, port); !st.ok())
        return from_status(st, "listener " + addr + ":" + std::to_string(port));
    } else {
      // As SPDK: traddr is a directory; the function's socket is traddr/cntrl.
      if (!vfiouser_transport_)
        return RpcError{-EINVAL, "create the VFIOUSER transport first (nvmf_create_transport)"};
      std::error_code ec;
      std::filesystem::create_directories(addr, ec);
      Json out;
      if (RpcError e = make_function(nqn, addr + "/cntrl", "", &out); !e.ok()) return e;
    }
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_subsystem_remove_listener", [this, listener](const Json& p, Json* r) {
    Params a(p, {"nqn", "listen_address", "tgt_name"});
    std::string nqn = a.str("nqn", "", true), tr, addr;
    uint16_t port = 0;
    listener(a, a.object("listen_address", true), &tr, &addr, &port);
    if (!a.ok()) return a.error();
    if (tr == "TCP") {
      if (Status st = target_->remove_listener(nqn, addr, port); !st.ok())
        return from_status(st, "listener " + addr + ":" + std::to_string(port));
    } else {
      auto it = std::find_if(functions_.begin(), functions_.end(), [&](const Function& f) {
        return f.nqn == nqn && f.socket_path == addr + "/cntrl";
      });
      if (it == functions_.end()) return RpcError{-ENODEV, "listener " + addr + ": not found"};
      std::string id = it->id;
      (void)target_->run_on_poller([&] { return emu_->destroy_function(id); });
      functions_.erase(it);
    }
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_subsystem_add_ns", [this](const Json& p, Json* r) {
    Params a(p, {"nqn", "namespace", "tgt_name"});
    std::string nqn = a.str("nqn", "", true);
    const Json* ns = a.object("namespace", true);
    std::string bdev;
    uint32_t nsid = 0;
    if (a.ok()) {
      Params n(*ns, {"bdev_name", "nsid", "uuid", "nguid", "eui64"});
      bdev = n.str("bdev_name", "", true);
      nsid = static_cast<uint32_t>(n.num("nsid", 0, false, 0, ControllerCore::kMaxNamespaces));
      if (!n.ok()) a.fail("namespace: " + n.error().message.substr(20));
    }
    if (!a.ok()) return a.error();
    auto it = bdevs_.find(bdev);
    if (it == bdevs_.end()) return RpcError{-ENODEV, "bdev " + bdev + ": not found"};
    uint32_t got = 0;
    Status st = target_->add_namespace(nqn, it->second, nsid, &got);
    if (st == Code::kNotPermitted)
      return RpcError{-EEXIST, "bdev " + bdev + " is already a namespace of " + nqn};
    if (!st.ok())
      return from_status(
          st, st.code() == Code::kBadState ? "nsid " + std::to_string(nsid) : "subsystem " + nqn);
    *r = got;
    return RpcError{};
  });
  rpc_.add("nvmf_subsystem_remove_ns", [this](const Json& p, Json* r) {
    Params a(p, {"nqn", "nsid", "tgt_name"});
    std::string nqn = a.str("nqn", "", true);
    uint32_t nsid =
        static_cast<uint32_t>(a.num("nsid", 0, true, 1, ControllerCore::kMaxNamespaces));
    if (!a.ok()) return a.error();
    if (Status st = target_->remove_namespace(nqn, nsid); !st.ok())
      return from_status(st, "namespace " + std::to_string(nsid) + " of " + nqn);
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_subsystem_add_host", [this](const Json& p, Json* r) {
    Params a(p, {"nqn", "host", "tgt_name"});
    std::string nqn = a.str("nqn", "", true), host = a.str("host", "", true);
    if (!a.ok()) return a.error();
    if (Status st = target_->add_host(nqn, host); !st.ok()) return from_status(st, "host " + host);
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_subsystem_remove_host", [this](const Json& p, Json* r) {
    Params a(p, {"nqn", "host", "tgt_name"});
    std::string nqn = a.str("nqn", "", true), host = a.str("host", "", true);
    if (!a.ok()) return a.error();
    if (Status st = target_->remove_host(nqn, host); !st.ok())
      return from_status(st, "host " + host);
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_get_stats", [this](const Json& p, Json* r) {
    Params a(p, {"tgt_name"});
    if (!a.ok()) return a.error();
    TargetStats s = target_->stats();
    Json fns = Json::array();
    std::vector<FunctionInfo> infos;
    (void)target_->run_on_poller([&] {
      infos = emu_->list_functions();
      return Status(Code::kSuccess);
    });
    for (const auto& f : infos)
      fns.push_back(Json{{"id", f.id},
                         {"io_commands", f.stats.io_commands},
                         {"admin_commands", f.stats.admin_commands},
                         {"errors", f.stats.errors},
                         {"interrupts", f.stats.interrupts}});
    *r = Json{
        {"poll_groups",
         Json::array({Json{
             {"name", "nvmf_tgt_poll_group_000"},
             {"transports", Json::array({Json{{"trtype", "TCP"},
                                              {"connections", s.connections},
                                              {"active_connections", s.active_connections},
                                              {"pdus_in", s.pdus_in},
                                              {"pdus_out", s.pdus_out},
                                              {"commands", s.commands},
                                              {"errors", s.errors},
                                              {"term_reqs_sent", s.term_reqs_sent},
                                              {"connect_rejects", s.connect_rejects},
                                              {"keep_alive_expiries", s.keep_alive_expiries}},
                                         Json{{"trtype", "VFIOUSER"}, {"functions", fns}}})}}})}};
    return RpcError{};
  });

  // ---- the emulation manager (the BlueField application's nvmf_doca_* methods) ----
  rpc_.add("nvmf_doca_get_managers", [this](const Json& p, Json* r) {
    Params a(p, {});
    if (!a.ok()) return a.error();
    *r = Json::array(
        {Json{{"name", "vfio-user"},
              {"description", "emulated PCIe NVMe functions served over vfio-user sockets"},
              {"functions", functions_.size()}}});
    return RpcError{};
  });
  rpc_.add("nvmf_doca_create_function", [this](const Json& p, Json* r) {
    Params a(p, {"manager", "nqn", "socket_path", "id"});
    std::string mgr = a.str("manager", "vfio-user");
    std::string nqn = a.str("nqn", "", true);
    std::string path = a.str(
        "socket_path", "/var/tmp/dpukv-vfio-user-" + std::to_string(functions_.size()) + ".sock");
    std::string want = a.str("id");
    if (a.ok() && mgr != "vfio-user")
      a.fail("manager must be vfio-user (see nvmf_doca_get_managers)");
    if (a.ok() && (path.empty() || path.size() > 100))
      a.fail("socket_path must be 1-100 characters");
    if (!a.ok()) return a.error();
    return make_function(nqn, path, want, r);
  });
  rpc_.add("nvmf_doca_destroy_function", [this](const Json& p, Json* r) {
    Params a(p, {"id", "manager"});
    std::string id = a.str("id", "", true);
    if (!a.ok()) return a.error();
    auto it = std::find_if(functions_.begin(), functions_.end(),
                           [&](const Function& f) { return f.id == id; });
    if (it == functions_.end()) return RpcError{-ENODEV, "function " + id + ": not found"};
    Status st = target_->run_on_poller([&] { return emu_->destroy_function(id); });
    functions_.erase(it);
    if (!st.ok()) return from_status(st, "function " + id);
    *r = true;
    return RpcError{};
  });
  rpc_.add("nvmf_doca_list_functions", [this](const Json& p, Json* r) {
    Params a(p, {"manager"});
    if (!a.ok()) return a.error();
    std::vector<FunctionInfo> infos;
    (void)target_->run_on_poller([&] {
      infos = emu_->list_functions();
      return Status(Code::kSuccess);
    });
    *r = Json::array();
    for (const auto& f : infos) {
      std::string nqn;
      for (const auto& x : functions_)
        if (x.id == f.id) nqn = x.nqn;
      r->push_back(Json{{"id", f.id},
                        {"manager", "vfio-user"},
                        {"socket_path", f.socket_path},
                        {"state", hotplug_state_name(f.state)},
                        {"nqn", nqn},
                        {"client_connected", f.client_connected},
                        {"io_queues", f.io_queues}});
    }
    return RpcError{};
  });
}

}  // namespace dpukv::nvme
