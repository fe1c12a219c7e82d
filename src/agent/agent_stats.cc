#include "agent/agent_stats.h"

#include <cstdio>
#include <string>

#include "protocol/version.h"

namespace dpukv {

namespace {

std::string json_escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char u[8];
      std::snprintf(u, sizeof(u), "\\u%04x", static_cast<unsigned>(c));
      out += u;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::vector<MetricRow> metric_rows(const AgentStatsSources& s) {
  const CacheStats& c = s.cache;
  const MetricsServer::Counters& mc = s.metrics_server;
  const uint64_t clients = s.clients;
  std::vector<MetricRow> rows = {
      {"clients", "dpukv_clients_connected", "gauge", "Connected clients.", clients},
      {"chunks", "dpukv_chunks", "gauge", "Chunks in the cache (each counted once).", c.chunks},
      {"memory_chunks", "dpukv_memory_chunks", "gauge", "Chunks in the memory tier.",
       c.memory_chunks},
      {"disk_chunks", "dpukv_disk_chunks", "gauge", "Chunks in the disk tier.", c.disk_chunks},
      {"both_tier_chunks", "dpukv_both_tier_chunks", "gauge", "Chunks with a copy in each tier.",
       c.both_chunks},
      {"memory_used_bytes", "dpukv_memory_used_bytes", "gauge", "Memory tier bytes in use.",
       c.memory_used},
      {"memory_capacity_bytes", "dpukv_memory_capacity_bytes", "gauge", "Memory tier capacity.",
       c.memory_capacity},
      {"disk_used_bytes", "dpukv_disk_used_bytes", "gauge", "Disk tier bytes in use.", c.disk_used},
      {"disk_capacity_bytes", "dpukv_disk_capacity_bytes", "gauge", "Disk tier capacity.",
       c.disk_capacity},
      {"stores", "dpukv_stores_total", "counter", "Chunks stored.", c.stores},
      {"store_bytes", "dpukv_store_bytes_total", "counter", "Bytes stored.", c.store_bytes},
      {"retrieves", "dpukv_retrieves_total", "counter", "Chunks retrieved.", c.retrieves},
      {"retrieve_bytes", "dpukv_retrieve_bytes_total", "counter", "Bytes retrieved.",
       c.retrieve_bytes},
      {"hits", nullptr, nullptr, nullptr, c.hits},
      {"misses", "dpukv_retrieve_misses_total", "counter", "Retrieves of absent or corrupt chunks.",
       c.misses},
      {"evictions", "dpukv_memory_evictions_total", "counter", "Chunks evicted from memory.",
       c.evictions},
      {"disk_evictions", "dpukv_disk_evictions_total", "counter",
       "Chunks dropped from the disk tier to make room.", c.disk_evictions},
      {"spills", "dpukv_spills_total", "counter", "Chunks written to the disk tier.", c.spills},
      {"reloads", "dpukv_reloads_total", "counter", "Chunks read back from the disk tier.",
       c.reloads},
      {"checksum_failures", "dpukv_checksum_failures_total", "counter",
       "Chunks dropped for a checksum mismatch.", c.checksum_failures},
      {"landed_mismatches", "dpukv_landed_mismatches_total", "counter",
       "Device reads refused because the bytes that landed differed (the chunk was intact).",
       c.landed_mismatches},
      {"engine_waits", "dpukv_engine_waits_total", "counter",
       "Copies that waited for a slot in a full DMA or codec ring (a batch longer than a ring).",
       c.engine_waits},
      {"io_errors", "dpukv_disk_io_errors_total", "counter",
       "Disk tier writes or reads that failed.", c.io_errors},
      {"disk_log_errors", "dpukv_disk_log_errors_total", "counter",
       "Disk index log records that could not be written.", c.disk_log_errors},
      {"disk_ios_in_flight", "dpukv_disk_ios_in_flight", "gauge",
       "Disk tier reads and writes under way.", c.disk_ios_in_flight},
      {"writes_waiting", "dpukv_disk_writes_waiting", "gauge",
       "Write-through chunks waiting for a disk write slot.", c.writes_waiting},
      {"store_rejects", "dpukv_store_rejects_total", "counter",
       "Stores refused for lack of room (everything pinned or in use).", c.store_rejects},
      {"recovered", "dpukv_recovered_chunks", "gauge", "Chunks recovered from disk at start.",
       c.recovered},
      {"lookups", "dpukv_lookups_total", "counter", "Lookup requests.", s.agent.lookups},
      {"lookup_keys", "dpukv_lookup_keys_total", "counter", "Keys asked about by lookups.",
       s.agent.lookup_keys},
      {"lookup_hits", "dpukv_lookup_hit_keys_total", "counter", "Leading keys found by lookups.",
       s.agent.lookup_hits},
      {"requests", "dpukv_requests_total", "counter", "Requests received.", s.agent.requests},
      {"bad_requests", "dpukv_bad_requests_total", "counter", "Malformed requests.",
       s.agent.bad_requests},
      {"stalled_batches", "dpukv_stalled_batches_total", "counter",
       "Store or retrieve batches that waited for the cache's request pool (backpressure).",
       s.agent.stalled_batches},
      {"oversized_replies", "dpukv_oversized_replies_total", "counter",
       "Answers larger than the connection's message bound, sent as TOO_BIG instead.",
       s.agent.oversized_replies},
      {"populated_bytes", "dpukv_populated_bytes_total", "counter",
       "Bytes of clients' exports faulted in ahead of the copies into them.",
       s.agent.populated_bytes},
      {"populating", "dpukv_populating_exports", "gauge",
       "Clients' exports waiting to be faulted in.", s.agent.populating},
      {"not_permitted", "dpukv_not_permitted_total", "counter",
       "Entries refused: memory not the client's, or a key of another model.",
       s.agent.not_permitted},
      {"protocol_errors", "dpukv_comch_protocol_errors_total", "counter",
       "Connections closed for protocol errors.", s.protocol_errors},
      {"event_subscribers", "dpukv_event_subscribers", "gauge",
       "Sessions subscribed to the event feed (chunks stored and removed).", s.event_subscribers},
      {"events_sent", "dpukv_events_sent_total", "counter",
       "Chunk events sent to subscribers (one per subscriber).", s.agent.events_sent},
      {"events_dropped", "dpukv_events_dropped_total", "counter",
       "Chunk events dropped (a subscriber not reading, or too many queued).",
       s.agent.events_dropped},
      {"sessions_opened", "dpukv_sessions_opened_total", "counter", "Client sessions opened.",
       s.agent.sessions_opened},
      {"metrics_refused", "dpukv_metrics_connections_refused_total", "counter",
       "Metrics connections closed at once (no room), timed out, or closed to make room.",
       mc.refused_busy + mc.timed_out + mc.evicted},
  };
  const GpuService::Counters& g = s.gpu;
  const CudaEngine::Counters& ge = s.gpu_engine;
  const std::vector<MetricRow> gpu_rows = {
      {"gpu_on", "dpukv_gpu_copies_available", "gauge",
       "1 while the agent copies to and from GPU memory (0: host memory only).",
       s.gpu_on ? 1u : 0u},
      {"gpu_exports", "dpukv_gpu_exports_total", "counter", "GPU memory exports accepted.",
       g.exports},
      {"gpu_exports_refused", "dpukv_gpu_exports_refused_total", "counter",
       "GPU memory exports refused (no GPU path, foreign device, bad handle or range).",
       g.exports_refused},
      {"gpu_regions", "dpukv_gpu_regions_open", "gauge", "GPU memory regions open now.",
       s.gpu_regions},
      {"gpu_copies", "dpukv_gpu_copies_total", "counter",
       "Copies between the arena and GPU memory.", ge.copies},
      {"gpu_copy_bytes", "dpukv_gpu_copy_bytes_total", "counter",
       "Bytes copied between the arena and GPU memory.", ge.bytes},
      {"gpu_copy_failures", "dpukv_gpu_copy_failures_total", "counter",
       "GPU copies the driver or the GPU failed (their requests failed).", ge.failed},
      {"gpu_checksums_gpu", "dpukv_gpu_checksums_on_gpu_total", "counter",
       "GPU copies checksummed on the GPU (the agent's kernel).", ge.gpu_hashed},
      {"gpu_checksums_host", "dpukv_gpu_checksums_on_host_total", "counter",
       "GPU copies checksummed on host threads.", ge.host_hashed},
  };
  rows.insert(rows.end(), gpu_rows.begin(), gpu_rows.end());
  for (size_t i = 0; i < kRequestStates; ++i)
    rows.push_back({kRequestStateNames[i], kRequestStateMetrics[i], "gauge",
                    "Cache requests in this state of the pipeline now.", c.requests_in_state[i]});
  if (!s.cluster) return rows;
  const ClusterNode::Counters& k = s.cluster->node;
  const Directory::Counters& d = s.cluster->directory;
  const std::vector<MetricRow> cluster_rows = {
      {"cluster_directory_connected", "dpukv_cluster_directory_connected", "gauge",
       "1 while the Redis directory is reachable.", s.cluster->directory_connected ? 1u : 0u},
      {"cluster_live_nodes", "dpukv_cluster_live_nodes", "gauge",
       "Agents whose directory lease is live, this one included.", s.cluster->live_nodes},
      {"cluster_peers", "dpukv_cluster_peers", "gauge", "Other agents this one has talked to.",
       s.cluster->peers.size()},
      {"lookup_remote_hits", "dpukv_lookup_remote_hit_keys_total", "counter",
       "Leading keys lookups found on other agents.", s.agent.lookup_remote_hits},
      {"remote_fetches", "dpukv_cluster_fetches_total", "counter",
       "Lookups that asked the cluster for missing keys.", k.fetches},
      {"remote_hits", "dpukv_cluster_remote_hits_total", "counter",
       "Chunks read from other agents and kept.", k.remote_hits},
      {"remote_bytes", "dpukv_cluster_remote_bytes_total", "counter",
       "Bytes read from other agents.", k.remote_bytes},
      {"remote_stale", "dpukv_cluster_stale_entries_total", "counter",
       "Directory entries whose holder no longer had the chunk.", k.stale},
      {"remote_read_errors", "dpukv_cluster_read_errors_total", "counter",
       "Reads from other agents that broke (holder died, partition).", k.read_errors},
      {"remote_checksum_failures", "dpukv_cluster_checksum_failures_total", "counter",
       "Copies from other agents that failed their checksum.", k.checksum_failures},
      {"remote_timeouts", "dpukv_cluster_timeouts_total", "counter",
       "Holders that did not answer in time.", k.timeouts},
      {"remote_no_room", "dpukv_cluster_no_room_total", "counter",
       "Remote chunks not taken for lack of local room.", k.no_room},
      {"directory_unreachable", "dpukv_cluster_directory_unreachable_total", "counter",
       "Lookups answered locally because Redis was away.", k.directory_unreachable + d.unreachable},
      {"served_chunks", "dpukv_cluster_served_chunks_total", "counter",
       "Chunks shown to other agents for reading.", k.served_chunks},
      {"served_bytes", "dpukv_cluster_served_bytes_total", "counter",
       "Bytes of chunks shown to other agents.", k.served_bytes},
      {"bad_peer_messages", "dpukv_cluster_bad_messages_total", "counter",
       "Malformed or unmatched control messages from other agents.", k.bad_messages},
      {"pins_expired", "dpukv_cluster_pins_expired_total", "counter",
       "Chunks pinned for a reader that never unpinned them (released by the lend timeout).",
       k.pins_expired},
      {"peers_failed", "dpukv_cluster_peers_failed_total", "counter",
       "Connections to other agents that failed.", k.peers_failed},
      {"peers_forgotten", "dpukv_cluster_peers_forgotten_total", "counter",
       "Peers dropped from the peer list after they left the cluster.", k.peers_forgotten},
      {"directory_published", "dpukv_cluster_published_total", "counter",
       "Chunk entries the directory's Redis took.", d.published},
      {"directory_publish_failures", "dpukv_cluster_publish_failures_total", "counter",
       "Directory edits Redis refused (e.g. an ACL without EVAL: NOPERM) or that were lost.",
       d.publish_failures},
      {"directory_replica_keys", "dpukv_cluster_directory_replica_keys", "gauge",
       "Chunks in this agent's replica of the directory (about 110 bytes each).",
       s.cluster->replica_keys},
      {"directory_replica_ready", "dpukv_cluster_directory_replica_ready", "gauge",
       "1 while lookups are answered from the replica (0: they ask Redis).",
       s.cluster->replica_ready ? 1u : 0u},
      {"directory_lookups_local", "dpukv_cluster_directory_lookups_local_total", "counter",
       "Directory lookups answered from this agent's replica (no round trip).", d.lookups_local},
      {"directory_bad_entries", "dpukv_cluster_directory_bad_entries_total", "counter",
       "Holder lists in Redis that were not one (too long, malformed): ignored and deleted.",
       d.bad_entries},
      {"directory_syncs", "dpukv_cluster_directory_syncs_total", "counter",
       "Times the directory replica was rebuilt from a scan of the entries.", d.syncs},
      {"directory_bad_events", "dpukv_cluster_directory_bad_events_total", "counter",
       "Malformed messages on the directory's event channel (ignored).", d.bad_events},
      {"pushed_chunks", "dpukv_cluster_pushed_chunks_total", "counter",
       "Chunks other agents took when this one pushed them (prefill to decode).", k.pushed_chunks},
      {"offered_chunks", "dpukv_cluster_offered_chunks_total", "counter",
       "Chunks this agent took when others pushed them.", k.offered_chunks},
      {"remote_tier_puts", "dpukv_remote_tier_puts_total", "counter",
       "Chunks written to the remote tier (Redis values Redis accepted).", d.values_put},
      {"remote_tier_put_failures", "dpukv_remote_tier_put_failures_total", "counter",
       "Remote tier writes Redis refused (maxmemory, ACL) or that were lost with the "
       "connection.",
       d.value_put_failures},
      {"directory_lookup_timeouts", "dpukv_cluster_directory_lookup_timeouts_total", "counter",
       "Directory lookups Redis did not answer within cluster_lookup_timeout_ms (misses).",
       d.lookup_timeouts},
      {"directory_errors", "dpukv_cluster_directory_errors_total", "counter",
       "Directory commands Redis refused or that got no reply.", d.errors},
      {"remote_tier_hits", "dpukv_remote_tier_hits_total", "counter",
       "Chunks read from the remote tier and kept.", k.tier_hits},
      {"remote_tier_bytes", "dpukv_remote_tier_bytes_total", "counter",
       "Bytes read from the remote tier.", k.tier_bytes},
      {"remote_tier_rejects", "dpukv_remote_tier_rejects_total", "counter",
       "Remote tier values refused (malformed, or not matching their checksum).", k.tier_rejects},
      {"remote_tier_fallbacks", "dpukv_remote_tier_fallbacks_total", "counter",
       "Lookups whose listed holders failed them and that asked the remote tier.",
       k.tier_fallbacks},
  };
  rows.insert(rows.end(), cluster_rows.begin(), cluster_rows.end());
  return rows;
}

std::string format_stats_json(const AgentStatsSources& s) {
  std::string out = std::string("{\"version\":\"") + kDpukvVersion + "\"";
  out += ",\"gpu_path\":\"" + json_escape(s.gpu_path) + "\"";
  for (const MetricRow& m : metric_rows(s))
    out += ",\"" + std::string(m.json) + "\":" + std::to_string(m.value);
  if (s.cluster) {
    char node[32];
    std::snprintf(node, sizeof(node), "%016llx",
                  static_cast<unsigned long long>(s.cluster->node_id));
    out += ",\"cluster_node\":\"" + std::string(node) + "\"";
    if (!s.cluster->directory_connected)
      out +=
          ",\"cluster_directory_error\":\"" + json_escape(s.cluster->directory_down_reason) + "\"";
    out += ",\"peers\":[";
    bool first = true;
    for (const ClusterNode::PeerStats& p : s.cluster->peers) {
      std::snprintf(node, sizeof(node), "%016llx", static_cast<unsigned long long>(p.node));
      out += std::string(first ? "" : ",") + "{\"node\":\"" + node +
             "\",\"connected\":" + (p.connected ? "true" : "false") +
             ",\"fetched\":" + std::to_string(p.fetched) +
             ",\"fetched_bytes\":" + std::to_string(p.fetched_bytes) +
             ",\"served\":" + std::to_string(p.served) +
             ",\"served_bytes\":" + std::to_string(p.served_bytes) +
             ",\"errors\":" + std::to_string(p.errors) + "}";
      first = false;
    }
    out += "]";
  }
  if (!s.asker_tenant.empty())
    out += ",\"tenant\":\"" + json_escape(s.asker_tenant) +
           "\",\"admin\":" + (s.asker_admin ? "true" : "false");
  out += ",\"tenants\":[";
  for (size_t i = 0; i < s.tenants.size(); ++i) {
    const AgentStatsSources::TenantRow& t = s.tenants[i];
    char tag[16];
    std::snprintf(tag, sizeof(tag), "%08x", t.tag);
    out += std::string(i ? "," : "") + "{\"name\":\"" + json_escape(t.name) + "\",\"tag\":\"" +
           tag + "\",\"clients\":" + std::to_string(t.clients) +
           ",\"chunks\":" + std::to_string(t.use.chunks) +
           ",\"memory_bytes\":" + std::to_string(t.use.memory_bytes) +
           ",\"disk_bytes\":" + std::to_string(t.use.disk_bytes) +
           ",\"memory_quota\":" + std::to_string(t.use.memory_quota) +
           ",\"disk_quota\":" + std::to_string(t.use.disk_quota) +
           ",\"quota_evictions\":" + std::to_string(t.use.quota_evictions) +
           ",\"staging_bytes\":" + std::to_string(t.staging_bytes) +
           ",\"staging_quota\":" + std::to_string(t.staging_quota) + "}";
  }
  out += "]";
  const LatencyHistogram& l = s.latencies.lookup;
  char buf[64];
  std::snprintf(buf, sizeof(buf), ",\"lookup_mean_us\":%.2f}", l.n ? l.sum / l.n * 1e6 : 0.0);
  return out + buf;
}

namespace {
// A Prometheus label value: backslash, quote and newline escaped.
std::string prom_label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}
}  // namespace

std::string format_metrics_text(const AgentStatsSources& s) {
  std::string out =
      std::string(
          "# HELP dpukv_build_info The agent's version.\n# TYPE dpukv_build_info gauge\n"
          "dpukv_build_info{version=\"") +
      kDpukvVersion + "\"} 1\n";
  for (const MetricRow& m : metric_rows(s)) {
    if (m.prom == nullptr) continue;
    out += std::string("# HELP ") + m.prom + " " + m.help + "\n# TYPE " + m.prom + " " + m.type +
           "\n" + m.prom + " " + std::to_string(m.value) + "\n";
  }
  auto histogram = [&](const char* name, const LatencyHistogram& h) {
    out += std::string("# HELP ") + name + " Request latency in seconds.\n# TYPE " + name +
           " histogram\n";
    uint64_t cum = 0;
    const size_t nb = LatencyHistogram::kNumBuckets;
    for (size_t i = 0; i < nb; ++i) {
      cum += h.counts[i];
      out += std::string(name) + "_bucket{le=\"" + std::to_string(LatencyHistogram::kBuckets[i]) +
             "\"} " + std::to_string(cum) + "\n";
    }
    cum += h.counts[nb];
    out += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
    out += std::string(name) + "_sum " + std::to_string(h.sum) + "\n" + name + "_count " +
           std::to_string(h.n) + "\n";
  };
  if (s.cluster) {
    const std::vector<ClusterNode::PeerStats>& peers = s.cluster->peers;
    auto per_peer = [&](const char* name, const char* help, uint64_t ClusterNode::PeerStats::*f) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n";
      char node[32];
      for (const ClusterNode::PeerStats& p : peers) {
        std::snprintf(node, sizeof(node), "%016llx", static_cast<unsigned long long>(p.node));
        out += std::string(name) + "{peer=\"" + node + "\"} " + std::to_string(p.*f) + "\n";
      }
    };
    per_peer("dpukv_peer_fetched_bytes_total", "Bytes read from this peer.",
             &ClusterNode::PeerStats::fetched_bytes);
    per_peer("dpukv_peer_served_bytes_total", "Bytes this peer was shown to read.",
             &ClusterNode::PeerStats::served_bytes);
    per_peer("dpukv_peer_errors_total", "Failed asks and reads with this peer.",
             &ClusterNode::PeerStats::errors);
  }
  auto per_tenant = [&](const char* name, const char* type, const char* help,
                        uint64_t (*f)(const AgentStatsSources::TenantRow&)) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const AgentStatsSources::TenantRow& t : s.tenants)
      out += std::string(name) + "{tenant=\"" + prom_label(t.name) + "\"} " + std::to_string(f(t)) +
             "\n";
  };
  if (!s.tenants.empty()) {
    per_tenant("dpukv_tenant_memory_bytes", "gauge", "Bytes of the tenant's chunks in memory.",
               [](const AgentStatsSources::TenantRow& t) { return t.use.memory_bytes; });
    per_tenant("dpukv_tenant_disk_bytes", "gauge", "Bytes of the tenant's chunks on disk.",
               [](const AgentStatsSources::TenantRow& t) { return t.use.disk_bytes; });
    per_tenant("dpukv_tenant_chunks", "gauge", "The tenant's chunks in any tier.",
               [](const AgentStatsSources::TenantRow& t) { return t.use.chunks; });
    per_tenant("dpukv_tenant_memory_quota_bytes", "gauge",
               "The tenant's share of the memory tier (0: none).",
               [](const AgentStatsSources::TenantRow& t) { return t.use.memory_quota; });
    per_tenant("dpukv_tenant_disk_quota_bytes", "gauge",
               "The tenant's share of the disk tier (0: none).",
               [](const AgentStatsSources::TenantRow& t) { return t.use.disk_quota; });
    per_tenant("dpukv_tenant_quota_evictions_total", "counter",
               "The tenant's own chunks that left a tier for its quota.",
               [](const AgentStatsSources::TenantRow& t) { return t.use.quota_evictions; });
    per_tenant("dpukv_tenant_clients", "gauge", "Connected clients of the tenant.",
               [](const AgentStatsSources::TenantRow& t) { return t.clients; });
    per_tenant("dpukv_tenant_staging_bytes", "gauge",
               "Staging memory (host and GPU) the tenant's clients exported.",
               [](const AgentStatsSources::TenantRow& t) { return t.staging_bytes; });
    per_tenant("dpukv_tenant_staging_quota_bytes", "gauge",
               "The tenant's share of staging memory (0: none).",
               [](const AgentStatsSources::TenantRow& t) { return t.staging_quota; });
  }
  histogram("dpukv_store_batch_seconds", s.latencies.store);
  histogram("dpukv_retrieve_batch_seconds", s.latencies.retrieve);
  histogram("dpukv_lookup_seconds", s.latencies.lookup);
  return out;
}

}  // namespace dpukv
