// A real redis-server (Debian's) for the cluster tests: started on a free
// loopback port, killed (SIGKILL, as a crash would) and restarted at will.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "runtime/child_process.h"

extern char** environ;

namespace dpukv {

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
  // extra: more server options, e.g. {"--requirepass", "secret"}.
  explicit Redis(uint16_t port, std::vector<std::string> extra = {})
      : port_(port), extra_(std::move(extra)) {
    start();
  }
  ~Redis() { stop(); }
  bool start() {
    std::vector<std::string> args = {
        "redis-server", "--port", std::to_string(port_), "--bind",   "127.0.0.1", "--save", "",
        "--appendonly", "no",     "--logfile",           "/dev/null"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Its output goes to /dev/null, not to the test's: a server left behind by a
    // crashed test must not hold ctest's pipe open.
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawnp(&pid_, "redis-server", &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid_ = -1;
      return false;
    }
    // Until it accepts connections, however busy the machine, while it runs.
    for (int i = 0; i < 6000; ++i) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {  // it exited (a port taken, a bad option)
        pid_ = -1;
        return false;
      }
      int s = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(port_);
      const bool up = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      close(s);
      if (up) return true;
      usleep(10000);
    }
    return false;
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
