// The agent's sessions (agent.h): a connection comes through a door and becomes a
// session of its tenant (within the connection limits); the memory it exports is
// bounded (staging limits) and faulted in a step per loop turn; a session that is
// gone keeps its state until its last batch completes, then its pins are released.
#include "agent/agent.h"

#include <cstring>
#include <string>

#include "agent/agent_session.h"
#include "protocol/tenant_key.h"
#include "runtime/log.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

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
  a->events_->unsubscribe(s);
  // Its GPU memory is closed now, or (with copies in flight) when they finish.
  a->gpu_->remove_all(&s->gpu);
  s->gone = true;
  s->conn = nullptr;
  a->release_session(s);
}

void Agent::release_session(Session* s) {
  if (s->gone && s->pending == 0) delete s;
}

// A client's export is faulted in ahead of the copies into it (export_populator.h).
void Agent::on_export(ComchConnection* c, Mmap* map, uint64_t, UserData ud) {
  auto* s = static_cast<Session*>(c->user_data().ptr);
  if (s != nullptr && !s->gone) static_cast<Door*>(ud.ptr)->agent->populator_->add(s, map);
}

Status scope_key(const AgentSession* s, const ChunkKey& k, ChunkKey* kept) {
  if (s->model != 0 && k.model != s->model) return Code::kNotPermitted;
  if (!tenant_scope(k, s->tenant->tag, kept)) return Code::kInvalidValue;
  return Code::kSuccess;
}

}  // namespace dpukv
