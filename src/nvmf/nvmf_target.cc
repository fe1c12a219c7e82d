// NvmfTarget: the poll group and the configuration calls (subsystems, hosts,
// namespaces, listeners), each run on the poll thread.
#include <arpa/inet.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "nvme/tcp_wire.h"
#include "nvmf/nvmf_target.h"
#include "nvmf/target_internal.h"
#include "nvmf/tcp/tcp_connection.h"
#include "runtime/call_queue.h"
#include "runtime/clock.h"
#include "runtime/crc32c.h"
#include "runtime/log.h"

namespace dpukv::nvme {

using namespace tcp;

// ---- the poll group ----------------------------------------------------------

void NvmfTarget::Impl::accept_on(Listener* l) {
  for (;;) {
    int fd = accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays in the backlog and the listener readable:
        // watched, it would wake the poll group at once, forever. Not watched for
        // 100 ms instead, as SPDK's acceptor polls again later; the hosts retry.
        ++stats.accept_errors;
        if (l->paused_until_ms == 0)
          LOG_WARN_LIMITED("nvme-tcp: %s: accept: %s; not accepting for 100 ms", l->key.c_str(),
                           std::strerror(errno));
        epoll_event ev{};
        ev.data.ptr = static_cast<PollWatcher*>(l);
        epoll_ctl(epfd, EPOLL_CTL_MOD, l->fd, &ev);
        l->paused_until_ms = monotonic_ms() + 100;
      }
      return;
    }
    if (l->connections >= opts.max_connections_per_listener) {
      if (stats.connections_refused++ % 1024 == 0)
        LOG_WARN_LIMITED("nvme-tcp: %s: %u connections open, closing a new one (%llu so far)",
                         l->key.c_str(), l->connections,
                         static_cast<unsigned long long>(stats.connections_refused));
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // A queue of 128 reads of 128 KiB answers 16 MiB at once; start with room for
    // a busy pass instead of waiting for autotuning.
    int sndbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    auto c = std::make_unique<TcpConnection>(this, &opts, epfd, fd, l->key);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = static_cast<PollWatcher*>(c.get());
    epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
    conns.push_back(std::move(c));
    ++l->connections;
    ++stats.connections;
    stats.active_connections = conns.size();
  }
}

Listener* NvmfTarget::Impl::listener_of(const TcpConnection& c) {
  for (auto& l : listeners)
    if (l->key == c.listener()) return l.get();
  return nullptr;
}

void NvmfTarget::Impl::check_deadlines(uint64_t now_ms) {
  for (auto& l : listeners) {
    if (l->paused_until_ms == 0 || now_ms < l->paused_until_ms) continue;
    l->paused_until_ms = 0;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = static_cast<PollWatcher*>(l.get());
    epoll_ctl(epfd, EPOLL_CTL_MOD, l->fd, &ev);
  }
  // Every stage a host can stall at has a deadline: its ICReq, its Connect, the
  // rest of a PDU whose header came. Closed connections are logged once a window.
  for (auto& c : conns) {
    if (c->closed()) continue;
    const char* why = nullptr;
    if (!c->ready()) {
      if (now_ms - c->opened_ms() >= opts.icreq_timeout_ms)
        ++stats.icreq_timeouts, why = "no ICReq in time";
    } else if (c->controller() == nullptr && now_ms - c->ready_ms() >= opts.connect_timeout_ms) {
      ++stats.connect_timeouts, why = "no Connect in time after the ICReq";
    }
    if (why == nullptr && c->partial_since_ms() != 0 &&
        now_ms - c->partial_since_ms() >= opts.pdu_timeout_ms) {
      ++stats.pdu_timeouts, why = "the rest of a PDU did not come in time";
    }
    if (why == nullptr) continue;
    LOG_WARN_LIMITED("nvme-tcp: %s: closing a connection: %s", c->listener().c_str(), why);
    c->close(why);
  }
}

void NvmfTarget::Impl::close_controller(FabricsController* c, const char* why) {
  for (ControllerCore::QueueTransport* q : c->queues)
    if (q != nullptr) q->close(why);
}

// Connections that closed leave once their requests are back; a controller leaves
// with its admin queue.
void NvmfTarget::Impl::reap_closed() {
  each_subsystem([&](Subsystem& s) {
    for (auto& c : s.controllers) {
      ControllerCore::QueueTransport* admin = c->queues.empty() ? nullptr : c->queues[0];
      if (admin != nullptr && admin->closed()) close_controller(c.get(), "admin queue closed");
    }
  });
  for (size_t i = 0; i < conns.size();) {
    TcpConnection* c = conns[i].get();
    if (!c->closed()) {
      ++i;
      continue;
    }
    FabricsController* ctrl = c->controller();
    if (ctrl != nullptr) ctrl->poll_bdevs();
    if (!c->idle()) {
      ++i;
      continue;
    }
    if (ctrl != nullptr) {
      ctrl->queues[c->qid()] = nullptr;
      bool empty = std::all_of(ctrl->queues.begin(), ctrl->queues.end(),
                               [](ControllerCore::QueueTransport* q) { return q == nullptr; });
      if (empty) {
        Subsystem* s = ctrl->subsys;
        std::erase_if(s->controllers,
                      [&](const std::unique_ptr<FabricsController>& x) { return x.get() == ctrl; });
      }
    }
    if (Listener* l = listener_of(*c); l != nullptr && l->connections > 0) --l->connections;
    conns.erase(conns.begin() + static_cast<long>(i));
  }
  stats.active_connections = conns.size();
}

void NvmfTarget::Impl::run() {
  if (opts.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(opts.cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  uint64_t last_work = monotonic_us(), last_ka_check = monotonic_ms();
  epoll_event evs[64];
  while (!stop.load(std::memory_order_relaxed)) {
    bool idle = monotonic_us() - last_work > 2000;
    int n = epoll_wait(epfd, evs, 64, idle ? 1 : 0);
    int work = 0;
    for (int i = 0; i < n; ++i) {
      auto* w = static_cast<PollWatcher*>(evs[i].data.ptr);  // every entry is one (poll_watcher.h)
      switch (w->kind) {
        case PollWatcher::Kind::kWake: {
          uint64_t v;
          (void)::read(wake_fd, &v, sizeof v);
          break;
        }
        case PollWatcher::Kind::kListener:
          accept_on(static_cast<Listener*>(w));
          ++work;
          break;
        case PollWatcher::Kind::kConnection:
          work += static_cast<TcpConnection*>(w)->on_readable();
          break;
      }
    }
    each_subsystem([&](Subsystem& s) {
      for (auto& c : s.controllers) work += c->poll_bdevs();
    });
    if (emu != nullptr) work += emu->poll_once();
    bool closed_any = false;
    for (auto& c : conns) {
      if (c->has_output()) {
        c->flush();
        ++work;  // a full socket buffer is work pending: do not fall asleep on it
      }
      closed_any |= c->closed();
    }
    if (closed_any) reap_closed();
    if (work > 0) last_work = monotonic_us();
    uint64_t ms = monotonic_ms();
    if (ms - last_ka_check >= 100) {
      last_ka_check = ms;
      check_deadlines(ms);
      each_subsystem([&](Subsystem& s) {
        for (auto& c : s.controllers) {
          // 64-bit: a KATO near 2^32 ms plus the grace wrapped in 32 bits and ended
          // the association at once. KATO 0 (no keep alive) still ends an idle one.
          const uint32_t kato = c->keep_alive_timeout_ms();
          const uint64_t limit = kato > 0 ? uint64_t{kato} + opts.keep_alive_grace_ms
                                          : uint64_t{opts.no_kato_timeout_ms};
          if (ms - c->last_activity_ms > limit) {
            LOG_WARN_LIMITED("nvme-tcp: controller %u of %s: %s (%llu ms without a command)",
                             c->config().cntlid, s.cfg.nqn.c_str(),
                             kato > 0 ? "keep alive timeout" : "idle with no keep alive (KATO 0)",
                             static_cast<unsigned long long>(limit));
            ++stats.keep_alive_expiries;
            c->last_activity_ms = ms;  // once
            close_controller(c.get(), "keep alive timeout");
          }
        }
      });
    }
    if (calls.run_pending()) last_work = monotonic_us();
  }
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
      uint16_t portid = 0;
      for (size_t i = 0; i < listeners.size(); ++i)
        if (listeners[i]->key == key) portid = static_cast<uint16_t>(i + 1);
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
  m->opts = o;
  m->epfd = epoll_create1(EPOLL_CLOEXEC);
  m->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (m->epfd < 0 || m->wake_fd < 0) return Code::kDriver;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = static_cast<PollWatcher*>(&m->wake_watcher);
  epoll_ctl(m->epfd, EPOLL_CTL_ADD, m->wake_fd, &ev);
  m->calls.set_wake_fd(m->wake_fd);
  m->thread = std::thread([m] { m->run(); });
  *out = std::move(t);
  return Code::kSuccess;
}

NvmfTarget::~NvmfTarget() {
  if (!impl_) return;
  impl_->stop.store(true);
  uint64_t one = 1;
  (void)::write(impl_->wake_fd, &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& c : impl_->conns) c->close("target stopping");
  for (auto& s : impl_->subsystems)
    for (auto& c : s.second->controllers) c->drain_inflight();
  impl_->conns.clear();
  impl_->subsystems.clear();
  for (auto& l : impl_->listeners) ::close(l->fd);
  ::close(impl_->epfd);
  ::close(impl_->wake_fd);
}

Status NvmfTarget::call(std::function<Status()> fn) {
  return impl_->calls.call(std::move(fn));
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
    if (!impl_->listeners.empty()) return Code::kBadState;
    int cpu = impl_->opts.cpu;
    impl_->opts = o;
    impl_->opts.cpu = cpu;
    opts_ = impl_->opts;
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
    for (auto& c : s->controllers) impl_->close_controller(c.get(), "subsystem deleted");
    // Connections finish their requests before the subsystem's memory goes.
    while (!s->controllers.empty()) impl_->reap_closed();
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
      if (c->hostnqn == hostnqn && !s->cfg.allow_any_host)
        impl_->close_controller(c.get(), "host removed");
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
  in_addr ia{};
  if (inet_pton(AF_INET, addr.c_str(), &ia) != 1) return Code::kInvalidValue;
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    Listener* l = nullptr;
    for (auto& x : impl_->listeners)
      if (x->key == "tcp:" + addr + ":" + std::to_string(port) || (port == 0 && false)) l = x.get();
    if (l == nullptr) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return Code::kDriver;
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(port);
      sa.sin_addr = ia;
      if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 64) != 0) {
        LOG_ERR("nvme-tcp: cannot listen on %s:%u: %s", addr.c_str(), port, strerror(errno));
        ::close(fd);
        return Code::kIoFailed;
      }
      socklen_t sl = sizeof sa;
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &sl);
      auto nl = std::make_unique<Listener>();
      nl->fd = fd;
      nl->port = ntohs(sa.sin_port);
      nl->key = "tcp:" + addr + ":" + std::to_string(nl->port);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = static_cast<PollWatcher*>(nl.get());
      epoll_ctl(impl_->epfd, EPOLL_CTL_ADD, fd, &ev);
      l = nl.get();
      impl_->listeners.push_back(std::move(nl));
      LOG_INFO("nvme-tcp: listening on %s:%u", addr.c_str(), l->port);
    }
    if (std::find(s->listeners.begin(), s->listeners.end(), l->key) != s->listeners.end())
      return Code::kBadState;
    s->listeners.push_back(l->key);
    if (bound_port != nullptr) *bound_port = l->port;
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
    if (!used)
      for (size_t i = 0; i < impl_->listeners.size(); ++i)
        if (impl_->listeners[i]->key == key) {
          epoll_ctl(impl_->epfd, EPOLL_CTL_DEL, impl_->listeners[i]->fd, nullptr);
          ::close(impl_->listeners[i]->fd);
          impl_->listeners.erase(impl_->listeners.begin() + static_cast<long>(i));
          break;
        }
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

void NvmfTarget::attach_emulation(EmulationManager* m) {
  (void)call([&]() -> Status {
    impl_->emu = m;
    return Code::kSuccess;
  });
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
