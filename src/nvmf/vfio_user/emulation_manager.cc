#include "nvmf/vfio_user/emulation_manager.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "runtime/clock.h"
#include "runtime/fd_passing.h"
#include "runtime/log.h"

namespace dpukv::nvme {
namespace vu = vfio_user;
namespace {}  // namespace

const char* hotplug_state_name(HotplugState s) {
  switch (s) {
    case HotplugState::kPowerOff:
      return "power_off";
    case HotplugState::kPlugInProgress:
      return "plug_in_progress";
    case HotplugState::kPowerOn:
      return "power_on";
    case HotplugState::kUnplugInProgress:
      return "unplug_in_progress";
  }
  return "unknown";
}

// One emulated function and its socket: accepts one client at a time and frames
// the byte stream into messages (a message's fds travel with its first bytes).
class EmulationManager::Endpoint {
 public:
  std::string id, path;
  std::atomic<HotplugState> state{HotplugState::kPowerOff};
  std::unique_ptr<NvmePciFunction> fn;
  uint32_t namespaces = 0;
  int listen_fd = -1, conn_fd = -1;

  ~Endpoint() {
    close_conn("function destroyed");
    if (listen_fd >= 0) {
      ::close(listen_fd);
      ::unlink(path.c_str());
    }
  }

  Status listen() {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof addr.sun_path) return Code::kInvalidValue;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_fd < 0) return Code::kDriver;
    struct stat sb {};
    if (lstat(path.c_str(), &sb) ==
        0) {  // a stale socket of a previous run goes; nothing else does
      if (!S_ISSOCK(sb.st_mode)) {
        LOG_ERR("nvme function %s: %s exists and is not a socket", id.c_str(), path.c_str());
        return Code::kBadState;
      }
      ::unlink(path.c_str());
    }
    if (bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd, 4) != 0) {
      LOG_ERR("nvme function %s: cannot listen on %s: %s", id.c_str(), path.c_str(),
              strerror(errno));
      return Code::kIoFailed;
    }
    return Code::kSuccess;
  }

  void accept_client() {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    if (conn_fd >= 0) {  // one client per function, as on a PCIe link
      LOG_WARN("nvme function %s: refused a second client", id.c_str());
      ::close(fd);
      return;
    }
    timeval tv{1, 0};  // a reply that cannot be sent within 1 s means a stuck client
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    conn_fd = fd;
    have = 0;
    LOG_INFO("nvme function %s: client connected", id.c_str());
  }

  void close_conn(const char* why) {
    if (conn_fd < 0) return;
    ::close(conn_fd);
    conn_fd = -1;
    close_fds(pending_fds.data(), npending);
    npending = 0;
    have = 0;
    fn->disconnect();
    LOG_INFO("nvme function %s: client disconnected (%s); ready for the next", id.c_str(), why);
  }

  // Reads at most what the current message still needs, so that descriptors
  // never attach to the wrong message.
  void read_client() {
    for (int rounds = 0; rounds < 16 && conn_fd >= 0; ++rounds) {
      size_t want;
      if (have < sizeof(vu::Header)) {
        want = sizeof(vu::Header) - have;
      } else {
        uint32_t size;
        std::memcpy(&size, buf.data() + 4, 4);
        if (size < sizeof(vu::Header) || size > vu::kMaxMessage)
          return close_conn("bad message size");
        if (buf.size() < size) buf.resize(size);
        want = size - have;
      }
      if (buf.size() < have + want) buf.resize(have + want);
      iovec iov{buf.data() + have, want};
      alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * vu::kMaxMsgFds)];
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = ctrl;
      msg.msg_controllen = sizeof ctrl;
      ssize_t n = recvmsg(conn_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < cnt; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          if (npending < vu::kMaxMsgFds)
            pending_fds[npending++] = fd;
          else
            ::close(fd);
        }
      }
      if (n <= 0) return close_conn(n == 0 ? "closed" : "receive error");
      if (msg.msg_flags & MSG_CTRUNC) return close_conn("too many descriptors");
      have += static_cast<size_t>(n);
      if (have < sizeof(vu::Header)) continue;
      uint32_t size;
      std::memcpy(&size, buf.data() + 4, 4);
      if (have < size) continue;
      fn->handle(buf.data(), have, pending_fds.data(), npending, &reply, &reply_fds);
      npending = 0;
      have = 0;
      if (!reply.empty() && !send_with_fds(conn_fd, reply.data(), reply.size(), reply_fds.data(),
                                           static_cast<int>(reply_fds.size()))
                                 .ok())
        return close_conn("cannot send a reply");
    }
  }

 private:
  std::vector<uint8_t> buf = std::vector<uint8_t>(4096);
  size_t have = 0;
  std::array<int, vu::kMaxMsgFds> pending_fds{};
  int npending = 0;
  std::vector<uint8_t> reply;
  std::vector<int> reply_fds;
};

Status EmulationManager::create(const ManagerOptions& o, std::unique_ptr<EmulationManager>* out) {
  std::unique_ptr<EmulationManager> m(new EmulationManager());
  m->opts_ = o;
  m->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (m->wake_fd_ < 0) return Code::kDriver;
  m->calls_.set_wake_fd(m->wake_fd_);
  if (o.own_thread) m->thread_ = std::thread([p = m.get()] { p->run(); });
  *out = std::move(m);
  return Code::kSuccess;
}

EmulationManager::~EmulationManager() {
  stop_.store(true);
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  endpoints_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status EmulationManager::call(std::function<Status()> fn) {
  if (!opts_.own_thread) return fn();  // the caller is the polling thread
  return calls_.call(std::move(fn));
}

Status EmulationManager::create_function(const FunctionSpec& spec, std::string* id) {
  auto ep = std::make_unique<Endpoint>();
  ep->path = spec.socket_path;
  if (spec.namespaces.empty() && !spec.namespace_set) return Code::kInvalidValue;
  if (Status st = NvmePciFunction::create(spec.config, spec.namespace_set, &ep->fn); !st.ok())
    return st;
  for (size_t i = 0; i < spec.namespaces.size(); ++i)
    if (Status st = ep->fn->add_namespace(static_cast<uint32_t>(i + 1), spec.namespaces[i]);
        !st.ok())
      return st;
  ep->namespaces = static_cast<uint32_t>(spec.namespaces.size());
  if (spec.namespace_set)
    for (const auto& n : spec.namespace_set->ns) ep->namespaces += n != nullptr;
  Endpoint* raw = ep.get();
  return call(
      [&, raw, owned = std::make_shared<std::unique_ptr<Endpoint>>(std::move(ep))]() -> Status {
        raw->id = spec.id.empty() ? "vfio-user-" + std::to_string(next_id_++) : spec.id;
        for (const auto& e : endpoints_)
          if (e->id == raw->id || e->path == raw->path) return Code::kBadState;
        raw->state = HotplugState::kPlugInProgress;
        if (Status st = raw->listen(); !st.ok()) return st;
        raw->state = HotplugState::kPowerOn;
        endpoints_.push_back(std::move(*owned));
        *id = raw->id;
        LOG_INFO("nvme function %s: power on, listening on %s", raw->id.c_str(), raw->path.c_str());
        return Code::kSuccess;
      });
}

Status EmulationManager::destroy_function(const std::string& id) {
  return call([&]() -> Status {
    for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it) {
      if ((*it)->id != id) continue;
      (*it)->state = HotplugState::kUnplugInProgress;
      (*it)->close_conn("unplug");
      (*it)->state = HotplugState::kPowerOff;
      endpoints_.erase(it);
      LOG_INFO("nvme function %s: power off, removed", id.c_str());
      return Code::kSuccess;
    }
    return Code::kNotFound;
  });
}

std::vector<FunctionInfo> EmulationManager::list_functions() {
  std::vector<FunctionInfo> v;
  (void)call([&]() -> Status {
    for (const auto& e : endpoints_)
      v.push_back(FunctionInfo{e->id, e->path, e->state.load(), e->conn_fd >= 0, e->namespaces,
                               e->fn->controller().active_io_queues(),
                               e->fn->controller().stats()});
    return Code::kSuccess;
  });
  return v;
}

bool EmulationManager::poll_sockets(int timeout_us) {
  std::array<pollfd, 64> pfd;
  std::array<std::pair<Endpoint*, bool>, 64> who;  // endpoint, is-listener
  nfds_t n = 0;
  pfd[n++] = pollfd{wake_fd_, POLLIN, 0};
  // Connections before listeners: a client that closed and reconnects at once is
  // seen gone before its new connection is accepted.
  for (auto& e : endpoints_) {
    if (e->conn_fd < 0 || n == pfd.size()) continue;
    who[n] = {e.get(), false};
    pfd[n++] = pollfd{e->conn_fd, POLLIN, 0};
  }
  for (auto& e : endpoints_) {
    if (n == pfd.size()) break;
    who[n] = {e.get(), true};
    pfd[n++] = pollfd{e->listen_fd, POLLIN, 0};
  }
  timespec ts{0, static_cast<long>(timeout_us) * 1000};
  if (ppoll(pfd.data(), n, &ts, nullptr) <= 0) return false;
  if (pfd[0].revents) {
    uint64_t v;
    (void)::read(wake_fd_, &v, sizeof v);
  }
  for (nfds_t i = 1; i < n; ++i) {
    if (!pfd[i].revents) continue;
    if (who[i].second)
      who[i].first->accept_client();
    else
      who[i].first->read_client();
  }
  return true;
}

int EmulationManager::poll_once() {
  int work = 0;
  for (auto& e : endpoints_) work += e->fn->poll();
  uint64_t now = monotonic_us();
  if (now - last_check_ >= opts_.socket_check_us) {
    if (poll_sockets(0)) ++work;
    last_check_ = now;
  }
  return work;
}

void EmulationManager::run() {
  if (opts_.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(opts_.cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  uint64_t last_work = monotonic_us(), last_check = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    int work = 0;
    for (auto& e : endpoints_) work += e->fn->poll();
    uint64_t now = monotonic_us();
    if (work > 0) last_work = now;
    bool idle = now - last_work > opts_.idle_after_us;
    if (idle || now - last_check >= opts_.socket_check_us) {
      // A message usually announces work (a register write, a new queue): stay awake.
      if (poll_sockets(idle ? static_cast<int>(opts_.idle_sleep_us) : 0))
        last_work = monotonic_us();
      last_check = monotonic_us();
    }
    if (calls_.run_pending()) last_work = monotonic_us();
  }
}

}  // namespace dpukv::nvme
