#include "nvmf/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "nvmf/tcp/tcp_connection.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv::nvme {

struct TcpTransport::Listener final : PollWatcher {
  explicit Listener(TcpTransport* t) : PollWatcher(&readable), transport(t) {}
  static int readable(PollWatcher* self, uint32_t) {
    auto* l = static_cast<Listener*>(self);
    return l->transport->accept_on(l);
  }
  TcpTransport* transport;
  std::string key;  // "tcp:ADDR:PORT"
  int fd = -1;
  uint16_t port = 0;
  uint32_t connections = 0;      // open connections it accepted
  uint64_t paused_until_ms = 0;  // out of descriptors: not watched until then (0: watched)
};

TcpTransport::TcpTransport(TargetSide* target, PollGroup* group, const TcpTransportOptions& o)
    : target_(target), group_(group), opts_(o) {}

TcpTransport::~TcpTransport() {
  for (auto& l : listeners_) ::close(l->fd);
}

Status TcpTransport::set_options(const TcpTransportOptions& o) {
  if (!listeners_.empty()) return Code::kBadState;
  const int cpu = opts_.cpu;  // the poll group is pinned already
  opts_ = o;
  opts_.cpu = cpu;
  return Code::kSuccess;
}

int TcpTransport::accept_on(Listener* l) {
  for (;;) {
    int fd = accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays in the backlog and the listener readable:
        // watched, it would wake the poll group at once, forever. Not watched for
        // 100 ms instead, as SPDK's acceptor polls again later; the hosts retry.
        ++target_->counters().accept_errors;
        if (l->paused_until_ms == 0)
          LOG_WARN_LIMITED("nvme-tcp: %s: accept: %s; not accepting for 100 ms", l->key.c_str(),
                           std::strerror(errno));
        group_->rewatch(l->fd, 0, l);
        l->paused_until_ms = monotonic_ms() + 100;
      }
      return 1;
    }
    TargetStats& st = target_->counters();
    if (l->connections >= opts_.max_connections_per_listener) {
      if (st.connections_refused++ % 1024 == 0)
        LOG_WARN_LIMITED("nvme-tcp: %s: %u connections open, closing a new one (%llu so far)",
                         l->key.c_str(), l->connections,
                         static_cast<unsigned long long>(st.connections_refused));
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // A queue of 128 reads of 128 KiB answers 16 MiB at once; start with room for
    // a busy pass instead of waiting for autotuning.
    int sndbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    auto c = std::make_unique<TcpConnection>(target_, &opts_, group_->epoll_fd(), fd, l->key);
    group_->watch(fd, EPOLLIN, c.get());
    conns_.push_back(std::move(c));
    ++l->connections;
    ++st.connections;
    st.active_connections = conns_.size();
  }
}

TcpTransport::Listener* TcpTransport::listener_of(const TcpConnection& c) {
  for (auto& l : listeners_)
    if (l->key == c.listener()) return l.get();
  return nullptr;
}

int TcpTransport::poll() {
  int work = 0;
  bool closed_any = false;
  for (auto& c : conns_) {
    if (c->has_output()) {
      c->flush();
      ++work;  // a full socket buffer is work pending: do not fall asleep on it
    }
    closed_any |= c->closed();
  }
  if (closed_any) reap_closed();
  return work;
}

// Connections that closed leave once their requests are back. A controller whose
// admin queue closed closes its other queues; the target lets it go with its last.
void TcpTransport::reap_closed() {
  for (auto& c : conns_)
    if (c->closed() && c->qid() == 0 && c->controller() != nullptr)
      c->controller()->close_queues("admin queue closed");
  for (size_t i = 0; i < conns_.size();) {
    TcpConnection* c = conns_[i].get();
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
    if (ctrl != nullptr) target_->release_queue(ctrl, c->qid());
    if (Listener* l = listener_of(*c); l != nullptr && l->connections > 0) --l->connections;
    conns_.erase(conns_.begin() + static_cast<long>(i));
  }
  target_->counters().active_connections = conns_.size();
}

void TcpTransport::tick(uint64_t now_ms) {
  for (auto& l : listeners_) {
    if (l->paused_until_ms == 0 || now_ms < l->paused_until_ms) continue;
    l->paused_until_ms = 0;
    group_->rewatch(l->fd, EPOLLIN, l.get());
  }
  // Every stage a host can stall at has a deadline: its ICReq, its Connect, the
  // rest of a PDU whose header came. Closed connections are logged once a window.
  TargetStats& st = target_->counters();
  for (auto& c : conns_) {
    if (c->closed()) continue;
    const char* why = nullptr;
    if (!c->ready()) {
      if (now_ms - c->opened_ms() >= opts_.icreq_timeout_ms)
        ++st.icreq_timeouts, why = "no ICReq in time";
    } else if (c->controller() == nullptr && now_ms - c->ready_ms() >= opts_.connect_timeout_ms) {
      ++st.connect_timeouts, why = "no Connect in time after the ICReq";
    }
    if (why == nullptr && c->partial_since_ms() != 0 &&
        now_ms - c->partial_since_ms() >= opts_.pdu_timeout_ms) {
      ++st.pdu_timeouts, why = "the rest of a PDU did not come in time";
    }
    if (why == nullptr) continue;
    LOG_WARN_LIMITED("nvme-tcp: %s: closing a connection: %s", c->listener().c_str(), why);
    c->close(why);
  }
}

void TcpTransport::shutdown() {
  for (auto& c : conns_) c->close("target stopping");
}

Status TcpTransport::listen(const std::string& addr, uint16_t port, std::string* key,
                            uint16_t* bound_port) {
  in_addr ia{};
  if (inet_pton(AF_INET, addr.c_str(), &ia) != 1) return Code::kInvalidValue;
  const std::string want = "tcp:" + addr + ":" + std::to_string(port);
  for (auto& l : listeners_)
    if (l->key == want) {
      *key = l->key;
      if (bound_port != nullptr) *bound_port = l->port;
      return Code::kSuccess;
    }
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
  auto l = std::make_unique<Listener>(this);
  l->fd = fd;
  l->port = ntohs(sa.sin_port);
  l->key = "tcp:" + addr + ":" + std::to_string(l->port);
  group_->watch(fd, EPOLLIN, l.get());
  LOG_INFO("nvme-tcp: listening on %s:%u", addr.c_str(), l->port);
  *key = l->key;
  if (bound_port != nullptr) *bound_port = l->port;
  listeners_.push_back(std::move(l));
  return Code::kSuccess;
}

void TcpTransport::stop_listen(const std::string& key) {
  for (size_t i = 0; i < listeners_.size(); ++i)
    if (listeners_[i]->key == key) {
      group_->unwatch(listeners_[i]->fd);
      ::close(listeners_[i]->fd);
      listeners_.erase(listeners_.begin() + static_cast<long>(i));
      return;
    }
}

uint16_t TcpTransport::port_id(const std::string& key) const {
  for (size_t i = 0; i < listeners_.size(); ++i)
    if (listeners_[i]->key == key) return static_cast<uint16_t>(i + 1);
  return 0;
}

}  // namespace dpukv::nvme
