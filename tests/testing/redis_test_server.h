// A real redis-server (Debian's) for the cluster tests, through the same launcher
// as the tools (cluster/directory/redis_server.h): on a free loopback port unless
// the test names one, killed (SIGKILL, as a crash would) and restarted on the same
// port at will. Test code only: include dir tests/.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cluster/directory/redis_server.h"
#include "runtime/child_process.h"

namespace dpukv {

// A loopback port nothing listens on now, for a test that must know the port before
// a server runs there (another process may still take it: use Redis(kAnyPort) when
// the order does not matter).
inline uint16_t free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), len), 0);
  EXPECT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(s);
  return ntohs(a.sin_port);
}

class Redis {
 public:
  static constexpr uint16_t kAnyPort = 0;
  // extra: more server options, e.g. {"--requirepass", "secret"}.
  explicit Redis(uint16_t port = kAnyPort, std::vector<std::string> extra = {})
      : port_(port), extra_(std::move(extra)) {
    EXPECT_TRUE(start()) << "redis-server did not start";
  }
  ~Redis() { stop(); }
  // Starts it (again: on the port it had).
  bool start() {
    RedisServerOptions o;
    o.port = port_;
    o.extra = extra_;
    pid_ = start_redis_server(o, &port_);
    return pid_ > 0;
  }
  void stop() {
    if (pid_ > 0) {
      (void)signal_child(pid_, SIGKILL);
      (void)reap_child(pid_, nullptr);
    }
    pid_ = -1;
  }
  // SIGSTOP / SIGCONT: a Redis that hangs with its connections open.
  bool pause() { return signal_child(pid_, SIGSTOP); }
  bool resume() { return signal_child(pid_, SIGCONT); }
  bool running() const { return pid_ > 0; }
  uint16_t port() const { return port_; }

 private:
  uint16_t port_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

}  // namespace dpukv
