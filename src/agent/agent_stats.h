// The agent's figures as one table behind `dpukv stat` (JSON) and the metrics
// listener (Prometheus text), so that each counter is named and read in one place.
// Everything here is a function of a snapshot (AgentStatsSources) that the agent
// takes on its own thread: nothing reads the agent, so the table, its names and
// both renderings can be checked against figures a test chose.
//
// Prometheus names carry their unit and counters end in _total; a row without a
// Prometheus name is in the JSON only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/gpu_service.h"
#include "agent/metrics_server.h"
#include "cache/cache_engine.h"
#include "cluster/cluster_node.h"

namespace dpukv {

// What the agent's request path counts.
struct AgentCounters {
  uint64_t requests = 0, bad_requests = 0, not_permitted = 0;
  uint64_t events_sent = 0, events_dropped = 0;  // the event feed
  uint64_t lookups = 0, lookup_keys = 0, lookup_hits = 0;
  uint64_t lookup_remote_hits = 0;  // leading keys a lookup found on other agents
  uint64_t sessions_opened = 0, sessions_closed = 0;
  uint64_t stalled_batches = 0;    // batches that waited for cache requests
  uint64_t oversized_replies = 0;  // answers over the message bound, refused as TOO_BIG
  uint64_t populated_bytes = 0;    // of clients' exports, faulted in ahead of copies
  uint64_t populating = 0;         // exports waiting to be faulted in (a gauge)
};

// Request latencies in Prometheus buckets (upper bounds in seconds, then +Inf).
struct LatencyHistogram {
  static constexpr double kBuckets[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                        0.005,   0.01,   0.05,    0.25,   1};
  static constexpr size_t kNumBuckets = sizeof(kBuckets) / sizeof(double);
  uint64_t counts[kNumBuckets + 1] = {};
  double sum = 0;
  uint64_t n = 0;
  void add(double seconds) {
    size_t i = 0;
    while (i < kNumBuckets && seconds > kBuckets[i]) ++i;
    ++counts[i];
    sum += seconds;
    ++n;
  }
};
struct AgentLatencies {
  LatencyHistogram store, retrieve, lookup;  // per batch (store, retrieve), per lookup
};

// The cluster node's figures, for an agent in a cluster.
struct ClusterStatsSnapshot {
  uint64_t node_id = 0;
  ClusterNode::Counters node;
  Directory::Counters directory;
  bool directory_connected = false, replica_ready = false;
  std::string directory_down_reason;  // why Redis is unreachable (empty: connected)
  uint64_t live_nodes = 0, replica_keys = 0;
  std::vector<ClusterNode::PeerStats> peers;
};

struct AgentStatsSources {
  uint64_t clients = 0;  // connected sessions (the asker's own not counted)
  AgentCounters agent;
  CacheStats cache;
  MetricsServer::Counters metrics_server;
  uint64_t protocol_errors = 0;  // comch connections closed for protocol errors
  uint64_t event_subscribers = 0;
  bool gpu_on = false;
  std::string gpu_path;  // GpuService::description(): on with the device, or off and why
  GpuService::Counters gpu;
  CudaEngine::Counters gpu_engine;
  uint64_t gpu_regions = 0;
  std::optional<ClusterStatsSnapshot> cluster;  // empty: not in a cluster
  AgentLatencies latencies;
  // Tenants (agent/tenants.h): the asker's (empty for the metrics endpoint), and
  // the tenants shown: every tenant for an admin and the metrics endpoint, the
  // asker's own otherwise.
  struct TenantRow {
    std::string name;
    uint32_t tag = 0;
    uint64_t clients = 0;
    uint64_t staging_bytes = 0, staging_quota = 0;  // host and GPU staging of its clients
    TenantUsage use;
  };
  std::string asker_tenant;
  bool asker_admin = false;
  std::vector<TenantRow> tenants;
};

struct MetricRow {
  const char* json;  // name in the JSON
  const char* prom;  // Prometheus name (null: JSON only)
  const char* type;  // gauge or counter
  const char* help;
  uint64_t value;
};

std::vector<MetricRow> metric_rows(const AgentStatsSources& s);
// `dpukv stat --json`: version, gpu_path, every row, the cluster node and its peers,
// lookup_mean_us.
std::string format_stats_json(const AgentStatsSources& s);
// The metrics listener's text: build info, every row with a Prometheus name, bytes
// and errors per peer, and the three latency histograms.
std::string format_metrics_text(const AgentStatsSources& s);

}  // namespace dpukv
