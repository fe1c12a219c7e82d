// The offload agent: hosts the cache engine and its DMA context, serves host
// clients over comch, and exports Prometheus metrics. Everything runs on one
// progress-engine thread (the "DPU core"); the control plane (sessions,
// heartbeats, staging exports, metadata) lives here, not in the client.
//
// Isolation: a request may name only memory its own connection exported (others'
// map ids are NOT_PERMITTED), every offset and length is checked against that map,
// and a session that said HELLO with a model may name only keys of that model.
// A client that dies has its in-flight operations completed and dropped, its pins
// released and its imported memory unmapped once the last DMA on it finishes.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/agent_stats.h"
#include "agent/batch_io.h"
#include "agent/event_feed.h"
#include "agent/event_publisher.h"
#include "agent/export_populator.h"
#include "agent/gpu_service.h"
#include "agent/tenants.h"
#include "cache/cache_engine.h"
#include "cluster/cluster_node.h"
#include "comch/server.h"
#include "protocol/agent_wire.h"
#include "protocol/socket_path.h"
#include "protocol/version.h"

namespace dpukv {

struct AgentSession;

struct AgentOptions {
  std::string socket_path;  // default_socket_path() if empty
  mode_t socket_mode = 0660;
  CacheOptions cache;
  uint32_t heartbeat_ms = 1000;
  uint32_t max_msg = 65536;  // comch message bound (batches up to ~1150 entries)
  int metrics_port = 0;      // 0: no metrics endpoint
  std::string metrics_address = "127.0.0.1";
  uint32_t max_batches = 256;            // batch requests in flight over all clients
  uint32_t max_clients = 1024;           // connections (lowered to fit the descriptor limit)
  uint32_t max_clients_per_uid = 256;    // one uid's share of them (0: no share limit)
  uint64_t max_staging_bytes = 0;        // staging one client may export in all (0: no limit)
  uint64_t max_staging_total_bytes = 0;  // the same for all clients together (0: no limit)
  // Join a cluster: lookups that miss locally ask the directory and read the
  // missing chunks from the agents that hold them (cluster/cluster_node.h).
  bool cluster = false;
  ClusterOptions cluster_options;
  // Copies between the arena and clients' GPU memory (agent/gpu_service.h).
  GpuServiceOptions gpu;
  // Who shares chunks with whom (agent/tenants.h).
  TenancyOptions tenancy;
};

// The agent routes each request (agent.cc's kOps) to the part that serves it:
// batch I/O (batch_io.h), the event feed (event_publisher.h), the cache's key ops, the
// GPU service (gpu_service.h), the cluster node. It owns the sessions; the parts
// that hold one hand it back (SessionOwner, agent_session.h).
class Agent final : private BatchIo::Host {
 public:
  static Status create(const AgentOptions& o, std::unique_ptr<Agent>* out);
  ~Agent();

  // Serves until *stop becomes true (checked at least every 100 ms). Flushes the
  // disk index on the way out.
  Status run(const std::atomic<bool>* stop);

  const std::string& socket_path() const { return opts_.socket_path; }
  int metrics_port() const { return metrics_port_; }
  CacheStats cache_stats() const { return cache_->stats(); }
  // "on: GPU-…", or "off: " and why (agent/gpu_service.h).
  const std::string& gpu_path() const { return gpu_->description(); }
  // Called on the agent's thread once it serves (readiness), and about every 100 ms.
  void set_on_ready(std::function<void()> f) { on_ready_ = std::move(f); }
  void set_on_tick(std::function<void()> f) { on_tick_ = std::move(f); }
  std::string metrics_text() const;  // Prometheus text exposition
  // JSON of every counter; asker_connected: the asker's own connection is not
  // counted among the clients.
  std::string stats_json(bool asker_connected = false) const;

 private:
  using Session = AgentSession;
  // A socket clients come through: the main one (socket -1) or a tenant's own.
  struct Door {
    Agent* agent = nullptr;
    std::string path;
    int socket = -1;  // index of Tenants::sockets()
    std::unique_ptr<ComchServer> server;
  };
  Status open_door(Door* d);
  void stop_doors();
  static bool staging_allowed(void* arg, const ComchConnection* c, uint64_t more, const char** why);
  uint64_t staging_bytes(std::vector<uint64_t>* by_tenant) const;
  struct RemoteLookup;
  struct Push;
  // A snapshot of the figures agent_stats.h renders (asker_connected: a client
  // asked, and its own session is not counted among the clients).
  // asker: the session that asked (its tenant, and every tenant only for an admin);
  // null for the metrics endpoint (every tenant).
  AgentStatsSources stats_sources(bool asker_connected, const Session* asker = nullptr) const;
  Agent() = default;
  static void on_connect(ComchConnection* c, UserData ud);
  static void on_disconnect(ComchConnection* c, Status why, UserData ud);
  static void on_recv(ComchConnection* c, const uint8_t* d, uint32_t n, UserData ud);
  static void on_export(ComchConnection* c, Mmap* map, uint64_t cookie, UserData ud);
  static void on_send_done(ComchSendTask* t, UserData, UserData ud);
  void handle(Session* s, const uint8_t* d, uint32_t n);
  // The request handlers, one per op (agent.cc's kOps: each beside the body shape
  // it is given, already checked).
  using Handler = void (Agent::*)(Session* s, const agent::AgentHeader& h, const uint8_t* body,
                                  uint32_t len);
  struct OpHandler {
    agent::Op op;
    bool (*well_formed)(const agent::AgentHeader& h, const uint8_t* body, uint32_t body_len);
    Handler serve;
  };
  static const OpHandler kOps[];
  void on_hello(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_gpu_proof(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_io(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_rows(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_lookup(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_keys(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_push(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_gpu_export(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_gpu_release(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_subscribe(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_clear(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void on_stats(Session* s, const agent::AgentHeader& h, const uint8_t* body, uint32_t len);
  void reply(Session* s, const agent::AgentHeader& req, Status st, const void* body,
             uint32_t len) override;
  void release_session(Session* s) override;
  Status gpu_export(Session* s, const uint8_t* body, uint32_t len, std::string* why);
  static void remote_lookup_done(void* arg, uint32_t fetched);
  static void push_done(void* arg, Status st, const uint8_t* taken, uint32_t n);

  AgentOptions opts_;
  std::unique_ptr<ProgressEngine> pe_;
  std::unique_ptr<Tenants> tenants_;
  std::vector<std::unique_ptr<Door>> doors_;
  ComchServer* server_ = nullptr;  // the main socket's (doors_[0])
  std::unique_ptr<CacheEngine> cache_;
  std::unique_ptr<GpuService> gpu_;
  std::unique_ptr<ClusterNode> cluster_;
  std::vector<std::unique_ptr<RemoteLookup>> remote_lookups_;
  std::vector<RemoteLookup*> free_remote_lookups_;
  std::unique_ptr<BufInventory> inv_;
  AgentLatencies latencies_;
  std::unique_ptr<class MetricsServer> metrics_server_;
  std::function<void()> on_ready_, on_tick_;
  int metrics_port_ = 0;
  std::unique_ptr<BatchIo> batch_io_;
  std::unique_ptr<ExportPopulator> populator_;  // clients' dense exports faulted in
  AgentCounters counters_;
  std::vector<ChunkKey> lookup_keys_;       // reserved for the largest message
  std::unique_ptr<EventPublisher> events_;  // SUBSCRIBE / EVENTS
  uint64_t connected_ = 0;
  std::vector<uint64_t> tenant_clients_;  // by Tenant::index
};

}  // namespace dpukv
