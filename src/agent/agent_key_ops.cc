// The agent's ops on keys (agent.h): LOOKUP (its misses asked of the cluster, the
// answer sent when the cluster has fetched what it could), CONTAINS, REMOVE,
// PREFETCH, UNPIN, and PUSH (chunks offered to another agent).
#include "agent/agent.h"

#include <cstring>
#include <string>

#include "agent/agent_cluster_ops.h"
#include "agent/agent_session.h"
#include "protocol/tenant_key.h"
#include "runtime/log.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

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
  uint8_t* st = batch_io_->spare_status(h.count);
  std::vector<uint8_t> fallback;
  if (st == nullptr) {
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

}  // namespace dpukv
