#include "agent/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

struct MetricsServer::Conn final : FdWatcher {
  MetricsServer* owner = nullptr;
  int fd = -1;
  uint32_t peer = 0;  // IPv4 address, network order
  uint64_t accepted = 0;
  uint64_t deadline = 0;
  std::string in, out;
  size_t sent = 0;
  bool writing = false;
  void on_fd_ready(uint32_t events) override { owner->on_conn(this, events); }
};

Status MetricsServer::create(ProgressEngine* pe, const std::string& address, int port,
                             std::function<std::string()> body,
                             std::unique_ptr<MetricsServer>* out) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->pe_ = pe;
  m->body_ = std::move(body);
  m->listener_.owner = m.get();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    LOG_ERR("metrics: '%s' is not an IPv4 address", address.c_str());
    return Code::kInvalidValue;
  }
  m->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (m->listen_fd_ < 0) return Code::kDriver;
  int one = 1;
  setsockopt(m->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(m->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(m->listen_fd_, 64) != 0) {
    const int err = errno;
    LOG_ERR("metrics: cannot listen on %s:%d: %s%s", address.c_str(), port, std::strerror(err),
            err == EADDRINUSE ? " (another agent? use --metrics-port N, or 0 for none)" : "");
    return err == EADDRINUSE ? Code::kBadState : Code::kDriver;
  }
  socklen_t len = sizeof(addr);
  getsockname(m->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  m->port_ = ntohs(addr.sin_port);
  DPUKV_RETURN_IF_ERROR(pe->watch_fd(m->listen_fd_, EPOLLIN, &m->listener_));
  *out = std::move(m);
  return Code::kSuccess;
}

MetricsServer::~MetricsServer() {
  for (auto& c : conns_) {
    pe_->unwatch_fd(c->fd, c.get());
    ::close(c->fd);
  }
  if (listen_fd_ >= 0) {
    if (port_ != 0) pe_->unwatch_fd(listen_fd_, &listener_);
    ::close(listen_fd_);
  }
}

bool MetricsServer::make_room(uint32_t peer) {
  size_t mine = 0;
  Conn* oldest_all = nullptr;
  Conn* oldest_mine = nullptr;
  for (auto& c : conns_) {
    if (c->peer == peer) ++mine;
    if (c->writing) continue;  // answered already: it leaves as fast as the peer reads
    if (oldest_all == nullptr || c->accepted < oldest_all->accepted) oldest_all = c.get();
    if (c->peer == peer && (oldest_mine == nullptr || c->accepted < oldest_mine->accepted))
      oldest_mine = c.get();
  }
  Conn* victim = mine >= kMaxPerPeer                ? oldest_mine
                 : conns_.size() >= kMaxConnections ? oldest_all
                                                    : nullptr;
  if (victim == nullptr) return mine < kMaxPerPeer && conns_.size() < kMaxConnections;
  ++counters_.evicted;
  close_conn(victim);
  return true;
}

void MetricsServer::accept_all() {
  for (;;) {
    sockaddr_in from{};
    socklen_t flen = sizeof(from);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &flen,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The listener would stay readable and wake the loop forever: rest it.
        LOG_WARN_LIMITED("metrics: accept: %s; not accepting for 100 ms", std::strerror(errno));
        (void)pe_->modify_fd(listen_fd_, 0, &listener_);
        paused_until_ns_ = monotonic_ns() + 100000000ull;
      }
      return;  // EAGAIN, or a connection that went away meanwhile
    }
    const uint32_t peer = from.sin_addr.s_addr;
    if (!make_room(peer)) {
      ++counters_.refused_busy;
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<Conn>();
    c->owner = this;
    c->fd = fd;
    c->peer = peer;
    c->accepted = monotonic_ns();
    c->deadline = c->accepted + kTimeoutNs;
    if (!pe_->watch_fd(fd, EPOLLIN, c.get()).ok()) {
      ::close(fd);
      continue;
    }
    conns_.push_back(std::move(c));
  }
}

void MetricsServer::on_conn(Conn* c, uint32_t events) {
  if (!c->writing) {
    char buf[1024];
    for (;;) {
      const ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c->in.append(buf, static_cast<size_t>(std::min<size_t>(static_cast<size_t>(n),
                                                               kMaxRequest - c->in.size())));
        if (c->in.find("\r\n\r\n") != std::string::npos ||
            c->in.find("\n\n") != std::string::npos || c->in.size() >= kMaxRequest)
          break;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;  // more later
      close_conn(c);  // closed, or an error, before a whole request
      return;
    }
    respond(c);
    return;
  }
  (void)events;
  while (c->sent < c->out.size()) {
    const ssize_t n = send(c->fd, c->out.data() + c->sent, c->out.size() - c->sent, MSG_NOSIGNAL);
    if (n > 0) {
      c->sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;  // EPOLLOUT brings us back
    break;
  }
  close_conn(c);
}

void MetricsServer::respond(Conn* c) {
  const bool complete =
      c->in.find("\r\n\r\n") != std::string::npos || c->in.find("\n\n") != std::string::npos;
  const bool metrics =
      complete && (c->in.rfind("GET /metrics ", 0) == 0 || c->in.rfind("GET /metrics\r", 0) == 0);
  std::string body;
  const char* status;
  if (!complete) {
    ++counters_.bad_requests;
    status = "400 Bad Request";
    body = "request too long\n";
  } else if (metrics) {
    ++counters_.served;
    status = "200 OK";
    body = body_();
  } else {
    ++counters_.not_found;
    status = "404 Not Found";
    body = "see /metrics\n";
  }
  c->out = std::string("HTTP/1.0 ") + status +
           "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  c->writing = true;
  if (!pe_->modify_fd(c->fd, EPOLLOUT, c).ok()) {
    close_conn(c);
    return;
  }
  on_conn(c, EPOLLOUT);
}

void MetricsServer::close_conn(Conn* c) {
  pe_->unwatch_fd(c->fd, c);
  ::close(c->fd);
  for (size_t i = 0; i < conns_.size(); ++i) {
    if (conns_[i].get() != c) continue;
    closed_.push_back(std::move(conns_[i]));
    conns_[i] = std::move(conns_.back());
    conns_.pop_back();
    break;
  }
}

void MetricsServer::sweep() {
  closed_.clear();
  const uint64_t now = monotonic_ns();
  if (paused_until_ns_ != 0 && now >= paused_until_ns_) {
    paused_until_ns_ = 0;
    (void)pe_->modify_fd(listen_fd_, EPOLLIN, &listener_);
  }
  for (size_t i = 0; i < conns_.size();) {
    if (now < conns_[i]->deadline) {
      ++i;
      continue;
    }
    ++counters_.timed_out;
    close_conn(conns_[i].get());  // moves the back into slot i
  }
  closed_.clear();
}

}  // namespace dpukv
