#include "comch/server.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

using comch::MsgType;
using comch::RefuseReason;

namespace {
constexpr uint64_t kPauseNs = 100'000'000ull;  // listener rest at the descriptor limit
// Accepts are paced: at most kAcceptsPerTick per tick of kAcceptTickMs (6,400 a
// second), then the listener rests until the next tick. A peer that reconnects as
// fast as it is refused then costs a few percent of a core, not one, and a real
// client behind a flood of 2,000 waits well under a second in the backlog.
constexpr uint32_t kAcceptsPerTick = 128;
// Descriptors kept for everything but client connections (disk tier, cluster,
// metrics, GPU, fast-path doorbells of the first clients...).
constexpr uint64_t kReservedFds = 64;
// A client connection's own socket plus its fast-path doorbells.
constexpr uint64_t kFdsPerConnection = 2;

uint64_t open_descriptors() {
  uint64_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n > 2 ? n - 2 : n;  // . and ..
}
}  // namespace

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
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

// The soft descriptor limit is raised to the hard one (the unit's LimitNOFILE, or
// ulimit -Hn), as a server that holds one descriptor per client should; if even
// that cannot hold max_connections, the limit is lowered so that a full server
// refuses clients with a reason instead of failing accept() in a loop.
void ComchServer::fit_descriptor_limit() {
  limit_ = sopts_.max_connections;
  uid_limit_ = sopts_.max_connections_per_uid;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (rl.rlim_cur == RLIM_INFINITY) return;
  const uint64_t used = open_descriptors() + kReservedFds;
  const uint64_t room = rl.rlim_cur > used ? (rl.rlim_cur - used) / kFdsPerConnection : 0;
  if (room >= limit_) return;
  limit_ = static_cast<uint32_t>(std::max<uint64_t>(room, 1));
  // One uid's share shrinks in proportion, so that others keep room.
  if (uid_limit_ != 0)
    uid_limit_ = static_cast<uint32_t>(std::max<uint64_t>(
        1, uint64_t{uid_limit_} * limit_ / std::max<uint32_t>(sopts_.max_connections, 1)));
  LOG_WARN(
      "comch: %u connections allowed (%u per uid), not %u: the descriptor limit is %llu (raise "
      "LimitNOFILE in the unit, or ulimit -n)",
      limit_, uid_limit_, sopts_.max_connections, static_cast<unsigned long long>(rl.rlim_cur));
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
        LOG_ERR(
            "comch: another server is listening on %s (stop it first, or choose another socket "
            "path)",
            sopts_.path.c_str());
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
  // A deep backlog: a client that connects while a flood is being drained waits
  // its turn in it (accepts are paced, below) instead of being told EAGAIN.
  if (listen(fd, SOMAXCONN) != 0) {
    ::close(fd);
    return Code::kDriver;
  }
  listener_.fd = fd;
  fit_descriptor_limit();
  if (spare_fd_ < 0) spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  Status st = pe()->watch_fd(fd, EPOLLIN, &listener_);
  scan_ns_ = uint64_t{std::max<uint32_t>(
                 10, std::min(options().heartbeat_interval_ms / 4, sopts_.hello_timeout_ms / 4))} *
             1000000ull;
  if (st.ok()) st = start_timer(kAcceptTickMs);
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
  paused_until_ns_ = 0;
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

void ComchServer::for_each_connection(void (*fn)(void*, const ComchConnection*), void* arg) const {
  for (const auto& [id, c] : conns_) fn(arg, c);
}

void ComchServer::disconnect(ComchConnection* c) {
  close_connection(c, Code::kConnectionReset, "closed by server");
}

// At the descriptor limit accept() fails and the connection stays in the backlog:
// the level-triggered listener would wake the loop at once, forever. It rests for
// 100 ms instead (the timer watches it again); the clients retry.
void ComchServer::pause_listener(const char* why) {
  LOG_WARN_LIMITED("comch: accept on %s: %s with %zu connections; not accepting for 100 ms",
                   sopts_.path.c_str(), why, conns_.size());
  (void)pe()->modify_fd(listener_.fd, 0, &listener_);
  paused_until_ns_ = monotonic_ns() + kPauseNs;
}

// Out of descriptors, the spare one is given up to take the next client anyway:
// it is admitted in the place of a connection still without HELLO (whose
// descriptor comes back), or told why it is refused. True if a descriptor came
// back and accepting may go on.
bool ComchServer::accept_with_spare() {
  if (spare_fd_ < 0) return false;
  ::close(spare_fd_);
  spare_fd_ = -1;
  const int fd = accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd >= 0) {
    ++accepts_this_tick_;
    take(fd, RefuseReason::kFdLimit);
  }
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0 && spare_fd_ >= 0;
}

void ComchServer::refuse(int fd, RefuseReason reason, uint32_t limit) {
  struct {
    comch::MsgHeader h;
    comch::RefusedPayload p;
  } msg{{comch::kMagic, comch::kVersion, static_cast<uint16_t>(MsgType::kRefused),
         sizeof(comch::RefusedPayload), 0},
        {static_cast<uint32_t>(reason), limit, 0}};
  // A fresh socket's buffer always takes one small record; if not, the close says enough.
  (void)!::send(fd, &msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
  // Closed with the client's HELLO unread, the socket would reset the peer, and the
  // peer would read ECONNRESET instead of the reason: read what it sent first.
  char sink[64];
  for (int i = 0; i < 8 && ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT | MSG_TRUNC) >= 0; ++i) {
  }
  ::close(fd);
  ++refused_;
}

bool ComchServer::admit(uid_t uid, RefuseReason* reason, uint32_t* limit) {
  const auto it = per_uid_.find(uid);
  const uint32_t mine = it != per_uid_.end() ? it->second : 0;
  const bool uid_full = uid_limit_ != 0 && mine >= uid_limit_;
  const bool all_full = conns_.size() >= limit_;
  if (!uid_full && !all_full) return true;
  // The oldest connection without HELLO (of this uid when its share is the limit).
  ComchConnection* oldest = nullptr;
  for (auto& [id, c] : conns_) {
    if (c->open() || (uid_full && c->peer().uid != uid)) continue;
    if (oldest == nullptr || c->opened_ns() < oldest->opened_ns()) oldest = c;
  }
  if (oldest != nullptr) {
    close_connection(oldest, Code::kTimeout, "no HELLO yet; its place went to a new connection");
    return true;
  }
  *reason = uid_full ? RefuseReason::kPeerLimit : RefuseReason::kFull;
  *limit = uid_full ? uid_limit_ : limit_;
  return false;
}

void ComchServer::accept_all() {
  for (;;) {
    if (accepts_this_tick_ >= kAcceptsPerTick) {
      (void)pe()->modify_fd(listener_.fd, 0, &listener_);
      paced_ = true;  // the next tick watches it again
      return;
    }
    const int fd = accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM) return;
      const int err = errno;
      if (accept_with_spare()) continue;
      pause_listener(std::strerror(err));
      return;
    }
    ++accepts_this_tick_;
    take(fd, RefuseReason::kFull);
  }
}

void ComchServer::take(int fd, RefuseReason full) {
  ucred cred{};
  socklen_t clen = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
    ::close(fd);
    ++refused_;
    return;
  }
  if (!sopts_.allowed_uids.empty() &&
      std::find(sopts_.allowed_uids.begin(), sopts_.allowed_uids.end(), cred.uid) ==
          sopts_.allowed_uids.end()) {
    LOG_WARN_LIMITED("comch: refused pid %d uid %u: not in the allow-list", cred.pid, cred.uid);
    refuse(fd, RefuseReason::kNotAllowed, 0);
    return;
  }
  PeerCred peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  socklen_t glen = sizeof(peer.groups);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, peer.groups, &glen) == 0 ||
      (errno == ERANGE && glen > 0))
    peer.ngroups = std::min<uint32_t>(glen / sizeof(gid_t), PeerCred::kMaxGroups);
  if (peer.ngroups > 0 && glen > sizeof(peer.groups)) {
    // More groups than fit: read them all once, keep the first kMaxGroups.
    std::vector<gid_t> all(glen / sizeof(gid_t));
    socklen_t alen = glen;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, all.data(), &alen) == 0)
      std::copy_n(all.begin(), peer.ngroups, peer.groups);
  }
  if (sopts_.admit_peer != nullptr && !sopts_.admit_peer(sopts_.admit_arg, peer)) {
    LOG_WARN_LIMITED("comch: refused pid %d uid %u: not let in", cred.pid, cred.uid);
    refuse(fd, RefuseReason::kNotAllowed, 0);
    return;
  }
  RefuseReason why{};
  uint32_t limit = 0;
  if (!admit(cred.uid, &why, &limit)) {
    if (why == RefuseReason::kFull) why = full;  // out of descriptors says so
    LOG_WARN_LIMITED("comch: refused pid %d uid %u: %s (%u)", cred.pid, cred.uid,
                     why == RefuseReason::kPeerLimit ? "its uid at its share of connections"
                                                     : "connections at the limit",
                     limit);
    refuse(fd, why, limit);
    return;
  }
  ComchConnection* c = new_connection(fd, next_id_++);
  if (c == nullptr) {
    ++refused_;
    return;
  }
  set_peer(c, peer);
  conns_.emplace(c->id(), c);
  ++per_uid_[cred.uid];
  ++accepted_;
  // A client sends HELLO with its connect: read it now, so that a real client is
  // never taken for a silent one (the oldest of which make room in admit()).
  on_conn_ready(c, EPOLLIN);
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
      hello.heartbeat_ms > sopts_.max_peer_heartbeat_ms || hello.reserved != 0) {
    // A session that may stay silent for hours holds its place as long: refused,
    // with the bound, so the client can say what to change.
    comch::RefusedPayload r{static_cast<uint32_t>(RefuseReason::kBadHello),
                            sopts_.max_peer_heartbeat_ms, 0};
    (void)send_ctrl(c, MsgType::kRefused, &r, sizeof(r));
    close_connection(c, Code::kInvalidValue,
                     "bad HELLO (heartbeat above the bound, or a bad field)");
    return;
  }
  agree(c, std::min(hello.max_msg, options().max_msg_size), hello.heartbeat_ms);
  comch::HelloAckPayload ack{c->id(), c->max_msg(), options().heartbeat_interval_ms};
  Status st = send_ctrl(c, MsgType::kHelloAck, &ack, sizeof(ack));
  if (!st.ok()) {
    close_connection(c, Code::kConnectionReset, "cannot answer HELLO");
    return;
  }
  open_connection(c);
}

void ComchServer::on_connection_closed(ComchConnection* c) {
  conns_.erase(c->id());
  auto it = per_uid_.find(c->peer().uid);
  if (it != per_uid_.end() && --it->second == 0) per_uid_.erase(it);
}

void ComchServer::on_timer() {
  const uint64_t now = monotonic_ns();
  accepts_this_tick_ = 0;
  if (spare_fd_ < 0) spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (listener_.fd >= 0 && (paced_ || paused_until_ns_ != 0) &&
      (paused_until_ns_ == 0 || now >= paused_until_ns_)) {
    paced_ = false;
    paused_until_ns_ = 0;
    (void)pe()->modify_fd(listener_.fd, EPOLLIN, &listener_);
  }
  if (now - last_scan_ns_ < scan_ns_) return;
  last_scan_ns_ = now;
  const uint64_t hello_ns = static_cast<uint64_t>(sopts_.hello_timeout_ms) * 1000000ull;
  std::vector<ComchConnection*> all;
  all.reserve(conns_.size());
  for (auto& [id, c] : conns_) all.push_back(c);
  for (ComchConnection* c : all) {
    if (!c->open()) {
      if (now - c->opened_ns() > hello_ns) close_connection(c, Code::kTimeout, "no HELLO in time");
      continue;
    }
    heartbeat_tick(c, now);
  }
}

}  // namespace dpukv
