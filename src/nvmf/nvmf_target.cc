// NvmfTarget: the controllers' poller, the discovery log, and the configuration
// calls (subsystems, hosts, namespaces, listeners), each run on the poll thread.
#include "nvmf/nvmf_target.h"

#include <algorithm>
#include <cstring>

#include "nvme/tcp_wire.h"
#include "nvmf/target_internal.h"
#include "runtime/log.h"

namespace dpukv::nvme {

using namespace tcp;

// ---- the controllers' poller ----------------------------------------------------

int NvmfTarget::Impl::poll() {
  int work = 0;
  each_subsystem([&](Subsystem& s) {
    for (auto& c : s.controllers) work += c->poll_bdevs();
  });
  return work;
}

void NvmfTarget::Impl::tick(uint64_t ms) {
  const TcpTransportOptions& o = tcp->options();
  each_subsystem([&](Subsystem& s) {
    for (auto& c : s.controllers) {
      // 64-bit: a KATO near 2^32 ms plus the grace wrapped in 32 bits and ended
      // the association at once. KATO 0 (no keep alive) still ends an idle one.
      const uint32_t kato = c->keep_alive_timeout_ms();
      const uint64_t limit =
          kato > 0 ? uint64_t{kato} + o.keep_alive_grace_ms : uint64_t{o.no_kato_timeout_ms};
      if (ms - c->last_activity_ms > limit) {
        LOG_WARN_LIMITED("nvme-tcp: controller %u of %s: %s (%llu ms without a command)",
                         c->config().cntlid, s.cfg.nqn.c_str(),
                         kato > 0 ? "keep alive timeout" : "idle with no keep alive (KATO 0)",
                         static_cast<unsigned long long>(limit));
        ++stats.keep_alive_expiries;
        c->last_activity_ms = ms;  // once
        c->close_queues("keep alive timeout");
      }
    }
  });
}

void NvmfTarget::Impl::release_queue(FabricsController* ctrl, uint16_t qid) {
  ctrl->queues[qid] = nullptr;
  const bool empty = std::all_of(ctrl->queues.begin(), ctrl->queues.end(),
                                 [](ControllerCore::QueueTransport* q) { return q == nullptr; });
  if (!empty) return;
  Subsystem* s = ctrl->subsys;
  std::erase_if(s->controllers,
                [&](const std::unique_ptr<FabricsController>& x) { return x.get() == ctrl; });
}

void NvmfTarget::Impl::reap_controllers_of(Subsystem* s) {
  while (!s->controllers.empty())
    for (auto& t : transports) t->poll();
}

// ---- discovery ------------------------------------------------------------------

Subsystem NvmfTarget::Impl::make_discovery() {
  Subsystem d;
  d.discovery = true;
  d.cfg.nqn = kDiscoveryNqn;
  d.cfg.serial = "DPUKVDISCOVERY";
  d.cfg.model = "dpukv discovery controller";
  d.cfg.allow_any_host = true;
  return d;
}

void NvmfTarget::Impl::discovery_changed() {
  ++discovery_genctr;
  for (auto& c : discovery.controllers) c->discovery_log_changed();
}

// NVMe over Fabrics' discovery log: a 1024-byte header (GENCTR, NUMREC, RECFMT)
// and a 1024-byte entry per transport address of each subsystem the host may
// reach. Addresses and service ids are space padded, NQNs NUL padded.
std::vector<uint8_t> NvmfTarget::Impl::discovery_log(const std::string& hostnqn) const {
  std::vector<uint8_t> log(1024, 0);
  uint64_t n = 0;
  for (const auto& [nqn, s] : subsystems) {
    if (!s->host_allowed(hostnqn)) continue;
    for (const std::string& key : s->listeners) {
      // key: "tcp:ADDR:PORT"
      const size_t colon = key.rfind(':');
      const std::string addr = key.substr(4, colon - 4), port = key.substr(colon + 1);
      const uint16_t portid = tcp->port_id(key);
      log.resize(log.size() + 1024, 0);
      uint8_t* e = log.data() + log.size() - 1024;
      e[0] = 3;              // TRTYPE: TCP
      e[1] = 1;              // ADRFAM: IPv4
      e[2] = 2;              // SUBTYPE: an NVM subsystem
      e[3] = 2 | 1u << 2;    // TREQ: secure channel not required; SQ flow control may be off
      put16(e + 4, portid);  // PORTID
      put16(e + 6, 0xffff);  // CNTLID: dynamic controllers
      put16(e + 8, 128);     // ASQSZ: the largest admin queue a Connect may ask
      std::memset(e + 32, ' ', 32);
      std::memcpy(e + 32, port.data(), std::min<size_t>(port.size(), 32));
      std::memcpy(e + 256, nqn.data(), std::min<size_t>(nqn.size(), 255));
      std::memset(e + 512, ' ', 256);
      std::memcpy(e + 512, addr.data(), std::min<size_t>(addr.size(), 256));
      // TSAS (768): SECTYPE 0, no security (1 and 2 would announce TLS).
      ++n;
    }
  }
  put64(&log[0], discovery_genctr);
  put64(&log[8], n);
  put16(&log[16], 0);  // RECFMT
  return log;
}

// ---- configuration ------------------------------------------------------------

namespace {
bool valid_tcp_options(const TcpTransportOptions& o) {
  return o.max_h2c_data >= 4096 && o.max_h2c_data % 4 == 0 && o.max_io_size >= 4096 &&
         (o.max_io_size & (o.max_io_size - 1)) == 0 && o.max_io_size <= (1u << 20) &&
         o.max_queue_depth >= 2 && o.max_queue_depth <= 1024 && o.max_io_queues >= 1 &&
         o.max_io_queues <= 64 && o.in_capsule_data_size <= 128 * 1024 &&
         o.in_capsule_data_size % 16 == 0 && o.icreq_timeout_ms > 0 &&
         o.max_connections_per_listener > 0;
}
}  // namespace

Status NvmfTarget::create(const TcpTransportOptions& o, std::unique_ptr<NvmfTarget>* out) {
  if (!valid_tcp_options(o)) return Code::kInvalidValue;
  std::unique_ptr<NvmfTarget> t(new NvmfTarget());
  t->opts_ = o;
  t->impl_ = std::make_unique<Impl>();
  Impl* m = t->impl_.get();
  auto tcp = std::make_unique<TcpTransport>(m, &m->group, o);
  m->tcp = tcp.get();
  m->transports.push_back(std::move(tcp));
  m->group.add_poller(m);  // the controllers' completions first, then the queues'
  m->group.add_poller(m->tcp);
  if (Status st = m->group.start(o.cpu); !st.ok()) return st;
  *out = std::move(t);
  return Code::kSuccess;
}

NvmfTarget::~NvmfTarget() {
  if (!impl_) return;
  impl_->group.stop();
  for (auto& t : impl_->transports) t->shutdown();
  for (auto& s : impl_->subsystems)
    for (auto& c : s.second->controllers) c->drain_inflight();
  impl_->transports.clear();
  impl_->subsystems.clear();
}

Status NvmfTarget::call(std::function<Status()> fn) {
  return impl_->group.call(std::move(fn));
}

namespace {
bool valid_nqn(const std::string& n) {
  return n.size() >= 5 && n.size() <= 223 && n.rfind("nqn.", 0) == 0 &&
         std::all_of(n.begin(), n.end(), [](char ch) { return ch > 0x20 && ch < 0x7f; });
}
}  // namespace

Status NvmfTarget::set_tcp_options(const TcpTransportOptions& o) {
  if (!valid_tcp_options(o)) return Code::kInvalidValue;
  return call([&]() -> Status {
    DPUKV_RETURN_IF_ERROR(impl_->tcp->set_options(o));
    opts_ = impl_->tcp->options();
    return Code::kSuccess;
  });
}

Status NvmfTarget::create_subsystem(const SubsystemConfig& c) {
  if (!valid_nqn(c.nqn) || c.nqn == kDiscoveryNqn || c.serial.empty() || c.serial.size() > 20 ||
      c.model.size() > 40)
    return Code::kInvalidValue;
  for (const auto& h : c.hosts)
    if (!valid_nqn(h)) return Code::kInvalidValue;
  return call([&]() -> Status {
    if (impl_->subsystems.count(c.nqn)) return Code::kBadState;
    auto s = std::make_unique<Subsystem>();
    s->cfg = c;
    impl_->subsystems[c.nqn] = std::move(s);
    impl_->discovery_changed();
    return Code::kSuccess;
  });
}

Status NvmfTarget::delete_subsystem(const std::string& nqn) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    for (auto& c : s->controllers) c->close_queues("subsystem deleted");
    // Connections finish their requests before the subsystem's memory goes.
    impl_->reap_controllers_of(s);
    impl_->subsystems.erase(nqn);
    impl_->discovery_changed();
    return Code::kSuccess;
  });
}

Status NvmfTarget::add_host(const std::string& nqn, const std::string& hostnqn) {
  if (!valid_nqn(hostnqn)) return Code::kInvalidValue;
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    if (std::find(s->cfg.hosts.begin(), s->cfg.hosts.end(), hostnqn) != s->cfg.hosts.end())
      return Code::kBadState;
    s->cfg.hosts.push_back(hostnqn);
    impl_->discovery_changed();
    return Code::kSuccess;
  });
}

Status NvmfTarget::remove_host(const std::string& nqn, const std::string& hostnqn) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    auto it = std::find(s->cfg.hosts.begin(), s->cfg.hosts.end(), hostnqn);
    if (it == s->cfg.hosts.end()) return Code::kNotFound;
    s->cfg.hosts.erase(it);
    for (auto& c : s->controllers)
      if (c->hostnqn == hostnqn && !s->cfg.allow_any_host) c->close_queues("host removed");
    impl_->discovery_changed();
    return Code::kSuccess;
  });
}

Status NvmfTarget::add_namespace(const std::string& nqn, std::shared_ptr<Bdev> bdev,
                                 uint32_t nsid_hint, uint32_t* nsid) {
  if (!bdev || nsid_hint > ControllerCore::kMaxNamespaces) return Code::kInvalidValue;
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    uint32_t id = nsid_hint;
    if (id == 0)
      for (uint32_t i = 1;
           i <= std::min<uint32_t>(s->cfg.max_namespaces, NamespaceSet::kMax) && id == 0; ++i)
        if (!s->ns->ns[i]) id = i;
    // One bdev is at most one namespace of a subsystem: two would alias each other.
    for (uint32_t i = 1; i <= NamespaceSet::kMax; ++i)
      if (s->ns->ns[i] == bdev) return Code::kNotPermitted;
    if (id == 0) return Code::kFull;
    if (s->ns->ns[id]) return Code::kBadState;
    s->ns->ns[id] = bdev;
    ++s->ns->generation;
    *nsid = id;
    return Code::kSuccess;
  });
}

Status NvmfTarget::remove_namespace(const std::string& nqn, uint32_t nsid) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    if (nsid == 0 || nsid > NamespaceSet::kMax || !s->ns->ns[nsid]) return Code::kNotFound;
    for (auto& c : s->controllers) c->drain_inflight();
    s->ns->ns[nsid].reset();
    ++s->ns->generation;
    return Code::kSuccess;
  });
}

Status NvmfTarget::add_listener(const std::string& nqn, const std::string& addr, uint16_t port,
                                uint16_t* bound_port) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    std::string key;
    uint16_t bound = 0;
    DPUKV_RETURN_IF_ERROR(impl_->tcp->listen(addr, port, &key, &bound));
    if (std::find(s->listeners.begin(), s->listeners.end(), key) != s->listeners.end())
      return Code::kBadState;
    s->listeners.push_back(key);
    if (bound_port != nullptr) *bound_port = bound;
    impl_->discovery_changed();
    return Code::kSuccess;
  });
}

Status NvmfTarget::remove_listener(const std::string& nqn, const std::string& addr, uint16_t port) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    std::string key = "tcp:" + addr + ":" + std::to_string(port);
    auto it = std::find(s->listeners.begin(), s->listeners.end(), key);
    if (it == s->listeners.end()) return Code::kNotFound;
    s->listeners.erase(it);
    bool used = false;
    for (auto& x : impl_->subsystems)
      used |= std::find(x.second->listeners.begin(), x.second->listeners.end(), key) !=
              x.second->listeners.end();
    if (!used) impl_->tcp->stop_listen(key);
    impl_->discovery_changed();
    return Code::kSuccess;
  });
}

std::vector<SubsystemInfo> NvmfTarget::subsystems() {
  std::vector<SubsystemInfo> v;
  (void)call([&]() -> Status {
    for (auto& [nqn, s] : impl_->subsystems) {
      SubsystemInfo i{
          nqn,          s->cfg.serial, s->cfg.model, s->cfg.allow_any_host,
          s->cfg.hosts, s->listeners,  {},           static_cast<uint32_t>(s->controllers.size())};
      for (uint32_t id = 1; id <= NamespaceSet::kMax; ++id)
        if (s->ns->ns[id]) i.namespaces.emplace_back(id, s->ns->ns[id]->name());
      v.push_back(std::move(i));
    }
    return Code::kSuccess;
  });
  return v;
}

TargetStats NvmfTarget::stats() {
  TargetStats st;
  (void)call([&]() -> Status {
    st = impl_->stats;
    return Code::kSuccess;
  });
  return st;
}

Transport* NvmfTarget::add_transport(std::unique_ptr<Transport> t) {
  Transport* added = t.get();
  (void)call([&]() -> Status {
    impl_->group.add_poller(added);
    impl_->transports.push_back(std::move(t));
    return Code::kSuccess;
  });
  return added;
}

std::shared_ptr<NamespaceSet> NvmfTarget::namespace_set(const std::string& nqn) {
  std::shared_ptr<NamespaceSet> ns;
  (void)call([&]() -> Status {
    if (Subsystem* s = impl_->find_subsystem(nqn)) ns = s->ns;
    return Code::kSuccess;
  });
  return ns;
}

bool NvmfTarget::uses_bdev(const Bdev* b) {
  bool used = false;
  (void)call([&]() -> Status {
    for (auto& [nqn, s] : impl_->subsystems)
      for (const auto& n : s->ns->ns) used |= n.get() == b;
    return Code::kSuccess;
  });
  return used;
}

}  // namespace dpukv::nvme
