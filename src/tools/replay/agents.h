// The agents a replay serves from: the one named by --agent, or agents of its own.
// With --nodes N, N agents share chunks through a Redis directory started too,
// each in its own network namespace when run as root. Agents of its own die with
// this process (--parent-pid) and are stopped, with their disk directories
// removed, when this goes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tools/common/node_network.h"
#include "tools/replay/replay.h"

namespace dpukv::replay {

class Agents {
 public:
  ~Agents() { stop(); }
  // 0 once every agent was started (not yet serving: a client's connect waits for
  // that), or the exit code after saying why on stderr.
  // block: an unencoded block (the memory is capacity_blocks of them); max_chunk:
  // the largest chunk stored (a block's largest encoding with --kv-codec).
  int start(const Config& c, uint64_t block, uint64_t max_chunk);
  void stop();
  const std::vector<std::string>& sockets() const { return sockets_; }
  bool own() const { return !pids_.empty(); }
  pid_t first_pid() const { return pids_.empty() ? -1 : pids_[0]; }
  bool netns() const { return netns_; }

 private:
  std::vector<pid_t> pids_;
  std::vector<std::string> sockets_;
  std::vector<std::string> disk_dirs_;
  pid_t redis_pid_ = -1;
  uint16_t redis_port_ = 0;
  NodeNetwork net_;
  bool netns_ = false;
};

}  // namespace dpukv::replay
