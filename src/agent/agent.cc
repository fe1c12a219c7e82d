#include "agent/agent.h"

#include <sys/random.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "agent/agent_cluster_ops.h"
#include "agent/agent_session.h"
#include "agent/metrics_server.h"
#include "protocol/agent_wire.h"
#include "protocol/tenant_key.h"
#include "runtime/log.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

Status Agent::create(const AgentOptions& o, std::unique_ptr<Agent>* out) {
  std::unique_ptr<Agent> a(new Agent());
  a->opts_ = o;
  if (a->opts_.socket_path.empty()) a->opts_.socket_path = default_socket_path();
  DPUKV_RETURN_IF_ERROR(ProgressEngine::create(&a->pe_));
  Status st = CacheEngine::create(a->pe_.get(), a->opts_.cache, &a->cache_);
  if (!st.ok()) {
    LOG_ERR("agent: cache engine: %s", std::string(st.description()).c_str());
    return st;
  }
  a->gpu_ = std::make_unique<GpuService>(a->pe_.get(), a->cache_.get(), a->opts_.gpu);
  std::string why;
  st = Tenants::create(a->opts_.tenancy, &a->tenants_, &why);
  if (!st.ok()) {
    LOG_ERR("agent: tenants: %s", why.c_str());
    return st;
  }
  // The main socket, then each tenant's own.
  a->doors_.push_back(std::make_unique<Door>());
  a->doors_.back()->path = a->opts_.socket_path;
  for (size_t i = 0; i < a->tenants_->sockets().size(); ++i) {
    a->doors_.push_back(std::make_unique<Door>());
    a->doors_.back()->path = a->tenants_->sockets()[i].first;
    a->doors_.back()->socket = static_cast<int>(i);
  }
  for (auto& door : a->doors_) {
    door->agent = a.get();
    DPUKV_RETURN_IF_ERROR(a->open_door(door.get()));
  }
  a->server_ = a->doors_.front()->server.get();
  for (const auto& t : a->tenants_->all())
    a->cache_->set_tenant_quota(t->tag, t->memory_quota, t->disk_quota);
  const uint32_t max_entries = a->opts_.max_msg / sizeof(IoEntry) + 1;
  a->lookup_keys_.reserve(a->opts_.max_msg / sizeof(ChunkKey) + 1);
  // Plus rows: a RETRIEVE_ROWS chunk takes a buffer per row (kMaxRowsPerChunk at
  // most); a batch waits for buffers as it waits for cache requests (can_submit).
  DPUKV_RETURN_IF_ERROR(BufInventory::create(
      a->opts_.cache.max_requests + 64 * (agent::kMaxRowsPerChunk + 1), &a->inv_));
  BatchIo::Parts parts;
  parts.cache = a->cache_.get();
  parts.gpu = a->gpu_.get();
  parts.inv = a->inv_.get();
  parts.counters = &a->counters_;
  parts.latencies = &a->latencies_;
  parts.max_chunk_bytes = a->opts_.cache.max_chunk_bytes;
  BatchIo::Host* host = a.get();  // a private base: the agent is the only one to hand it out
  a->populator_ = std::make_unique<ExportPopulator>(host, &a->counters_.populated_bytes);
  a->events_ =
      std::make_unique<EventPublisher>(host, a->cache_.get(), &a->counters_, a->opts_.max_msg);
  a->batch_io_ = std::make_unique<BatchIo>(host, parts, a->opts_.max_batches, max_entries);
  if (a->opts_.cluster) {
    st = ClusterNode::create(a->pe_.get(), a->cache_.get(), a->opts_.cluster_options, &a->cluster_);
    if (!st.ok()) {
      LOG_ERR("agent: cluster: %s", std::string(st.description()).c_str());
      return st;
    }
  }
  if (a->opts_.metrics_port > 0) {
    Agent* self = a.get();
    DPUKV_RETURN_IF_ERROR(MetricsServer::create(
        a->pe_.get(), a->opts_.metrics_address, a->opts_.metrics_port,
        [self] { return self->metrics_text(); }, &a->metrics_server_));
    a->metrics_port_ = a->metrics_server_->port();
  }
  *out = std::move(a);
  return Code::kSuccess;
}

// One listening socket and its server: the main socket, or a tenant's own.
Status Agent::open_door(Door* d) {
  ComchServerOptions so;
  so.path = d->path;
  so.mode = opts_.socket_mode;
  so.max_msg_size = opts_.max_msg;
  so.heartbeat_interval_ms = opts_.heartbeat_ms;
  so.max_connections = opts_.max_clients;
  so.max_connections_per_uid = opts_.max_clients_per_uid;
  so.send_queue_depth = 1024;
  if (opts_.max_staging_bytes) so.max_import_bytes_per_connection = opts_.max_staging_bytes;
  // max_staging_total spans every socket: staging_allowed checks it, not each server.
  so.admit_peer = [](void* arg, const PeerCred& p) {
    auto* door = static_cast<Door*>(arg);
    std::string why;
    if (door->agent->tenants_->resolve(p, door->socket, &why) != nullptr) return true;
    LOG_WARN_LIMITED("agent: uid %u refused on %s: %s", p.uid, door->path.c_str(), why.c_str());
    return false;
  };
  so.admit_arg = d;
  so.import_allowed = &Agent::staging_allowed;
  so.import_arg = d;
  DPUKV_RETURN_IF_ERROR(ComchServer::create(pe_.get(), so, &d->server));
  UserData ud;
  ud.ptr = d;
  DPUKV_RETURN_IF_ERROR(d->server->set_user_data(ud));
  ComchCallbacks cb;
  cb.on_connect = &Agent::on_connect;
  cb.on_disconnect = &Agent::on_disconnect;
  cb.on_recv = &Agent::on_recv;
  cb.on_export = &Agent::on_export;
  cb.on_send_done = &Agent::on_send_done;
  cb.on_send_error = &Agent::on_send_done;
  DPUKV_RETURN_IF_ERROR(d->server->set_callbacks(cb));
  DPUKV_RETURN_IF_ERROR(d->server->set_send_conf(512));  // replies in flight over all clients
  return Code::kSuccess;
}

void Agent::stop_doors() {
  for (auto& d : doors_) (void)d->server->stop();
  for (auto& d : doors_)
    while (d->server->state() != CtxState::kIdle) pe_->progress();
}

Agent::~Agent() {
  metrics_server_.reset();  // before the progress engine it watches
}

Status Agent::run(const std::atomic<bool>* stop) {
  DPUKV_RETURN_IF_ERROR(gpu_->start());
  DPUKV_RETURN_IF_ERROR(cache_->start());
  Status st;
  for (auto& d : doors_) {
    st = d->server->start();
    if (st.ok()) continue;
    LOG_ERR("agent: cannot serve on %s: %s", d->path.c_str(),
            std::string(st.description()).c_str());
    stop_doors();
    (void)cache_->stop();
    while (cache_->state() != CtxState::kIdle) pe_->progress();
    (void)gpu_->stop();
    while (!gpu_->idle()) pe_->progress();
    return st;
  }
  if (cluster_) {
    st = cluster_->start();
    if (!st.ok()) {
      LOG_ERR("agent: cannot join the cluster: %s", std::string(st.description()).c_str());
      stop_doors();
      (void)cache_->stop();
      while (cache_->state() != CtxState::kIdle) pe_->progress();
      (void)gpu_->stop();
      while (!gpu_->idle()) pe_->progress();
      return st;
    }
    APP_LOG_INFO("agent: cluster node %016llx, directory redis://%s:%u (prefix %s)",
                 static_cast<unsigned long long>(cluster_->node_id()),
                 opts_.cluster_options.redis_host.c_str(), opts_.cluster_options.redis_port,
                 opts_.cluster_options.prefix.c_str());
  }
  const CacheStats cs = cache_->stats();
  APP_LOG_INFO(
      "agent: serving on %s; memory tier %llu MiB%s; %llu chunks recovered from disk",
      opts_.socket_path.c_str(), static_cast<unsigned long long>(cs.memory_capacity >> 20),
      opts_.cache.disk_dir.empty() ? "" : (", disk tier in " + opts_.cache.disk_dir).c_str(),
      static_cast<unsigned long long>(cs.recovered));
  if (on_ready_) on_ready_();
  uint64_t next_tick = monotonic_ns();
  while (!stop->load(std::memory_order_relaxed)) {
    // While exports are being faulted in, a step per turn between polls, never asleep.
    if (populator_->idle()) {
      pe_->wait(50000, 100);
    } else {
      pe_->progress();
      populator_->step();
    }
    const uint64_t now = monotonic_ns();
    events_->tick(now);
    if (now < next_tick) continue;
    next_tick = now + 100000000ull;
    if (metrics_server_) metrics_server_->sweep();
    if (on_tick_) on_tick_();
  }
  populator_->drop_all();
  APP_LOG_INFO("agent: stopping");
  metrics_server_.reset();
  stop_doors();
  if (cluster_) {
    (void)cluster_->stop();
    while (cluster_->state() != CtxState::kIdle) pe_->progress();
  }
  // The cache drains its device copies before the copy engine stops.
  (void)cache_->stop();
  while (cache_->state() != CtxState::kIdle) pe_->progress();
  (void)gpu_->stop();
  while (!gpu_->idle()) pe_->progress();
  return cache_->sync();
}

void Agent::on_send_done(ComchSendTask* t, UserData, UserData ud) {
  (void)static_cast<Door*>(ud.ptr)->server->free(t);
}

void Agent::on_recv(ComchConnection* c, const uint8_t* d, uint32_t n, UserData ud) {
  static_cast<Door*>(ud.ptr)->agent->handle(static_cast<Session*>(c->user_data().ptr), d, n);
}

// The answer is written straight into the send task's buffer: one copy of the body.
// A body over the connection's message bound is not cut short (a client would read
// a count its bytes do not hold): it is refused as TOO_BIG, said and counted.
void Agent::reply(Session* s, const AgentHeader& req, Status st, const void* body, uint32_t len) {
  if (s->gone) return;
  AgentHeader h = req;
  h.op = static_cast<uint16_t>(req.op | agent::kResponse);
  h.status = static_cast<uint8_t>(st.code());
  h.count = len;
  ComchSendTask* t = nullptr;
  uint8_t* out = nullptr;
  Status ss = s->server->send_alloc_payload(s->conn, static_cast<uint32_t>(sizeof(h)) + len,
                                            UserData{}, &t, &out);
  if (ss == Code::kTooBig && len > 0) {
    ++counters_.oversized_replies;
    LOG_ERR_LIMITED(
        "agent: answer to op %u is %u bytes, over the message bound of %u: sent TOO_BIG", req.op,
        len, s->conn->max_msg());
    reply(s, req, Code::kTooBig, nullptr, 0);
    return;
  }
  if (ss.ok()) {
    std::memcpy(out, &h, sizeof(h));
    if (len) std::memcpy(out + sizeof(h), body, len);
    ss = s->server->submit(t);
    if (!ss.ok()) (void)s->server->free(t);
  }
  // A failed send may itself have closed the connection (the peer died): then the
  // disconnect event has already run and the session is gone.
  if (!ss.ok() && !s->gone) {
    // A client that does not read its responses is not kept waiting for.
    LOG_WARN_LIMITED("agent: cannot answer client pid %d (%s); disconnecting",
                     static_cast<int>(s->conn->peer().pid), std::string(ss.name()).c_str());
    s->server->disconnect(s->conn);
  }
}

// ---- requests: one row per op --------------------------------------------------
//
// Each op's row names the shape its body must have (checked before its handler
// runs: a request of another shape is malformed, counted and refused) and the
// handler, which then reads the body without checking its length again.

namespace {

// count entries of `size` bytes make up the whole body.
bool entries(const AgentHeader& h, uint32_t body_len, size_t size) {
  return h.count <= body_len / size && static_cast<uint64_t>(h.count) * size == body_len;
}
bool one_hello(const AgentHeader& h, const uint8_t*, uint32_t len) {
  return h.count == 1 && entries(h, len, sizeof(agent::HelloEntry));
}
bool io_entries(const AgentHeader& h, const uint8_t*, uint32_t len) {
  return h.count > 0 && entries(h, len, sizeof(IoEntry));
}
bool keys(const AgentHeader& h, const uint8_t*, uint32_t len) {
  return entries(h, len, sizeof(ChunkKey));
}
bool push_body(const AgentHeader& h, const uint8_t*, uint32_t len) {
  return h.count > 0 && h.count <= agent::kMaxPushKeys &&
         len == sizeof(agent::PushHeader) + static_cast<uint64_t>(h.count) * sizeof(ChunkKey);
}
bool one_gpu_export(const AgentHeader& h, const uint8_t*, uint32_t len) {
  return h.count == 1 && entries(h, len, sizeof(agent::GpuExportEntry));
}
bool one_map_id(const AgentHeader& h, const uint8_t*, uint32_t len) {
  return h.count == 1 && entries(h, len, sizeof(uint64_t));
}
bool empty(const AgentHeader& h, const uint8_t*, uint32_t len) {
  return h.count == 0 && len == 0;
}
bool rows_body(const AgentHeader& h, const uint8_t* body, uint32_t len) {
  agent::RowsHeader rh;
  uint64_t rows;
  return agent::rows_body_valid(h.count, body, len, &rh, &rows);
}

}  // namespace

const Agent::OpHandler Agent::kOps[] = {
    {Op::kHello, &one_hello, &Agent::on_hello},
    {Op::kStore, &io_entries, &Agent::on_io},
    {Op::kRetrieve, &io_entries, &Agent::on_io},
    {Op::kLookup, &keys, &Agent::on_lookup},
    {Op::kContains, &keys, &Agent::on_keys},
    {Op::kRemove, &keys, &Agent::on_keys},
    {Op::kPrefetch, &keys, &Agent::on_keys},
    {Op::kUnpin, &keys, &Agent::on_keys},
    {Op::kStats, &empty, &Agent::on_stats},
    {Op::kClear, &empty, &Agent::on_clear},
    {Op::kPush, &push_body, &Agent::on_push},
    {Op::kGpuExport, &one_gpu_export, &Agent::on_gpu_export},
    {Op::kGpuRelease, &one_map_id, &Agent::on_gpu_release},
    {Op::kSubscribe, &empty, &Agent::on_subscribe},
    {Op::kGpuProof, &empty, &Agent::on_gpu_proof},
    {Op::kRetrieveRows, &rows_body, &Agent::on_rows},
    // kEvents is the agent's to send, never a request: it has no row.
};

// Every tenant's events, or every tenant's chunks cleared: an admin's (kAllTenants).
void Agent::on_subscribe(Session* s, const AgentHeader& h, const uint8_t*, uint32_t) {
  const bool all = (h.flags & agent::kAllTenants) != 0;
  if (all && !s->admin) {
    ++counters_.not_permitted;
    reply(s, h, Code::kNotPermitted, nullptr, 0);
    return;
  }
  s->feed.all_tenants = all;
  events_->subscribe(s);
  reply(s, h, Code::kSuccess, nullptr, 0);
}

// Batch I/O is BatchIo's (batch_io.h); AGAIN when all its batches are in flight.
void Agent::on_io(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t) {
  if (!batch_io_->start(s, h, body).ok()) reply(s, h, Code::kAgain, nullptr, 0);
}

void Agent::on_rows(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t len) {
  if (!batch_io_->start_rows(s, h, body, len).ok()) reply(s, h, Code::kAgain, nullptr, 0);
}

void Agent::handle(Session* s, const uint8_t* d, uint32_t n) {
  ++counters_.requests;
  AgentHeader h{};
  if (n < sizeof(h)) {
    ++counters_.bad_requests;
    s->server->disconnect(s->conn);
    return;
  }
  std::memcpy(&h, d, sizeof(h));
  const uint8_t* body = d + sizeof(h);
  const uint32_t body_len = n - static_cast<uint32_t>(sizeof(h));
  if (h.version != agent::kProtocolVersion) {
    ++counters_.bad_requests;
    reply(s, h, Code::kNotSupported, nullptr, 0);
    return;
  }
  for (const OpHandler& row : kOps) {
    if (row.op != static_cast<Op>(h.op)) continue;
    if (!row.well_formed(h, body, body_len)) break;
    (this->*row.serve)(s, h, body, body_len);
    return;
  }
  ++counters_.bad_requests;
  LOG_WARN_LIMITED("agent: malformed request (op %u, %u entries, %u bytes) from pid %d", h.op,
                   h.count, body_len, static_cast<int>(s->conn->peer().pid));
  reply(s, h, Code::kInvalidValue, nullptr, 0);
}

void Agent::on_hello(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t) {
  agent::HelloEntry e;
  std::memcpy(&e, body, sizeof(e));
  s->model = e.model;
  const agent::HelloReply r{opts_.max_staging_bytes,
                            (gpu_->on() ? agent::kHelloGpu : 0) |
                                // The codec decodes into one buffer, not rows.
                                (opts_.cache.compress ? 0 : agent::kHelloRows)};
  reply(s, h, Code::kSuccess, &r, sizeof(r));
}

void Agent::on_gpu_export(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t len) {
  std::string why;
  const Status st = gpu_export(s, body, len, &why);
  reply(s, h, st, why.data(), static_cast<uint32_t>(why.size()));
}

void Agent::on_gpu_proof(Session* s, const AgentHeader& h, const uint8_t*, uint32_t) {
  if (::getrandom(s->proof, sizeof(s->proof), 0) != static_cast<ssize_t>(sizeof(s->proof))) {
    s->has_proof = false;
    reply(s, h, Code::kIoFailed, nullptr, 0);
    return;
  }
  s->has_proof = true;
  reply(s, h, Code::kSuccess, s->proof, sizeof(s->proof));
}

void Agent::on_gpu_release(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t) {
  uint64_t map_id;
  std::memcpy(&map_id, body, sizeof(map_id));
  const Status st = gpu_->remove(&s->gpu, map_id);
  s->conn->set_other_import_bytes(s->gpu.bytes);
  reply(s, h, st, nullptr, 0);
}

void Agent::on_clear(Session* s, const AgentHeader& h, const uint8_t*, uint32_t) {
  const bool all = (h.flags & agent::kAllTenants) != 0;
  if (all && !s->admin) {
    ++counters_.not_permitted;
    LOG_WARN_LIMITED("agent: client pid %d uid %u (tenant %s) may not clear every tenant",
                     static_cast<int>(s->conn->peer().pid), s->conn->peer().uid,
                     s->tenant->name.c_str());
    reply(s, h, Code::kNotPermitted, nullptr, 0);
    return;
  }
  const uint64_t removed = cache_->clear(s->model, all ? 0 : s->tenant->tag);
  APP_LOG_INFO("agent: client pid %d uid %u cleared %llu chunks%s%s",
               static_cast<int>(s->conn->peer().pid), s->conn->peer().uid,
               static_cast<unsigned long long>(removed), s->model ? " of its model" : "",
               all ? " of every tenant" : (" of tenant " + s->tenant->name).c_str());
  reply(s, h, Code::kSuccess, &removed, sizeof(removed));
}

void Agent::on_stats(Session* s, const AgentHeader& h, const uint8_t*, uint32_t) {
  // The asker's own connection is not counted; its tenant's figures (an admin's:
  // every tenant's).
  const std::string j = format_stats_json(stats_sources(true, s));
  reply(s, h, Code::kSuccess, j.data(), static_cast<uint32_t>(j.size()));
}

Status Agent::gpu_export(Session* s, const uint8_t* body, uint32_t len, std::string* why) {
  agent::GpuExportEntry e;
  if (len != sizeof(e)) return Code::kInvalidValue;
  std::memcpy(&e, body, sizeof(e));
  // Host and GPU staging count together, per client and over all clients.
  const char* over = nullptr;
  std::string over_limit;
  if (!s->server->import_fits(s->conn, e.bytes, &over))
    over_limit = std::string(over) + " (max_staging_size " +
                 std::to_string(opts_.max_staging_bytes) + ", max_staging_total " +
                 std::to_string(opts_.max_staging_total_bytes) + " bytes)";
  const Status st = gpu_->add(&s->gpu, e, s->has_proof ? s->proof : nullptr, over_limit, why);
  s->has_proof = false;  // one export per proof
  s->conn->set_other_import_bytes(s->gpu.bytes);
  if (st.ok()) {
    APP_LOG_INFO("agent: client pid %d exported %llu bytes of GPU memory",
                 static_cast<int>(s->conn->peer().pid), static_cast<unsigned long long>(e.bytes));
  } else {
    LOG_WARN_LIMITED("agent: GPU export of client pid %d refused (%s): %s",
                     static_cast<int>(s->conn->peer().pid), std::string(st.name()).c_str(),
                     why->c_str());
  }
  return st;
}

AgentStatsSources Agent::stats_sources(bool asker_connected, const Session* asker) const {
  AgentStatsSources s;
  if (asker != nullptr && asker->tenant != nullptr) {
    s.asker_tenant = asker->tenant->name;
    s.asker_admin = asker->admin;
  }
  std::vector<uint64_t> staging;
  (void)staging_bytes(&staging);
  for (const auto& t : tenants_->all()) {
    if (asker != nullptr && !asker->admin && t.get() != asker->tenant) continue;
    AgentStatsSources::TenantRow& row = s.tenants.emplace_back();
    row.name = t->name;
    row.tag = t->tag;
    row.clients = t->index < tenant_clients_.size() ? tenant_clients_[t->index] : 0;
    // As the clients figure: the asker's own connection is not counted.
    if (asker_connected && asker != nullptr && asker->tenant == t.get() && row.clients > 0)
      --row.clients;
    row.use = cache_->tenant_usage(t->tag);
    row.staging_quota = t->staging_quota;
    row.staging_bytes = t->index < staging.size() ? staging[t->index] : 0;
  }
  s.clients = connected_ - (asker_connected && connected_ > 0 ? 1 : 0);
  s.agent = counters_;
  s.agent.populating = populator_->waiting();
  s.cache = cache_->stats();
  if (metrics_server_) s.metrics_server = metrics_server_->counters();
  for (const auto& d : doors_) s.protocol_errors += d->server->counters().protocol_errors;
  s.event_subscribers = events_->subscribers();
  s.gpu_on = gpu_->on();
  s.gpu_path = gpu_->description();
  s.gpu = gpu_->counters();
  s.gpu_engine = gpu_->engine_counters();
  s.gpu_regions = gpu_->regions();
  if (cluster_) {
    ClusterStatsSnapshot& c = s.cluster.emplace();
    c.node_id = cluster_->node_id();
    c.node = cluster_->counters();
    c.directory = cluster_->directory_counters();
    c.directory_connected = cluster_->directory_connected();
    c.directory_down_reason = cluster_->directory_down_reason();
    c.replica_ready = cluster_->directory_replica_ready();
    c.live_nodes = cluster_->directory_live_nodes();
    c.replica_keys = cluster_->directory_replica_keys();
    c.peers = cluster_->peer_stats();
  }
  s.latencies = latencies_;
  return s;
}

std::string Agent::stats_json(bool asker_connected) const {
  return format_stats_json(stats_sources(asker_connected));
}

std::string Agent::metrics_text() const {
  return format_metrics_text(stats_sources(false));
}

}  // namespace dpukv
