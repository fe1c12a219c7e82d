// `dpukv replay TRACE`: real serving traffic (Mooncake JSONL traces) through real
// clients against real agents, with an LRU simulation of the same capacity. The
// parts: replay_trace (presets, the trace, block contents, the LRU), replay_agents
// (the agents and Redis it starts), replay_clients (the client threads and their
// totals), replay_report (JSON, text and the plot).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace dpukv {

namespace replay {

// What `dpukv replay` was asked to do.
struct Config {
  std::string trace;
  std::string agent_socket;
  std::string model = "llama-3.1-8b";
  uint32_t scale = 1024;
  uint64_t capacity_blocks = 10000;
  uint64_t disk_blocks = 0;  // a disk tier of this many blocks on the agent it starts
  std::string disk_dir;      // where (default: a fresh directory under /var/tmp)
  uint32_t clients = 1;
  double speedup = 0;
  uint64_t max_requests = 0;
  bool json = false;
  bool no_verify = false;
  std::string plot;
  std::string eviction = "arc";
  uint32_t nodes = 1;  // agents in a cluster (a Redis directory the replay starts)
  bool no_netns = false;
  std::string kv_codec = "none";  // blocks stored encoded (replay_codec.h)
};

}  // namespace replay

void add_replay_command(CLI::App* app, int* exit_code);

}  // namespace dpukv
