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

#include "agent/metrics_server.h"
#include "protocol/agent_wire.h"
#include "protocol/tenant_key.h"
#include "runtime/log.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

struct Agent::Session {
  ComchConnection* conn = nullptr;
  ComchServer* server = nullptr;   // the socket it came through
  const Tenant* tenant = nullptr;  // its keys are folded with tenant->tag
  bool admin = false;              // may clear and watch every tenant
  uint64_t model = 0;              // 0: any
  bool gone = false;
  uint32_t pending = 0;  // batches in flight
  std::vector<ChunkKey> pinned;
  GpuService::Exports gpu;  // GPU memory it exported
  // The proof its next GPU export must hold (kGpuProof), while has_proof.
  uint8_t proof[agent::kGpuProofBytes] = {};
  bool has_proof = false;
  bool subscribed = false;  // sent the event feed
  FeedSubscriber feed;      // what of the feed it sees (its model and tenant)
};

// One batch request in flight: its entries complete independently.
struct Agent::Batch {
  Agent* agent = nullptr;
  Session* session = nullptr;
  AgentHeader hdr{};
  uint32_t remaining = 0;
  uint64_t start_ns = 0;
  std::vector<uint8_t> status;  // one Code per entry
  // The request's entries, copied once out of the message (which is gone by the
  // time a batch that waited for cache requests goes on). [next, count) are not yet
  // submitted.
  std::vector<IoEntry> entries;
  uint32_t next = 0;
  // RETRIEVE_ROWS: the rows' offsets into the map rows_hdr names; entry i's rows
  // are row_offsets[entries[i].offset, + entries[i].length). Grows once to the
  // largest such message a batch has carried, then is reused.
  bool rows = false;
  agent::RowsHeader rows_hdr{};
  std::vector<uint64_t> row_offsets;
  struct Slot {
    Batch* batch;
    uint32_t index;
  };
  std::vector<Slot> slots;
};

// A lookup whose local hits ended before its keys did, waiting for the cluster.
struct Agent::RemoteLookup {
  Agent* agent = nullptr;
  Session* session = nullptr;
  AgentHeader hdr{};
  std::vector<ChunkKey> keys;  // the keys after the local hits
  uint32_t local = 0;          // leading keys found locally
  bool pin = false;
  uint64_t start_ns = 0;
};

// A push to another agent, waiting for its answer.
struct Agent::Push {
  Agent* agent = nullptr;
  Session* session = nullptr;
  AgentHeader hdr{};
  std::vector<uint8_t> status;  // per key; keys not sent keep theirs
  std::vector<uint32_t> sent;   // positions of the keys offered
};

// Latency histograms.

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
  for (uint32_t i = 0; i < a->opts_.max_batches; ++i) {
    a->batches_.push_back(std::make_unique<Batch>());
    Batch* b = a->batches_.back().get();
    b->agent = a.get();
    b->status.resize(max_entries);
    b->entries.reserve(max_entries);
    b->slots.resize(max_entries);
    for (uint32_t k = 0; k < max_entries; ++k) b->slots[k] = {b, k};
    a->free_batches_.push_back(b);
  }
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

// Staging (host and GPU) the clients exported, over every socket: in all, and per
// tenant (by Tenant::index) into by_tenant if given. One pass over the
// connections: for exports (rare: a client's staging, at start) and figures.
uint64_t Agent::staging_bytes(std::vector<uint64_t>* by_tenant) const {
  struct Sum {
    std::vector<uint64_t>* by;
    uint64_t all;
  } sum{by_tenant, 0};
  for (const auto& d : doors_)
    d->server->for_each_connection(
        [](void* arg, const ComchConnection* c) {
          auto* s = static_cast<Sum*>(arg);
          const uint64_t n = c->imported_bytes() + c->other_import_bytes();
          s->all += n;
          const auto* cs = static_cast<const Session*>(c->user_data().ptr);
          if (s->by == nullptr || cs == nullptr || cs->tenant == nullptr) return;
          if (s->by->size() <= cs->tenant->index) s->by->resize(cs->tenant->index + 1);
          (*s->by)[cs->tenant->index] += n;
        },
        &sum);
  return sum.all;
}

// Staging over every socket of the agent (each server alone sees its own), and
// the client's tenant's share over all its clients.
bool Agent::staging_allowed(void* arg, const ComchConnection* c, uint64_t more, const char** why) {
  const Agent* a = static_cast<Door*>(arg)->agent;
  const auto* s = static_cast<const Session*>(c->user_data().ptr);
  const Tenant* mine = s != nullptr ? s->tenant : nullptr;
  std::vector<uint64_t> by_tenant;
  const uint64_t all = a->staging_bytes(&by_tenant);
  const uint64_t tenant =
      mine != nullptr && mine->index < by_tenant.size() ? by_tenant[mine->index] : 0;
  const uint64_t total_cap = a->opts_.max_staging_total_bytes;
  if (total_cap != 0 && (more > total_cap || all > total_cap - more)) {
    *why = "exported memory over the limit for all clients together";
    return false;
  }
  if (mine != nullptr && mine->staging_quota != 0 &&
      (more > mine->staging_quota || tenant > mine->staging_quota - more)) {
    *why = "exported memory over its tenant's staging share (tenant_staging_quota)";
    return false;
  }
  return true;
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
    if (populating_.empty()) {
      pe_->wait(50000, 100);
    } else {
      pe_->progress();
      populate_step();
    }
    const uint64_t now = monotonic_ns();
    // Events go out in batches: every 5 ms at most, or when a message is full.
    if (feed_.pending() != 0 &&
        (now - last_flush_ns_ >= 5000000ull || feed_.pending() >= opts_.max_msg / 40)) {
      last_flush_ns_ = now;
      flush_events();
    }
    if (now < next_tick) continue;
    next_tick = now + 100000000ull;
    if (metrics_server_) metrics_server_->sweep();
    if (on_tick_) on_tick_();
  }
  drop_populates();
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

void Agent::on_connect(ComchConnection* c, UserData ud) {
  auto* d = static_cast<Door*>(ud.ptr);
  Agent* a = d->agent;
  auto* s = new Session();
  s->conn = c;
  s->server = d->server.get();
  std::string why;
  s->tenant = a->tenants_->resolve(c->peer(), d->socket, &why);  // let in at accept: found
  s->admin = a->tenants_->admin(c->peer());
  if (s->tenant != nullptr) {
    a->cache_->set_tenant_quota(s->tenant->tag, s->tenant->memory_quota, s->tenant->disk_quota);
    if (a->tenant_clients_.size() <= s->tenant->index)
      a->tenant_clients_.resize(s->tenant->index + 1);
    ++a->tenant_clients_[s->tenant->index];
  }
  UserData su;
  su.ptr = s;
  c->set_user_data(su);
  ++a->connected_;
  ++a->counters_.sessions_opened;
  APP_LOG_INFO("agent: client pid %d uid %u connected, tenant %s%s",
               static_cast<int>(c->peer().pid), c->peer().uid,
               s->tenant ? s->tenant->name.c_str() : "?", s->admin ? " (admin)" : "");
  if (s->tenant == nullptr) s->server->disconnect(c);
}

void Agent::on_disconnect(ComchConnection* c, Status why, UserData ud) {
  Agent* a = static_cast<Door*>(ud.ptr)->agent;
  auto* s = static_cast<Session*>(c->user_data().ptr);
  --a->connected_;
  ++a->counters_.sessions_closed;
  if (s->tenant != nullptr) --a->tenant_clients_[s->tenant->index];
  APP_LOG_INFO("agent: client pid %d disconnected (%s); %u requests in flight",
               static_cast<int>(c->peer().pid), std::string(why.name()).c_str(), s->pending);
  if (!s->pinned.empty())
    a->cache_->unpin(s->pinned.data(), static_cast<uint32_t>(s->pinned.size()));
  s->pinned.clear();
  a->unsubscribe(s);
  // Its GPU memory is closed now, or (with copies in flight) when they finish.
  a->gpu_->remove_all(&s->gpu);
  s->gone = true;
  s->conn = nullptr;
  a->release_session(s);
}

void Agent::release_session(Session* s) {
  if (s->gone && s->pending == 0) delete s;
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

void Agent::op_done(void* arg, Status st) {
  auto* slot = static_cast<Batch::Slot*>(arg);
  Batch* b = slot->batch;
  Agent* a = b->agent;
  b->status[slot->index] = static_cast<uint8_t>(st.code());
  if (--b->remaining == 0) a->finish_batch(b);
  // The cache freed this request before calling back: a stalled batch goes on.
  a->resume_stalled();
}

// Batches that waited for cache requests, oldest first. Not re-entered: a
// completion the submission itself causes (a request that fails at once) only
// frees a request for the loop already running.
void Agent::resume_stalled() {
  if (resuming_) return;
  resuming_ = true;
  while (!stalled_.empty() && can_submit()) {
    Batch* b = stalled_.front();
    stalled_.pop_front();
    submit_entries(b, /*fresh=*/false);
  }
  resuming_ = false;
}

// Submits a store or retrieve batch's entries from b->next on (fresh: the batch
// just arrived). A burst beyond the cache's request pool (a 32k-token prefix is
// 4,096 chunks) waits for requests to finish rather than failing entries with
// AGAIN: backpressure, as a DOCA task pool gives it.
void Agent::submit_entries(Batch* b, bool fresh) {
  Session* s = b->session;
  const Op op = static_cast<Op>(b->hdr.op);
  for (; b->next < b->hdr.count; ++b->next) {
    const uint32_t i = b->next;
    const IoEntry& e = b->entries[i];
    if (s->gone) {  // its GPU memory is closed and nobody reads the answer
      b->status[i] = static_cast<uint8_t>(Code::kConnectionReset);
      --b->remaining;
      continue;
    }
    // A new batch also waits behind batches already waiting: first come, first served.
    if (!can_submit() || (fresh && !stalled_.empty())) {
      if (fresh) {
        ++counters_.stalled_batches;
        stalled_.push_back(b);
      } else {
        stalled_.push_front(b);  // resumed and out of requests again: still the oldest
      }
      return;
    }
    const Status st =
        b->rows ? submit_rows_entry(s, *b, e, &b->slots[i]) : submit_entry(s, op, e, &b->slots[i]);
    if (st.ok()) continue;  // completes through op_done
    b->status[i] = static_cast<uint8_t>(st.code());
    --b->remaining;
  }
  if (--b->remaining == 0) finish_batch(b);
}

// One entry of a store or retrieve, checked against what its session may name.
Status Agent::submit_entry(Session* s, Op op, const IoEntry& e, void* slot) {
  ChunkKey key;
  Status st = scope_key(s, e.key, &key);
  if (st == Code::kNotPermitted) ++counters_.not_permitted;
  if (!st.ok()) return st;
  if ((e.map_id & agent::kGpuMapBit) != 0) {  // the client's GPU memory
    DeviceRange r;
    st = gpu_->range(s->gpu, e.map_id, e.offset, e.length, &r);
    if (st == Code::kNotPermitted) ++counters_.not_permitted;
    if (!st.ok()) return st;
    return op == Op::kStore ? cache_->store_device(key, r, &Agent::op_done, slot)
                            : cache_->retrieve_device(key, r, &Agent::op_done, slot);
  }
  Mmap* m = s->conn->imported_map(e.map_id);
  Buf* buf = nullptr;
  if (m == nullptr) {
    ++counters_.not_permitted;
    return Code::kNotPermitted;  // not memory this client exported
  }
  if (e.length == 0 || e.offset > m->length() || e.length > m->length() - e.offset)
    return Code::kInvalidValue;
  if (e.length > opts_.cache.max_chunk_bytes && op == Op::kStore) return Code::kTooBig;
  st = op == Op::kStore ? inv_->get_by_data(m, m->addr() + e.offset, e.length, &buf)
                        : inv_->get_by_addr(m, m->addr() + e.offset, e.length, &buf);
  if (!st.ok()) return st;
  st = op == Op::kStore ? cache_->store(key, buf, &Agent::op_done, slot)
                        : cache_->retrieve(key, buf, &Agent::op_done, slot);
  (void)buf->dec_refcount();  // the cache holds its own reference
  return st;
}

// A cache request, and buffers for a chunk's rows, are free.
bool Agent::can_submit() const {
  return cache_->requests_free() > 0 && inv_->num_free() >= agent::kMaxRowsPerChunk;
}

// One chunk of a RETRIEVE_ROWS batch: its rows, checked against the map the session
// exported, chained into one destination list.
Status Agent::submit_rows_entry(Session* s, const Batch& b, const IoEntry& e, void* slot) {
  ChunkKey key;
  Status st = scope_key(s, e.key, &key);
  if (st == Code::kNotPermitted) ++counters_.not_permitted;
  if (!st.ok()) return st;
  if ((e.map_id & agent::kGpuMapBit) != 0) return Code::kNotSupported;  // host memory only
  Mmap* m = s->conn->imported_map(e.map_id);
  if (m == nullptr) {
    ++counters_.not_permitted;
    return Code::kNotPermitted;
  }
  const uint64_t row = b.rows_hdr.row_bytes;
  Buf* head = nullptr;
  for (uint64_t r = e.offset; r < e.offset + e.length; ++r) {
    const uint64_t off = b.row_offsets[r];
    Buf* buf = nullptr;
    if (off > m->length() || row > m->length() - off) {
      st = Code::kInvalidValue;
    } else {
      st = inv_->get_by_addr(m, m->addr() + off, row, &buf);
      if (st.ok() && head != nullptr) st = buf_chain_list(head, buf);
    }
    if (!st.ok()) {
      if (buf != nullptr && buf != head) (void)buf->dec_refcount();
      if (head != nullptr) (void)head->dec_refcount();
      return st;
    }
    if (head == nullptr) head = buf;
  }
  st = cache_->retrieve(key, head, &Agent::op_done, slot);
  (void)head->dec_refcount();  // the cache holds its own reference
  return st;
}

// A client's export (staging, or an engine's KV cache shared in place) is faulted
// in ahead of the copies into it, 2 MiB per loop turn (about 0.25 ms here) between
// requests: the first touch of a page costs ~1.3 us, four times its copy. Only a
// dense one, whose pages all exist (Mmap::dense), so nothing is allocated for it.
void Agent::on_export(ComchConnection* c, Mmap* map, uint64_t, UserData ud) {
  auto* s = static_cast<Session*>(c->user_data().ptr);
  if (s != nullptr && !s->gone) static_cast<Door*>(ud.ptr)->agent->queue_populate(s, map);
}

void Agent::queue_populate(Session* s, Mmap* m) {
  if (m->populated()) return;  // not dense, or done
  for (const Populate& p : populating_)
    if (p.session == s && p.map_id == m->peer_map_id()) return;
  ++s->pending;
  populating_.push_back({s, m->peer_map_id()});
}

void Agent::populate_step() {
  if (populating_.empty()) return;
  const Populate p = populating_.front();
  Mmap* m = p.session->gone ? nullptr : p.session->conn->imported_map(p.map_id);
  if (m != nullptr) {
    const size_t before = m->populated_bytes();
    const bool done = m->populate_some(2u << 20);
    counters_.populated_bytes += m->populated_bytes() - before;
    if (!done) return;
  }
  populating_.pop_front();
  --p.session->pending;
  release_session(p.session);
}

void Agent::drop_populates() {
  for (const Populate& p : populating_) {
    --p.session->pending;
    release_session(p.session);
  }
  populating_.clear();
}

void Agent::finish_batch(Batch* b) {
  Session* s = b->session;
  const double secs = (monotonic_ns() - b->start_ns) / 1e9;
  if (static_cast<Op>(b->hdr.op) == Op::kStore) latencies_.store.add(secs);
  if (static_cast<Op>(b->hdr.op) == Op::kRetrieve || b->rows) latencies_.retrieve.add(secs);
  Status worst;
  for (uint32_t i = 0; i < b->hdr.count; ++i)
    if (b->status[i] != 0) worst = static_cast<Code>(b->status[i]);
  reply(s, b->hdr, worst, b->status.data(), b->hdr.count);
  --s->pending;
  free_batches_.push_back(b);
  release_session(s);
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

Status Agent::scope_key(const Session* s, const ChunkKey& k, ChunkKey* kept) {
  if (s->model != 0 && k.model != s->model) return Code::kNotPermitted;
  if (!tenant_scope(k, s->tenant->tag, kept)) return Code::kInvalidValue;
  return Code::kSuccess;
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

void Agent::on_io(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t) {
  if (free_batches_.empty()) {
    reply(s, h, Code::kAgain, nullptr, 0);
    return;
  }
  Batch* b = free_batches_.back();
  free_batches_.pop_back();
  b->session = s;
  b->hdr = h;
  b->remaining = h.count + 1;  // +1 until every entry is submitted
  b->next = 0;
  b->start_ns = monotonic_ns();
  b->rows = false;
  b->entries.resize(h.count);  // within the capacity reserved at start: no allocation
  std::memcpy(b->entries.data(), body, h.count * sizeof(IoEntry));
  ++s->pending;
  submit_entries(b, /*fresh=*/true);
}

// A retrieve whose chunks land in rows of a map (a paged KV cache's blocks, shared
// in place by the client): each chunk's rows are one scatter list, so its bytes
// move once, arena to blocks. The body was checked whole (rows_body); the offsets
// are checked against the map as each chunk is submitted.
void Agent::on_rows(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t len) {
  if (free_batches_.empty()) {
    reply(s, h, Code::kAgain, nullptr, 0);
    return;
  }
  Batch* b = free_batches_.back();
  free_batches_.pop_back();
  uint64_t rows = 0;
  (void)agent::rows_body_valid(h.count, body, len, &b->rows_hdr, &rows);
  b->session = s;
  b->hdr = h;
  b->hdr.op = static_cast<uint16_t>(Op::kRetrieveRows);
  b->remaining = h.count + 1;
  b->next = 0;
  b->start_ns = monotonic_ns();
  b->rows = true;
  const uint8_t* keys = body + sizeof(agent::RowsHeader);
  b->row_offsets.resize(rows);
  std::memcpy(b->row_offsets.data(), keys + static_cast<size_t>(h.count) * sizeof(ChunkKey),
              rows * sizeof(uint64_t));
  b->entries.resize(h.count);
  for (uint32_t i = 0; i < h.count; ++i) {
    IoEntry& e = b->entries[i];
    std::memcpy(&e.key, keys + static_cast<size_t>(i) * sizeof(ChunkKey), sizeof(ChunkKey));
    e.map_id = b->rows_hdr.map_id;
    e.offset = static_cast<uint64_t>(i) * b->rows_hdr.rows_per_chunk;  // first row
    e.length = i + 1 == h.count ? b->rows_hdr.last_rows : b->rows_hdr.rows_per_chunk;
  }
  ++s->pending;
  submit_entries(b, /*fresh=*/true);
}

void Agent::on_lookup(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t) {
  const uint64_t lookup_t0 = monotonic_ns();
  // Keys are copied out of the message into a buffer sized once (no allocation).
  std::vector<ChunkKey>& ks = lookup_keys_;
  ks.resize(h.count);
  std::memcpy(ks.data(), body, h.count * sizeof(ChunkKey));
  uint32_t allowed = 0;  // a key of another model (or a malformed one) ends the run
  while (allowed < h.count && scope_key(s, ks[allowed], &ks[allowed]).ok()) ++allowed;
  if (allowed < h.count) ++counters_.not_permitted;
  const bool pin = (h.flags & agent::kPin) != 0;
  const uint32_t hits = cache_->lookup(ks.data(), allowed, pin);
  if (pin) s->pinned.insert(s->pinned.end(), ks.begin(), ks.begin() + hits);
  ++counters_.lookups;
  counters_.lookup_keys += h.count;
  if (cluster_ && hits < allowed) {
    // The rest may be on other agents: ask the cluster, answer when it has.
    if (free_remote_lookups_.empty()) {
      remote_lookups_.push_back(std::make_unique<RemoteLookup>());
      remote_lookups_.back()->agent = this;
      free_remote_lookups_.push_back(remote_lookups_.back().get());
    }
    RemoteLookup* r = free_remote_lookups_.back();
    r->session = s;
    r->hdr = h;
    r->keys.assign(ks.begin() + hits, ks.begin() + allowed);
    r->local = hits;
    r->pin = pin;
    r->start_ns = lookup_t0;
    if (cluster_
            ->fetch(r->keys.data(), static_cast<uint32_t>(r->keys.size()),
                    &Agent::remote_lookup_done, r)
            .ok()) {
      free_remote_lookups_.pop_back();
      ++s->pending;
      return;
    }
    // The directory is away: answer from this agent alone.
  }
  latencies_.lookup.add(static_cast<double>(monotonic_ns() - lookup_t0) / 1e9);
  counters_.lookup_hits += hits;
  reply(s, h, Code::kSuccess, &hits, sizeof(hits));
}

// CONTAINS, REMOVE, PREFETCH, UNPIN: a status byte per key.
void Agent::on_keys(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t) {
  const Op op = static_cast<Op>(h.op);
  // A spare batch's status bytes when they are long enough (no allocation).
  uint8_t* st = nullptr;
  std::vector<uint8_t> fallback;
  if (!free_batches_.empty() && free_batches_.back()->status.size() >= h.count) {
    st = free_batches_.back()->status.data();
  } else {
    fallback.resize(h.count);
    st = fallback.data();
  }
  for (uint32_t i = 0; i < h.count; ++i) {
    ChunkKey k;
    std::memcpy(&k, body + i * sizeof(k), sizeof(k));
    Status r = scope_key(s, k, &k);
    if (!r.ok()) {
      if (r == Code::kNotPermitted) ++counters_.not_permitted;
    } else if (op == Op::kContains) {
      r = cache_->contains(k) ? Status() : Status(Code::kNotFound);
    } else if (op == Op::kRemove) {
      r = cache_->remove(k);
    } else if (op == Op::kUnpin) {
      cache_->unpin(&k, 1);
    } else {
      r = cache_->contains(k) ? cache_->prefetch(k, nullptr, nullptr) : Status(Code::kNotFound);
    }
    st[i] = static_cast<uint8_t>(r.code());
  }
  reply(s, h, Code::kSuccess, st, h.count);
}

void Agent::on_push(Session* s, const AgentHeader& h, const uint8_t* body, uint32_t) {
  agent::PushHeader ph;
  std::memcpy(&ph, body, sizeof(ph));
  if (!cluster_) {
    reply(s, h, Code::kNotSupported, nullptr, 0);  // not in a cluster
    return;
  }
  auto p = std::make_unique<Push>();
  p->agent = this;
  p->session = s;
  p->hdr = h;
  p->status.assign(h.count, static_cast<uint8_t>(Code::kNotFound));
  std::vector<ChunkKey> keys;
  for (uint32_t i = 0; i < h.count; ++i) {
    ChunkKey k;
    std::memcpy(&k, body + sizeof(ph) + i * sizeof(k), sizeof(k));
    const Status r = scope_key(s, k, &k);
    if (!r.ok()) {
      p->status[i] = static_cast<uint8_t>(r.code());
      if (r == Code::kNotPermitted) ++counters_.not_permitted;
    } else if (cache_->contains(k)) {
      keys.push_back(k);
      p->sent.push_back(i);
    }
  }
  Status st = keys.empty()
                  ? Status(Code::kNotFound)
                  : cluster_->push(ph.node, keys.data(), static_cast<uint32_t>(keys.size()),
                                   &Agent::push_done, p.get());
  if (!st.ok()) {
    reply(s, h, st, p->status.data(), h.count);
    return;
  }
  ++s->pending;
  (void)p.release();  // push_done owns it
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

// Every tenant's events, or every tenant's chunks cleared: an admin's (kAllTenants).
void Agent::on_subscribe(Session* s, const AgentHeader& h, const uint8_t*, uint32_t) {
  const bool all = (h.flags & agent::kAllTenants) != 0;
  if (all && !s->admin) {
    ++counters_.not_permitted;
    reply(s, h, Code::kNotPermitted, nullptr, 0);
    return;
  }
  s->feed.all_tenants = all;
  subscribe(s);
  reply(s, h, Code::kSuccess, nullptr, 0);
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

void Agent::subscribe(Session* s) {
  if (s->subscribed) return;
  s->subscribed = true;
  s->feed.model = s->model;
  s->feed.tenant_tag = s->tenant->tag;
  s->feed.owner = s;
  if (feed_.add(&s->feed)) cache_->add_residency_listener(&Agent::on_residency, this, false);
}

void Agent::unsubscribe(Session* s) {
  if (!s->subscribed) return;
  s->subscribed = false;
  if (feed_.remove(&s->feed)) cache_->remove_residency_listener(&Agent::on_residency, this);
}

void Agent::on_residency(void* arg, const ChunkKey& key, bool present) {
  auto* a = static_cast<Agent*>(arg);
  if (!a->feed_.record(key, present)) ++a->counters_.events_dropped;
}

// Sends the queued events to every subscriber, in messages of at most max_msg
// bytes. A subscriber whose send queue is full misses the batch and is told so by
// the next one (kEventsLost); it is not disconnected.
void Agent::flush_events() {
  const uint32_t per_msg =
      (opts_.max_msg - static_cast<uint32_t>(sizeof(AgentHeader))) / sizeof(agent::ChunkEvent);
  // A failed send may close a connection, and its disconnect changes the feed's
  // subscribers: walk a copy, each session held (pending) while it is sent to.
  std::vector<Session*> to;
  to.reserve(feed_.subscribers());
  for (FeedSubscriber* f : feed_.subscriber_list()) to.push_back(static_cast<Session*>(f->owner));
  for (Session* s : to) ++s->pending;
  for (Session* s : to) {
    s->feed.model = s->model;  // as its HELLO said, whenever it subscribed
    size_t cursor = 0;
    while (!s->gone) {
      const uint32_t n = feed_.next_message(s->feed, &cursor, per_msg, &event_msg_);
      if (n == 0) break;
      ComchSendTask* t;
      Status st = s->server->send_alloc_init(
          s->conn, event_msg_.data(), static_cast<uint32_t>(event_msg_.size()), UserData{}, &t);
      if (st.ok()) {
        st = s->server->submit(t);
        if (!st.ok()) (void)s->server->free(t);
      }
      if (s->gone) break;  // the send found the peer dead
      if (!st.ok()) {
        s->feed.lost = true;
        counters_.events_dropped += n;
        break;
      }
      s->feed.lost = false;
      counters_.events_sent += n;
    }
  }
  for (Session* s : to) {
    --s->pending;
    release_session(s);
  }
  feed_.sent();
}

void Agent::remote_lookup_done(void* arg, uint32_t fetched) {
  auto* r = static_cast<RemoteLookup*>(arg);
  Agent* a = r->agent;
  Session* s = r->session;
  uint32_t hits = r->local;
  if (!s->gone) {
    // Fetched chunks are in the local cache now; look again (and pin) as for any hit.
    const uint32_t more = a->cache_->lookup(r->keys.data(), fetched, r->pin);
    if (r->pin) s->pinned.insert(s->pinned.end(), r->keys.begin(), r->keys.begin() + more);
    hits += more;
    a->counters_.lookup_remote_hits += more;
    a->counters_.lookup_hits += hits;
    a->latencies_.lookup.add(static_cast<double>(monotonic_ns() - r->start_ns) / 1e9);
    a->reply(s, r->hdr, Code::kSuccess, &hits, sizeof(hits));
  }
  r->session = nullptr;
  a->free_remote_lookups_.push_back(r);
  --s->pending;
  a->release_session(s);
}

void Agent::push_done(void* arg, Status st, const uint8_t* taken, uint32_t n) {
  std::unique_ptr<Push> p(static_cast<Push*>(arg));
  Session* s = p->session;
  for (uint32_t j = 0; j < n && j < p->sent.size(); ++j) p->status[p->sent[j]] = taken[j];
  Status worst = st;
  for (uint8_t b : p->status)
    if (b != 0 && worst.ok()) worst = static_cast<Code>(b);
  if (!s->gone)
    p->agent->reply(s, p->hdr, worst, p->status.data(), static_cast<uint32_t>(p->status.size()));
  --s->pending;
  p->agent->release_session(s);
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
  s.agent.populating = populating_.size();
  s.cache = cache_->stats();
  if (metrics_server_) s.metrics_server = metrics_server_->counters();
  for (const auto& d : doors_) s.protocol_errors += d->server->counters().protocol_errors;
  s.event_subscribers = feed_.subscribers();
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
