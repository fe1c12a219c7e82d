// Debian's redis-server as a child process, for whoever starts a cluster of its
// own: `bench cluster`, `replay --nodes` and the cluster tests. Nothing is saved to
// disk; its output goes to /dev/null (a server left behind must not hold anyone's
// pipe open); protected mode stays on unless it listens beyond loopback (the agents
// that reach it there are ours).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dpukv {

struct RedisServerOptions {
  std::string bind = "127.0.0.1";
  // 0: a free port. A port found free can be taken by another process before the
  // server binds it; then the server exits and another free port is tried.
  uint16_t port = 0;
  std::vector<std::string> extra;  // more server options: {"--requirepass", "x"}
  uint32_t wait_ms = 60000;        // for it to accept connections, on a busy machine
};

// The child's pid once it accepts connections on *port; -1 if there is no
// redis-server to start, or it exited or did not come up in wait_ms. Stop it with
// signal_child + reap_child (runtime/child_process.h).
pid_t start_redis_server(const RedisServerOptions& o, uint16_t* port);

}  // namespace dpukv
