#include "tools/replay/agents.h"

#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "runtime/child_process.h"
#include "tools/common/bench_common.h"

extern char** environ;

namespace dpukv::replay {
namespace {

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

int Agents::start(const Config& c, uint64_t block, uint64_t max_chunk) {
  const uint32_t nodes = std::max<uint32_t>(1, c.nodes);
  // The agents: ours, unless one was named. They die with this process (a replay
  // that is killed or crashes leaves no agent behind). With --nodes N, N agents
  // share chunks through a Redis directory the replay starts too.
  if (nodes > 1 && !c.agent_socket.empty()) {
    std::cerr << "dpukv replay: --nodes starts its own agents; it cannot use --agent\n";
    return 2;
  }
  if (nodes > 1 && !c.no_netns && geteuid() == 0) {
    netns_ = net_.create(nodes);
    if (!netns_) {
      std::cerr << "dpukv replay: cannot make network namespaces for the agents (ip from "
                   "iproute2, as root); give --no-netns to run them on loopback\n";
      return 1;
    }
  }
  const std::string redis_host = netns_ ? net_.bridge_ip() : "127.0.0.1";
  if (nodes > 1) {
    redis_pid_ = bench::start_redis_server(&redis_port_, redis_host);
    if (redis_pid_ < 0) {
      std::cerr << "dpukv replay: --nodes needs redis-server (Debian's redis-server package) for "
                   "the cluster directory; none could be started\n";
      return 1;
    }
  }
  if (c.agent_socket.empty()) {
    for (uint32_t n = 0; n < nodes; ++n) {
      const std::string socket = "/tmp/dpukv-replay-" + std::to_string(getpid()) +
                                 (nodes > 1 ? "-" + std::to_string(n) : "") + ".sock";
      std::vector<std::string> args = {
          "--log-level", "warning", "agent", "--socket", socket, "--memory-bytes",
          std::to_string(c.capacity_blocks * block), "--max-chunk-size", std::to_string(max_chunk),
          "--max-chunks",
          // Encoded blocks are smaller: more of them fit (int4: about 3.5x).
          std::to_string((c.capacity_blocks + c.disk_blocks) * (c.kv_codec == "none" ? 2 : 8) +
                         1024),
          "--metrics-port", "0", "--eviction", c.eviction, "--parent-pid",
          std::to_string(getpid())};
      if (nodes > 1)
        args.insert(args.end(),
                    {"--cluster", "redis://" + redis_host + ":" + std::to_string(redis_port_),
                     "--cluster-prefix", "replay-" + std::to_string(getpid())});
      if (netns_) args.insert(args.end(), {"--advertise", net_.ip(n)});
      if (c.disk_blocks > 0) {
        std::string dir =
            c.disk_dir.empty() ? "" : c.disk_dir + (nodes > 1 ? "/node" + std::to_string(n) : "");
        if (dir.empty()) {
          char tmpl[] = "/var/tmp/dpukv-replay-disk-XXXXXX";
          if (mkdtemp(tmpl) == nullptr) {
            std::cerr << "dpukv replay: cannot make a disk tier directory under /var/tmp: "
                      << std::strerror(errno) << "\n";
            return 1;
          }
          dir = tmpl;
          disk_dirs_.push_back(dir);
        }
        args.insert(args.end(), {"--local-disk", dir, "--max-local-disk-size",
                                 std::to_string(c.disk_blocks * block) + "B"});
      }
      pid_t pid = -1;
      if (netns_) {  // `ip netns_ exec` enters the namespace and execs the agent in place
        std::vector<std::string> full = {"ip", "netns", "exec", net_.ns(n), self_exe()};
        full.insert(full.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (auto& a : full) argv.push_back(a.data());
        argv.push_back(nullptr);
        if (posix_spawnp(&pid, "ip", nullptr, nullptr, argv.data(), environ) != 0) pid = -1;
      } else {
        pid = bench::spawn_self(args, -1);
      }
      if (pid < 0) {
        std::cerr << "dpukv replay: cannot start the agent\n";
        return 1;
      }
      pids_.push_back(pid);
      sockets_.push_back(socket);
    }
  } else {
    sockets_.push_back(c.agent_socket);
  }
  return 0;
}

void Agents::stop() {
  for (pid_t& p : pids_) {
    if (p <= 0) continue;
    signal_child(p, SIGTERM);
    int status;
    reap_child(p, &status);
    p = -1;
  }
  if (redis_pid_ > 0) {
    (void)signal_child(redis_pid_, SIGKILL);
    (void)reap_child(redis_pid_, nullptr);
    redis_pid_ = -1;
  }
  for (const std::string& d : disk_dirs_) std::filesystem::remove_all(d);
  disk_dirs_.clear();
}

}  // namespace dpukv::replay
