// The agent's figures rendered from a snapshot the test fills with distinct values:
// every row reaches the JSON under its name with its value, and the Prometheus text
// under its own (counters ending in _total, each with HELP and TYPE), the histograms
// cumulative, and the cluster's rows and peers only for an agent in a cluster.
#include "agent/agent_stats.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

namespace dpukv {
namespace {

AgentStatsSources sample(bool cluster) {
  AgentStatsSources s;
  s.clients = 3;
  s.agent.requests = 1001;
  s.agent.lookup_remote_hits = 1002;
  s.cache.chunks = 2001;
  s.cache.store_bytes = 2002;
  s.cache.requests_in_state[2] = 2003;
  s.metrics_server.refused_busy = 5;
  s.metrics_server.timed_out = 6;
  s.protocol_errors = 3001;
  s.event_subscribers = 2;
  s.gpu_path = "off: no \"driver\"\n";
  s.gpu.exports = 4001;
  s.gpu_engine.bytes = 4002;
  s.gpu_regions = 4003;
  s.latencies.lookup.add(0.0002);
  s.latencies.lookup.add(0.002);
  s.latencies.lookup.add(5.0);  // past the last bucket: +Inf only
  if (cluster) {
    ClusterStatsSnapshot& c = s.cluster.emplace();
    c.node_id = 0xab12;
    c.node.remote_hits = 5001;
    c.directory.published = 5002;
    c.directory_connected = true;
    c.live_nodes = 4;
    ClusterNode::PeerStats p;
    p.node = 0xcd34;
    p.connected = true;
    p.fetched_bytes = 5003;
    c.peers.push_back(p);
  }
  return s;
}

TEST(AgentStats, EveryRowReachesTheJsonUnderItsName) {
  for (bool cluster : {false, true}) {
    const AgentStatsSources s = sample(cluster);
    const nlohmann::json j = nlohmann::json::parse(format_stats_json(s));
    std::set<std::string> names;
    for (const MetricRow& r : metric_rows(s)) {
      EXPECT_TRUE(names.insert(r.json).second) << "two rows named " << r.json;
      ASSERT_TRUE(j.contains(r.json)) << r.json;
      EXPECT_EQ(j[r.json].get<uint64_t>(), r.value) << r.json;
    }
    EXPECT_EQ(j["clients"], 3u);
    EXPECT_EQ(j["requests"], 1001u);
    EXPECT_EQ(j["store_bytes"], 2002u);
    EXPECT_EQ(j["cache_requests_disk_read"], 2003u);
    EXPECT_EQ(j["metrics_refused"], 11u);
    EXPECT_EQ(j["protocol_errors"], 3001u);
    EXPECT_EQ(j["gpu_exports"], 4001u);
    EXPECT_EQ(j["gpu_regions"], 4003u);
    EXPECT_EQ(j["gpu_path"], "off: no \"driver\"\n");  // escaped, and read back whole
    EXPECT_NEAR(j["lookup_mean_us"].get<double>(), (0.0002 + 0.002 + 5.0) / 3 * 1e6, 0.01);
    EXPECT_EQ(j.contains("remote_hits"), cluster);
    EXPECT_EQ(j.contains("peers"), cluster);
    if (cluster) {
      EXPECT_EQ(j["lookup_remote_hits"], 1002u);
      EXPECT_EQ(j["remote_hits"], 5001u);
      EXPECT_EQ(j["cluster_live_nodes"], 4u);
      EXPECT_EQ(j["cluster_node"], "000000000000ab12");
      ASSERT_EQ(j["peers"].size(), 1u);
      EXPECT_EQ(j["peers"][0]["node"], "000000000000cd34");
      EXPECT_EQ(j["peers"][0]["fetched_bytes"], 5003u);
    }
  }
}

TEST(AgentStats, PrometheusTextNamesEveryCounterOnceWithItsType) {
  const AgentStatsSources s = sample(true);
  const std::string text = format_metrics_text(s);
  std::set<std::string> prom;
  for (const MetricRow& r : metric_rows(s)) {
    if (r.prom == nullptr) continue;
    EXPECT_TRUE(prom.insert(r.prom).second) << "two rows named " << r.prom;
    const std::string name(r.prom), type(r.type);
    EXPECT_TRUE(type == "gauge" || type == "counter") << name;
    EXPECT_EQ(type == "counter", name.size() > 6 && name.substr(name.size() - 6) == "_total")
        << name;
    EXPECT_NE(text.find("# HELP " + name + " "), std::string::npos) << name;
    EXPECT_NE(text.find("# TYPE " + name + " " + type + "\n"), std::string::npos) << name;
    EXPECT_NE(text.find("\n" + name + " " + std::to_string(r.value) + "\n"), std::string::npos)
        << name;
  }
  EXPECT_NE(text.find("dpukv_peer_fetched_bytes_total{peer=\"000000000000cd34\"} 5003\n"),
            std::string::npos);
  // Buckets are cumulative: the 0.2 ms lookup is at or below 0.00025, both short ones
  // at or below 0.0025, all three in +Inf.
  EXPECT_NE(text.find("dpukv_lookup_seconds_bucket{le=\"0.000250\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("dpukv_lookup_seconds_bucket{le=\"0.002500\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("dpukv_lookup_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("dpukv_lookup_seconds_count 3\n"), std::string::npos);
  EXPECT_NE(text.find("dpukv_store_batch_seconds_count 0\n"), std::string::npos);
  // Without a cluster, no cluster rows and no per-peer series.
  const std::string alone = format_metrics_text(sample(false));
  EXPECT_EQ(alone.find("dpukv_cluster_"), std::string::npos);
  EXPECT_EQ(alone.find("dpukv_peer_"), std::string::npos);
}

}  // namespace
}  // namespace dpukv
