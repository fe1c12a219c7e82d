#include "cluster/directory/redis_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/child_process.h"
#include "runtime/clock.h"

extern char** environ;

namespace dpukv {
namespace {

// A port the kernel says is free on that address now; 0 if none.
uint16_t free_port(const sockaddr_in& where) {
  sockaddr_in a = where;
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok = s >= 0 && ::bind(s, reinterpret_cast<sockaddr*>(&a), len) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (s >= 0) ::close(s);
  return ok ? ntohs(a.sin_port) : 0;
}

bool accepts(const sockaddr_in& a) {
  const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool up = c >= 0 && ::connect(c, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0;
  if (c >= 0) ::close(c);
  return up;
}

enum class Outcome { kUp, kExited, kNoServer, kTimeout };

Outcome start_once(const RedisServerOptions& o, const sockaddr_in& a, pid_t* pid) {
  const std::string port = std::to_string(ntohs(a.sin_port));
  std::vector<std::string> args = {"redis-server",
                                   "--port",
                                   port,
                                   "--bind",
                                   o.bind,
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--logfile",
                                   "/dev/null",
                                   "--protected-mode",
                                   o.bind == "127.0.0.1" ? "yes" : "no"};
  args.insert(args.end(), o.extra.begin(), o.extra.end());
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  const int rc = posix_spawnp(pid, "redis-server", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Outcome::kNoServer;
  const uint64_t end = monotonic_ms() + o.wait_ms;
  while (monotonic_ms() < end) {
    int st = 0;
    if (::waitpid(*pid, &st, WNOHANG) == *pid) return Outcome::kExited;  // port taken, bad option
    if (accepts(a)) return Outcome::kUp;
    usleep(10000);
  }
  (void)signal_child(*pid, SIGKILL);
  (void)reap_child(*pid, nullptr);
  return Outcome::kTimeout;
}

}  // namespace

pid_t start_redis_server(const RedisServerOptions& o, uint16_t* port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, o.bind.c_str(), &a.sin_addr) != 1) return -1;
  // A chosen port taken meanwhile: another. A given port: a few more tries (a
  // server killed a moment ago may still hold it).
  for (int attempt = 0; attempt < 20; ++attempt) {
    const uint16_t p = o.port != 0 ? o.port : free_port(a);
    if (p == 0) return -1;
    a.sin_port = htons(p);
    pid_t pid = -1;
    switch (start_once(o, a, &pid)) {
      case Outcome::kUp:
        *port = p;
        return pid;
      case Outcome::kExited:
        if (o.port != 0) usleep(50000);
        continue;
      case Outcome::kNoServer:
      case Outcome::kTimeout:
        return -1;
    }
  }
  return -1;
}

}  // namespace dpukv
