// The agent's ops waiting for the cluster (agent_key_ops.cc): a lookup whose
// misses the cluster is fetching, a push waiting for the other agent's answer.
#pragma once

#include <cstdint>
#include <vector>

#include "agent/agent.h"

namespace dpukv {

// A lookup whose local hits ended before its keys did, waiting for the cluster.
struct Agent::RemoteLookup {
  Agent* agent = nullptr;
  Session* session = nullptr;
  agent::AgentHeader hdr{};
  std::vector<ChunkKey> keys;  // the keys after the local hits
  uint32_t local = 0;          // leading keys found locally
  bool pin = false;
  uint64_t start_ns = 0;
};

// A push to another agent, waiting for its answer.
struct Agent::Push {
  Agent* agent = nullptr;
  Session* session = nullptr;
  agent::AgentHeader hdr{};
  std::vector<uint8_t> status;  // per key; keys not sent keep theirs
  std::vector<uint32_t> sent;   // positions of the keys offered
};

}  // namespace dpukv
