// The replay's clients: nclients threads, each with its own client and staging,
// spread over the agents (request i goes to agent i mod N, as a load balancer
// without prefix affinity would); each request is a lookup, a retrieve of the hits
// (checked byte for byte), and a store of the misses. The LRU simulations and the
// offline optimum see the trace in its own order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/common/bench_common.h"
#include "tools/replay/agents.h"
#include "tools/replay/optimum.h"
#include "tools/replay/replay.h"
#include "tools/replay/trace.h"

namespace dpukv::replay {

struct Totals {
  uint64_t requests = 0, blocks = 0, hit_blocks = 0, tokens = 0, hit_tokens = 0, sim_hits = 0;
  uint64_t stored_bytes = 0, retrieved_bytes = 0, verified_bytes = 0, verify_failures = 0;
  uint64_t store_ns = 0, retrieve_ns = 0, lost_hits = 0, hier_sim_hits = 0, retries = 0;
  OptimumHits optimum, hier_optimum;         // Belady over memory, and over memory + disk
  std::map<std::string, uint64_t> failures;  // "store NO_MEMORY" -> entries
  bench::LatencyRecorder lookup_lat{1u << 18}, retrieve_lat{1u << 18};
  struct Bucket {
    uint64_t refs = 0, hits = 0, bytes = 0, ns = 0;
  };
  std::vector<Bucket> timeline;  // per minute of trace time
  double wall_s = 0;
  // What the agents say: the first one's stats, and with several nodes each one's
  // and their remote reads summed.
  std::string agent_json;
  bench::Json node_stats = bench::Json::array();
  uint64_t remote_hits = 0, remote_bytes = 0, remote_failures = 0;
  // With --kv-codec: the blocks the memory holds at the mean encoded size, which the
  // simulations and the optimum are given (ideal packing: the agent's slab classes
  // round each block up).
  uint64_t capacity_blocks = 0;
  uint64_t stored_blocks = 0;
};

// 0 with *t filled, or the exit code after saying why on stderr.
// slot: a block's staging slot (its largest encoding with a codec); capacity: the
// blocks the simulations and the optimum hold per agent.
int drive_clients(const Config& c, const std::vector<Request>& reqs, const Agents& agents,
                  uint32_t nclients, uint64_t block, uint64_t slot, uint64_t capacity,
                  size_t max_blocks, Totals* t);

}  // namespace dpukv::replay
