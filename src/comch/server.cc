#include "comch/server.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/log.h"

namespace dpukv {

using comch::MsgType;

Status make_unix_addr(const std::string& path, sockaddr_un* addr, socklen_t* len) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr->sun_path)) {
    LOG_ERR("comch: socket path '%s' is %s: a UNIX socket path holds at most %zu bytes",
            path.c_str(), path.empty() ? "empty" : "too long", sizeof(addr->sun_path) - 1);
    return Code::kInvalidValue;
  }
  std::memcpy(addr->sun_path, path.data(), path.size());
  if (path[0] == '@') addr->sun_path[0] = '\0';  // abstract namespace
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() +
                                (path[0] == '@' ? 0 : 1));
  return Code::kSuccess;
}

ComchServer::ComchServer(ProgressEngine* pe, const ComchServerOptions& opts)
    : ComchBase(pe, opts), sopts_(opts) {
  listener_.owner = this;
}

Status ComchServer::create(ProgressEngine* pe, const ComchServerOptions& opts,
                           std::unique_ptr<ComchServer>* out) {
  if (pe == nullptr || out == nullptr || opts.path.empty()) return Code::kInvalidValue;
  if (!opts.valid() || opts.max_connections == 0) return Code::kInvalidValue;
  out->reset(new ComchServer(pe, opts));
  return Code::kSuccess;
}

ComchServer::~ComchServer() {
  if (listener_.fd >= 0) {
    pe()->unwatch_fd(listener_.fd, &listener_);
    ::close(listener_.fd);
  }
}

Status ComchServer::do_start() {
  sockaddr_un addr;
  socklen_t alen;
  DPUKV_RETURN_IF_ERROR(make_unix_addr(sopts_.path, &addr, &alen));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Code::kDriver;
  if (sopts_.path[0] != '@') {
    // A socket file left by a dead server is replaced; a live server is not.
    struct stat st {};
    if (lstat(sopts_.path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        LOG_ERR("comch: %s exists and is not a socket", sopts_.path.c_str());
        ::close(fd);
        return Code::kNotPermitted;
      }
      int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      bool live = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), alen) == 0;
      if (probe >= 0) ::close(probe);
      if (live) {
        LOG_ERR("comch: another server is listening on %s", sopts_.path.c_str());
        ::close(fd);
        return Code::kBadState;
      }
      ::unlink(sopts_.path.c_str());
    }
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0) {
    LOG_ERR("comch: bind %s: %s", sopts_.path.c_str(), std::strerror(errno));
    ::close(fd);
    return errno == EADDRINUSE ? Code::kBadState : Code::kDriver;
  }
  if (sopts_.path[0] != '@' && chmod(sopts_.path.c_str(), sopts_.mode) != 0) {
    ::close(fd);
    return Code::kDriver;
  }
  if (listen(fd, 128) != 0) {
    ::close(fd);
    return Code::kDriver;
  }
  listener_.fd = fd;
  Status st = pe()->watch_fd(fd, EPOLLIN, &listener_);
  uint32_t tick = std::max<uint32_t>(
      10, std::min(opts_.heartbeat_interval_ms / 4, sopts_.hello_timeout_ms / 4));
  if (st.ok()) st = start_timer(tick);
  if (!st.ok()) {
    ::close(fd);
    listener_.fd = -1;
    return st;
  }
  LOG_INFO("comch: server listening on %s", sopts_.path.c_str());
  return Code::kSuccess;
}

void ComchServer::do_stop() {
  if (listener_.fd >= 0) {
    pe()->unwatch_fd(listener_.fd, &listener_);
    ::close(listener_.fd);
    listener_.fd = -1;
    if (sopts_.path[0] != '@') ::unlink(sopts_.path.c_str());
  }
  stop_timer();
  // close_connection() erases from conns_ through on_connection_closed().
  std::vector<ComchConnection*> all;
  for (auto& [id, c] : conns_) all.push_back(c);
  for (ComchConnection* c : all) close_connection(c, Code::kShutdown, "server stopping");
}

uint64_t ComchServer::import_bytes_all() const {
  uint64_t n = 0;
  for (const auto& [id, c] : conns_) n += c->imported_bytes() + c->other_import_bytes();
  return n;
}

void ComchServer::disconnect(ComchConnection* c) {
  close_connection(c, Code::kConnectionReset, "closed by server");
}

void ComchServer::accept_all() {
  for (;;) {
    int fd = accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE)
        LOG_WARN("comch: out of file descriptors; %zu connections", conns_.size());
      return;
    }
    ucred cred{};
    socklen_t clen = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
      ::close(fd);
      ++refused_;
      continue;
    }
    if (!sopts_.allowed_uids.empty() &&
        std::find(sopts_.allowed_uids.begin(), sopts_.allowed_uids.end(), cred.uid) ==
            sopts_.allowed_uids.end()) {
      LOG_WARN("comch: refused pid %d uid %u: not in the allow-list", cred.pid, cred.uid);
      ::close(fd);
      ++refused_;
      continue;
    }
    if (conns_.size() >= sopts_.max_connections) {
      LOG_WARN("comch: refused pid %d: %u connections already", cred.pid, sopts_.max_connections);
      ::close(fd);
      ++refused_;
      continue;
    }
    ComchConnection* c = new_connection(fd, next_id_++);
    if (c == nullptr) {
      ++refused_;
      continue;
    }
    c->peer_ = {cred.pid, cred.uid, cred.gid};
    conns_.emplace(c->id(), c);
    ++accepted_;
  }
}

void ComchServer::on_handshake_msg(ComchConnection* c, const comch::MsgHeader& h,
                                   const uint8_t* payload) {
  if (static_cast<MsgType>(h.type) != MsgType::kHello) {
    close_connection(c, Code::kInvalidValue, "first message is not HELLO");
    return;
  }
  comch::HelloPayload hello;
  std::memcpy(&hello, payload, sizeof(hello));
  if (hello.max_msg == 0 || hello.max_msg > comch::kMaxMsgLimit || hello.heartbeat_ms == 0 ||
      hello.heartbeat_ms > 3600 * 1000 || hello.reserved != 0) {
    close_connection(c, Code::kInvalidValue, "bad HELLO");
    return;
  }
  c->max_msg_ = std::min(hello.max_msg, opts_.max_msg_size);
  c->peer_heartbeat_ms_ = hello.heartbeat_ms;
  comch::HelloAckPayload ack{c->id(), c->max_msg_, opts_.heartbeat_interval_ms};
  Status st = send_ctrl(c, MsgType::kHelloAck, &ack, sizeof(ack));
  if (!st.ok()) {
    close_connection(c, Code::kConnectionReset, "cannot answer HELLO");
    return;
  }
  open_connection(c);
}

void ComchServer::on_connection_closed(ComchConnection* c) {
  conns_.erase(c->id());
}

void ComchServer::on_timer() {
  const uint64_t now = monotonic_ns();
  const uint64_t hello_ns = static_cast<uint64_t>(sopts_.hello_timeout_ms) * 1000000ull;
  std::vector<ComchConnection*> all;
  all.reserve(conns_.size());
  for (auto& [id, c] : conns_) all.push_back(c);
  for (ComchConnection* c : all) {
    if (!c->open()) {
      if (now - c->opened_ns_ > hello_ns) close_connection(c, Code::kTimeout, "no HELLO in time");
      continue;
    }
    heartbeat_tick(c, now);
  }
}

}  // namespace dpukv
