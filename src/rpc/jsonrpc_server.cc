#include "rpc/jsonrpc_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/log.h"

namespace dpukv::rpc {

size_t json_value_end(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (i == s.size()) return 0;
  if (s[i] != '{' && s[i] != '[') return std::string::npos;
  int depth = 0;
  bool in_string = false, escape = false;
  for (; i < s.size(); ++i) {
    char ch = s[i];
    if (in_string) {
      if (escape)
        escape = false;
      else if (ch == '\\')
        escape = true;
      else if (ch == '"')
        in_string = false;
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      if (++depth > 64) return std::string::npos;  // nesting no request needs
    } else if (ch == '}' || ch == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return 0;
}

JsonRpcServer::~JsonRpcServer() {
  stop();
}

void JsonRpcServer::add(const std::string& method, Handler h, bool startup) {
  methods_[method] = Method{std::move(h), startup};
}

std::vector<std::string> JsonRpcServer::methods(bool current_state_only) const {
  std::vector<std::string> v;
  for (const auto& [name, m] : methods_) {
    if (!allowed_.empty() && std::find(allowed_.begin(), allowed_.end(), name) == allowed_.end())
      continue;
    if (current_state_only && !running_.load() && !m.startup) continue;
    v.push_back(name);
  }
  return v;
}

Json JsonRpcServer::dispatch(const Json& req) {
  auto error = [&](const Json& id, int code, const std::string& msg) {
    return Json{{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", msg}}}};
  };
  if (!req.is_object()) return error(nullptr, kInvalidRequest, "Invalid request: not an object");
  Json id = nullptr;
  bool notification = !req.contains("id");
  if (!notification) {
    id = req["id"];
    if (!id.is_number_integer() && !id.is_string() && !id.is_null())
      return error(nullptr, kInvalidRequest,
                   "Invalid request: id must be a number, a string or null");
  }
  if (!req.contains("jsonrpc") || req["jsonrpc"] != "2.0")
    return error(id, kInvalidRequest, "Invalid request: jsonrpc must be \"2.0\"");
  if (!req.contains("method") || !req["method"].is_string())
    return error(id, kInvalidRequest, "Invalid request: method must be a string");
  if (req.contains("params") && !req["params"].is_object() && !req["params"].is_array())
    return error(id, kInvalidRequest, "Invalid request: params must be an object or an array");
  std::string name = req["method"];
  auto it = methods_.find(name);
  bool allowed =
      allowed_.empty() || std::find(allowed_.begin(), allowed_.end(), name) != allowed_.end();
  if (it == methods_.end() || !allowed) {
    if (notification) return nullptr;
    return error(id, kMethodNotFound,
                 it == methods_.end() ? "Method not found" : "Method not allowed");
  }
  if (!running_.load() && !it->second.startup)
    return notification ? Json(nullptr)
                        : error(id, kInvalidState,
                                "Method may only be called after the framework is initialized "
                                "using framework_start_init RPC.");
  Json params = req.contains("params") ? req["params"] : Json::object();
  Json result;
  RpcError e;
  try {
    e = it->second.handler(params, &result);
  } catch (const std::exception& ex) {  // a JSON type error in a handler: the caller's params
    e = RpcError{kInvalidParams, std::string("Invalid parameters: ") + ex.what()};
  }
  if (notification) return nullptr;
  if (!e.ok()) return error(id, e.code, e.message);
  return Json{{"jsonrpc", "2.0"}, {"id", id}, {"result", result}};
}

Status JsonRpcServer::start(const std::string& path, const std::vector<std::string>& allowed) {
  for (const auto& a : allowed)
    if (!methods_.count(a)) {
      LOG_ERR("rpc: --rpcs-allowed names an unknown method: %s", a.c_str());
      return Code::kInvalidValue;
    }
  allowed_ = allowed;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) return Code::kInvalidValue;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (listen_fd_ < 0 || wake_fd_ < 0) return Code::kDriver;
  struct stat sb {};
  if (lstat(path.c_str(), &sb) == 0) {
    if (!S_ISSOCK(sb.st_mode)) {
      LOG_ERR("rpc: %s exists and is not a socket", path.c_str());
      return Code::kBadState;
    }
    // A socket someone answers on belongs to a live server: taking its path would
    // leave that server running but unmanageable. Only a stale one is replaced.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live =
        probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) ::close(probe);
    if (live) {
      LOG_ERR("rpc: %s is in use by a running server; give this one another -r path", path.c_str());
      return Code::kBadState;
    }
    ::unlink(path.c_str());
  }
  mode_t old = umask(0077);
  bool ok = bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            listen(listen_fd_, 16) == 0;
  umask(old);
  if (!ok) {
    LOG_ERR("rpc: cannot listen on %s: %s", path.c_str(), strerror(errno));
    return Code::kIoFailed;
  }
  path_ = path;
  thread_ = std::thread([this] { run(); });
  return Code::kSuccess;
}

void JsonRpcServer::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof one);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
  ::unlink(path_.c_str());
}

// Reads what the client sent (one read), answers up to kBudget complete requests
// into c.out, and sends what the socket takes now. Never blocks, and serves
// clients in turn: a client that floods requests gets kBudget answers a round,
// one that sends without reading gets its answers queued up to kMaxOutput and is
// not read from until it reads. Requests left over are answered next round.
bool JsonRpcServer::serve(Conn& c) {
  char buf[65536];
  if (c.out.size() <= kMaxOutput && c.in.size() <= kMaxRequest) {
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    if (n > 0) c.in.append(buf, static_cast<size_t>(n));
  }
  if (!answer(c)) return false;
  return flush(c);
}

bool JsonRpcServer::backlog(const Conn& c) {
  if (c.closing || c.out.size() > kMaxOutput) return false;
  return json_value_end(c.in) != 0;
}

bool JsonRpcServer::answer(Conn& c) {
  for (int served = 0; served < kBudget && c.out.size() <= kMaxOutput; ++served) {
    size_t end = json_value_end(c.in);
    if (end == 0) {
      if (c.in.size() > kMaxRequest) {
        LOG_WARN("rpc: request larger than %zu bytes; closing", kMaxRequest);
        return false;
      }
      return true;
    }
    Json resp;
    if (end == std::string::npos) {
      resp = Json{{"jsonrpc", "2.0"},
                  {"id", nullptr},
                  {"error", {{"code", kParseError}, {"message", "Parse error"}}}};
      c.closing = true;  // the stream cannot be resynchronized
      c.in.clear();
    } else {
      Json req = Json::parse(c.in.begin(), c.in.begin() + static_cast<long>(end), nullptr, false);
      c.in.erase(0, end);
      if (req.is_discarded())
        resp = Json{{"jsonrpc", "2.0"},
                    {"id", nullptr},
                    {"error", {{"code", kParseError}, {"message", "Parse error"}}}};
      else if (req.is_array())
        resp = Json{{"jsonrpc", "2.0"},
                    {"id", nullptr},
                    {"error",
                     {{"code", kInvalidRequest},
                      {"message", "Invalid request: batches are not supported"}}}};
      else
        resp = dispatch(req);
    }
    if (!resp.is_null()) c.out += resp.dump() + "\n";
    if (c.closing) return true;
  }
  return true;
}

bool JsonRpcServer::flush(Conn& c) {
  while (!c.out.empty()) {
    const ssize_t k = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return true;  // POLLOUT brings us back
    if (k <= 0) return false;
    c.out.erase(0, static_cast<size_t>(k));
  }
  return !c.closing;
}

void JsonRpcServer::run() {
  std::vector<Conn> conns;
  std::vector<pollfd> pfd;
  while (!stop_.load()) {
    pfd.clear();
    pfd.push_back({wake_fd_, POLLIN, 0});
    pfd.push_back({listen_fd_, POLLIN, 0});
    bool more = false;  // a client has complete requests waiting: do not sleep
    for (auto& c : conns) {
      short ev = c.out.size() > kMaxOutput ? 0 : POLLIN;
      if (!c.out.empty()) ev = static_cast<short>(ev | POLLOUT);
      pfd.push_back({c.fd, ev, 0});
      more = more || backlog(c);
    }
    if (::poll(pfd.data(), pfd.size(), more ? 0 : 500) < 0) continue;
    if (pfd[1].revents) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        if (conns.size() >= 64)
          ::close(fd);
        else
          conns.push_back(Conn{fd, {}, {}, false});
      }
    }
    for (size_t i = 2; i < pfd.size(); ++i) {
      Conn& c = conns[i - 2];
      const short ev = pfd[i].revents;
      if (!ev && !backlog(c)) continue;
      bool ok;
      if ((ev & (POLLERR | POLLHUP | POLLNVAL)) && !(ev & POLLIN))
        ok = false;
      else if ((ev & POLLIN) || !(ev & POLLOUT))  // new bytes, or requests left over
        ok = serve(c);
      else
        ok = flush(c);
      if (!ok) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
  }
  for (auto& c : conns) ::close(c.fd);
}

}  // namespace dpukv::rpc
