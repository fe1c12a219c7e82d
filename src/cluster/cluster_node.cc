#include "cluster/cluster_node.h"

#include <algorithm>
#include <cstring>

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

// A chunk as a remote-tier value: this header, then the stored bytes.
struct TierValue {
  uint32_t magic;  // "DKVT"
  uint8_t encoded;
  uint8_t reserved[3];
  uint64_t size, stored, checksum;
};
static_assert(sizeof(TierValue) == 32, "a value stays in Redis across versions");
constexpr uint32_t kTierMagic = 0x54564b44;

// Another node, as this one knows it: resolved through the directory on first
// use, then a UcxNode peer. Messages wait here while it is being resolved.
struct ClusterNode::Link {
  enum class State : uint8_t { kNew, kResolving, kReady, kFailed };
  uint64_t node = 0;
  State state = State::kNew;
  uint32_t peer = UcxNode::kUnknownPeer;
  uint64_t retry_at_ms = 0;
  uint32_t reads = 0;  // reads in flight from it: placement picks the least loaded
  struct Queued {
    std::vector<uint8_t> msg;
    std::vector<ChunkKey> pinned;  // pins this message hands over (PLACED)
  };
  std::vector<Queued> queued;
  PeerStats stats;
};

// One fetch(): the keys, which are local now, and asks still out.
struct ClusterNode::Fetch {
  ClusterNode* owner = nullptr;
  FetchCb cb = nullptr;
  void* arg = nullptr;
  std::vector<ChunkKey> keys;
  std::vector<uint8_t> got;  // 1: now in the local cache
  uint32_t asks = 0;
  bool in_use = false;
  uint64_t offer_from = 0, offer_request = 0;  // an OFFER being taken: answer TAKEN
  std::vector<uint32_t> tier;                  // positions asked of the remote tier
  uint32_t tier_from = UINT32_MAX;             // where the keys no live agent listed begin
  bool tier_retried = false;                   // keys whose listed holder failed went to the tier
};

// A push this node made: waits for the destination's TAKEN.
struct ClusterNode::Offer {
  uint64_t id = 0;
  Link* link = nullptr;
  PushCb cb = nullptr;
  void* arg = nullptr;
  uint32_t n = 0;
  uint64_t deadline_ms = 0;
};

// One PIN sent to one holder for up to peer::kMaxKeys keys of a fetch.
struct ClusterNode::Ask {
  uint64_t id = 0;
  Fetch* fetch = nullptr;
  Link* link = nullptr;
  uint64_t deadline_ms = 0;
  bool answered = false;
  uint32_t reads = 0;
  std::vector<uint32_t> index;  // positions in fetch->keys, in message order
  std::vector<ChunkKey> unpin;  // chunks the holder pinned for us
};

struct ClusterNode::Pull {
  ClusterNode* owner;
  Ask* ask;
  uint32_t index;
  uint64_t bytes;
};

// A PIN being answered; waits while chunks only on disk are prefetched.
struct ClusterNode::Serve {
  ClusterNode* owner = nullptr;
  uint64_t sender = 0, request = 0;
  std::vector<ChunkKey> keys;
  std::vector<ChunkPlacement> placed;
  std::vector<uint8_t> status;
  uint32_t prefetching = 0;
};

struct ClusterNode::Resolve {
  ClusterNode* owner;
  uint64_t node;
};

ClusterNode::ClusterNode(ProgressEngine* pe, CacheEngine* cache, const ClusterOptions& o)
    : Context(pe), opts_(o), cache_(cache) {}

Status ClusterNode::create(ProgressEngine* pe, CacheEngine* cache, const ClusterOptions& o,
                           std::unique_ptr<ClusterNode>* out) {
  if (cache == nullptr || o.request_timeout_ms == 0) return Code::kInvalidValue;
  std::unique_ptr<ClusterNode> c(new ClusterNode(pe, cache, o));
  UcxNodeOptions uo;
  uo.detect_peer_failure = o.detect_peer_failure;
  DPUKV_RETURN_IF_ERROR(UcxNode::create(pe, uo, &c->ucx_));
  void* base;
  uint64_t len;
  cache->arena(&base, &len);
  DPUKV_RETURN_IF_ERROR(c->ucx_->expose(base, len));
  DirectoryOptions d;
  d.host = o.redis_host;
  d.port = o.redis_port;
  d.prefix = o.prefix;
  d.node_id = c->ucx_->node_id();
  d.lease_ms = o.lease_ms;
  d.live_refresh_ms = o.live_refresh_ms;
  d.retry_ms = o.retry_ms;
  d.replicate = o.replica_max_keys > 0;
  d.replica_max_keys = o.replica_max_keys > 0 ? o.replica_max_keys : 1;
  DPUKV_RETURN_IF_ERROR(c->ucx_->description(&d.description));
  DPUKV_RETURN_IF_ERROR(Directory::create(pe, d, &c->dir_));
  c->ucx_->set_control_handler(&ClusterNode::on_control, c.get());
  *out = std::move(c);
  return Code::kSuccess;
}

ClusterNode::~ClusterNode() {
  stopping_ = true;
  cache_->set_residency_listener(nullptr, nullptr);
  dir_.reset();  // its pending callbacks run now, into a node that still exists
  ucx_.reset();
}

Status ClusterNode::do_start() {
  DPUKV_RETURN_IF_ERROR(ucx_->start());
  Status st = dir_->start();
  if (!st.ok()) {
    (void)ucx_->stop();
    return st;
  }
  cache_->set_residency_listener(&ClusterNode::on_residency, this);
  return Code::kSuccess;
}

void ClusterNode::do_stop() {
  stopping_ = true;
  cache_->set_residency_listener(nullptr, nullptr);
  // Unanswered asks end now (their keys are misses); answered ones finish with
  // their reads, which the UcxNode's stop breaks.
  std::vector<Ask*> open;
  for (auto& [id, a] : asks_)
    if (!a->answered) open.push_back(a.get());
  for (Ask* a : open) ask_failed(a, nullptr);
  std::vector<Offer*> offers;
  for (auto& [id, o] : offers_) offers.push_back(o.get());
  for (Offer* o : offers) offer_done(o, Code::kShutdown, nullptr);
  (void)ucx_->stop();
  (void)dir_->stop();
  while (!lent_.empty()) give_back(lent_.begin());
}

bool ClusterNode::drained() {
  return serves_.empty() && fetching_ == 0 && ucx_->state() == CtxState::kIdle &&
         dir_->state() == CtxState::kIdle;
}

void ClusterNode::on_residency(void* arg, const ChunkKey& k, bool present) {
  auto* self = static_cast<ClusterNode*>(arg);
  if (present) {
    self->dir_->add(k);
    // Written to the remote tier from poll(): the cache is in the middle of a call.
    if (self->opts_.remote_tier && self->copies_.erase(k) == 0) self->uploads_.push_back(k);
  } else {
    self->dir_->remove(k);
  }
}

// A few chunks per round, each read in place while pinned (hiredis copies it).
void ClusterNode::upload_some() {
  for (int i = 0; i < 16 && !uploads_.empty(); ++i) {
    const ChunkKey k = uploads_.back();
    uploads_.pop_back();
    ChunkPlacement p;
    if (!cache_->locate(k, &p).ok()) continue;  // gone, or only on disk already
    void* base;
    uint64_t len;
    cache_->arena(&base, &len);
    const TierValue h{kTierMagic, static_cast<uint8_t>(p.encoded), {}, p.size, p.stored,
                      p.checksum};
    std::string v(reinterpret_cast<const char*>(&h), sizeof(h));
    v.append(static_cast<const char*>(base) + p.offset, p.stored);
    cache_->unpin(&k, 1);
    dir_->put_value(k, std::move(v));
    ++counters_.tier_puts;
  }
}

// ---- reader side -------------------------------------------------------------------

Status ClusterNode::fetch(const ChunkKey* keys, uint32_t n, FetchCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (keys == nullptr || n == 0 || cb == nullptr) return Code::kInvalidValue;
  if (!dir_->connected()) {
    ++counters_.directory_unreachable;
    return Code::kConnectionReset;
  }
  if (free_fetches_.empty()) {
    fetches_.push_back(std::make_unique<Fetch>());
    fetches_.back()->owner = this;
    free_fetches_.push_back(fetches_.back().get());
  }
  Fetch* f = free_fetches_.back();
  f->cb = cb;
  f->arg = arg;
  f->keys.assign(keys, keys + n);
  f->got.assign(n, 0);
  f->asks = 0;
  f->tier.clear();
  f->tier_from = UINT32_MAX;
  f->tier_retried = false;
  Status st = dir_->lookup(keys, n, &ClusterNode::on_holders, f);
  if (!st.ok()) {
    if (st == Code::kConnectionReset) ++counters_.directory_unreachable;
    return st;
  }
  free_fetches_.pop_back();
  f->in_use = true;
  ++fetching_;
  ++counters_.fetches;
  counters_.fetch_keys += n;
  return Code::kSuccess;
}

ClusterNode::Link* ClusterNode::pick_holder(const std::vector<uint64_t>& holders) {
  Link* best = nullptr;
  const uint64_t now = monotonic_ms();
  for (uint64_t node : holders) {
    if (node == node_id()) continue;  // a stale entry of our own: we do not have it
    Link* l = link(node);
    if (l->state == Link::State::kFailed && now < l->retry_at_ms) continue;
    const bool ready = l->state == Link::State::kReady;
    if (best == nullptr || l->reads < best->reads ||
        (l->reads == best->reads && ready && best->state != Link::State::kReady))
      best = l;
  }
  return best;
}

void ClusterNode::on_holders(void* arg, Status st,
                             const std::vector<std::vector<uint64_t>>& holders) {
  auto* f = static_cast<Fetch*>(arg);
  ClusterNode* self = f->owner;
  if (!st.ok() || self->stopping_ || holders.size() != f->keys.size()) {
    self->fetch_done(f);
    return;
  }
  self->plan(f, &holders, nullptr);
}

void ClusterNode::plan(Fetch* f, const std::vector<std::vector<uint64_t>>* holders, Link* only) {
  // Keys with a reachable holder (the leading ones for a lookup; all for an
  // offer), grouped into one ask per holder and peer::kMaxKeys keys.
  std::unordered_map<Link*, Ask*> open;
  for (uint32_t i = 0; i < f->keys.size(); ++i) {
    if (cache_->contains(f->keys[i])) {  // here already: nothing to ask
      f->got[i] = 1;
      continue;
    }
    Link* l = only != nullptr ? only : pick_holder((*holders)[i]);
    if (l == nullptr) {
      // No live agent has it: the remote tier may, and the keys after it.
      if (opts_.remote_tier && only == nullptr) {
        f->tier_from = i;
        for (uint32_t j = i; j < f->keys.size(); ++j) f->tier.push_back(j);
      }
      break;
    }
    Ask*& a = open[l];
    if (a == nullptr || a->index.size() == peer::kMaxKeys) {
      auto owned = std::make_unique<Ask>();
      a = owned.get();
      a->id = next_request_++;
      a->fetch = f;
      a->link = l;
      asks_.emplace(a->id, std::move(owned));
      ++f->asks;
    }
    a->index.push_back(i);
    ++l->reads;  // counted from the ask on: later keys spread over holders
  }
  // Sent after grouping. A send may fail at once and end asks of its holder: the
  // guard keeps the fetch until every ask is out, and asks are found again by id.
  std::vector<uint64_t> to_send;
  for (auto& [id, a] : asks_)
    if (a->fetch == f && a->deadline_ms == 0) to_send.push_back(id);
  ++f->asks;
  for (uint64_t id : to_send) {
    auto it = asks_.find(id);
    if (it != asks_.end() && !it->second->answered) send_ask(it->second.get());
  }
  ask_tier(f);
  if (--f->asks == 0) fetch_done(f);
}

// One MGET for the keys at f->tier; false if there are none or it was not sent.
bool ClusterNode::ask_tier(Fetch* f) {
  if (f->tier.empty()) return false;
  std::vector<ChunkKey> ks;
  for (uint32_t i : f->tier) ks.push_back(f->keys[i]);
  if (!dir_->get_values(ks.data(), static_cast<uint32_t>(ks.size()), &ClusterNode::on_values, f)
           .ok()) {
    f->tier.clear();
    return false;
  }
  ++f->asks;
  return true;
}

void ClusterNode::on_values(void* arg, Status st, const std::vector<std::string>& values) {
  auto* f = static_cast<Fetch*>(arg);
  ClusterNode* self = f->owner;
  for (size_t j = 0; st.ok() && !self->stopping_ && j < values.size() && j < f->tier.size(); ++j) {
    const std::string& v = values[j];
    if (v.empty()) break;  // leading keys only
    TierValue h;
    if (v.size() < sizeof(h)) {
      ++self->counters_.tier_rejects;
      break;
    }
    std::memcpy(&h, v.data(), sizeof(h));
    const ChunkKey& k = f->keys[f->tier[j]];
    const ChunkPlacement p{0, h.stored, h.size, h.checksum, h.encoded != 0};
    uint8_t* dst = nullptr;
    if (h.magic != kTierMagic || h.encoded > 1 || v.size() - sizeof(h) != h.stored) {
      ++self->counters_.tier_rejects;
      break;
    }
    Status in = self->cache_->begin_ingest(k, p, &dst);
    if (in == Code::kBadState) {  // here already
      f->got[f->tier[j]] = self->cache_->contains(k) ? 1 : 0;
      continue;
    }
    if (!in.ok()) {
      if (in == Code::kNoMemory) ++self->counters_.no_room;
      break;
    }
    std::memcpy(dst, v.data() + sizeof(h), h.stored);
    self->copies_.insert(k);  // its arrival must not write it back to the tier
    in = self->cache_->end_ingest(k, true);
    if (!in.ok()) {
      self->copies_.erase(k);
      ++self->counters_.tier_rejects;
      break;
    }
    f->got[f->tier[j]] = 1;
    ++self->counters_.tier_hits;
    self->counters_.tier_bytes += h.size;
  }
  f->tier.clear();
  if (--f->asks == 0) self->fetch_done(f);
}

void ClusterNode::send_ask(Ask* a) {
  const Fetch* f = a->fetch;
  const auto n = static_cast<uint32_t>(a->index.size());
  std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kPin, n));
  peer::write_header(peer::Type::kPin, a->id, n, msg.data());
  for (uint32_t j = 0; j < n; ++j)
    std::memcpy(msg.data() + sizeof(peer::Header) + j * sizeof(ChunkKey), &f->keys[a->index[j]],
                sizeof(ChunkKey));
  a->deadline_ms = monotonic_ms() + opts_.request_timeout_ms;
  send(a->link, std::move(msg), {});
}

void ClusterNode::on_placed(Link* l, const peer::Message& m) {
  auto it = asks_.find(m.request);
  if (it == asks_.end() || it->second->link != l || it->second->answered ||
      it->second->index.size() != m.count) {
    // Late (the ask timed out and its keys went as misses) or not ours. A PLACED
    // names no keys, so what it pinned stays pinned until the holder's pin timeout.
    if (it != asks_.end()) ++counters_.bad_messages;
    return;
  }
  Ask* a = it->second.get();
  a->answered = true;
  Fetch* f = a->fetch;
  for (uint32_t j = 0; j < m.count; ++j) {
    const peer::Placed p = m.placed(j);
    const uint32_t i = a->index[j];
    const ChunkKey& k = f->keys[i];
    if (p.status != static_cast<uint8_t>(Code::kSuccess)) {
      ++counters_.stale;
      dir_->forget(k, l->node);  // the holder says it has not: not asked again for it
      continue;
    }
    a->unpin.push_back(k);
    const ChunkPlacement cp{p.offset, p.stored, p.size, p.checksum, p.encoded != 0};
    uint8_t* dst = nullptr;
    Status st = cache_->begin_ingest(k, cp, &dst);
    if (st == Code::kBadState) {  // here already (stored meanwhile, or another fetch has it)
      f->got[i] = cache_->contains(k) ? 1 : 0;
      continue;
    }
    if (!st.ok()) {
      if (st == Code::kNoMemory) ++counters_.no_room;
      continue;
    }
    auto* pull = new Pull{this, a, i, p.size};
    st = ucx_->read(l->peer, p.offset, dst, p.stored, &ClusterNode::on_read, pull);
    if (!st.ok()) {
      delete pull;
      (void)cache_->end_ingest(k, false);
      ++counters_.read_errors;
      ++l->stats.errors;
      continue;
    }
    ++a->reads;
  }
  if (a->reads == 0) ask_done(a);
}

void ClusterNode::on_read(void* arg, Status st) {
  std::unique_ptr<Pull> p(static_cast<Pull*>(arg));
  ClusterNode* self = p->owner;
  Ask* a = p->ask;
  const ChunkKey& k = a->fetch->keys[p->index];
  if (self->opts_.remote_tier) self->copies_.insert(k);  // another agent has it: not uploaded
  const Status kept = self->cache_->end_ingest(k, st.ok());
  if (!kept.ok()) self->copies_.erase(k);
  if (kept.ok()) {
    a->fetch->got[p->index] = 1;
    ++self->counters_.remote_hits;
    self->counters_.remote_bytes += p->bytes;
    ++a->link->stats.fetched;
    a->link->stats.fetched_bytes += p->bytes;
  } else {
    ++(kept == Code::kCorrupted ? self->counters_.checksum_failures : self->counters_.read_errors);
    ++a->link->stats.errors;
  }
  if (--a->reads == 0) self->ask_done(a);
}

void ClusterNode::ask_done(Ask* a) {
  if (!a->unpin.empty() && a->link->state == Link::State::kReady && !stopping_) {
    const auto n = static_cast<uint32_t>(a->unpin.size());
    std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kUnpin, n));
    peer::write_header(peer::Type::kUnpin, a->id, n, msg.data());
    std::memcpy(msg.data() + sizeof(peer::Header), a->unpin.data(), n * sizeof(ChunkKey));
    send(a->link, std::move(msg), {});
  }
  Fetch* f = a->fetch;
  a->link->reads -= std::min<uint32_t>(a->link->reads, static_cast<uint32_t>(a->index.size()));
  asks_.erase(a->id);
  if (--f->asks == 0) fetch_done(f);
}

// An ask that will not be answered (timeout, failed holder, stopping): its keys
// are misses.
void ClusterNode::ask_failed(Ask* a, uint64_t* counter) {
  if (counter != nullptr) ++*counter;
  ++a->link->stats.errors;
  a->answered = true;
  a->unpin.clear();
  ask_done(a);
}

void ClusterNode::fetch_done(Fetch* f) {
  uint32_t fetched = 0;
  while (fetched < f->got.size() && f->got[fetched]) ++fetched;
  // A lookup whose listed holder failed it (gone, stale, wrong bytes, too slow): the
  // remote tier may still have those keys. Asked once, for keys not asked before.
  if (f->offer_from == 0 && opts_.remote_tier && !stopping_ && !f->tier_retried &&
      fetched < f->tier_from && fetched < f->got.size()) {
    f->tier_retried = true;
    f->tier.clear();
    const uint32_t end = std::min<uint32_t>(f->tier_from, static_cast<uint32_t>(f->got.size()));
    for (uint32_t j = fetched; j < end; ++j)
      if (!f->got[j]) f->tier.push_back(j);
    ++counters_.tier_fallbacks;
    if (ask_tier(f)) return;  // on_values ends the fetch
  }
  if (f->in_use) {
    f->in_use = false;
    --fetching_;
  }
  free_fetches_.push_back(f);
  if (f->offer_from == 0) {
    f->cb(f->arg, fetched);
    return;
  }
  // An offer taken: tell the offering node which chunks are here now.
  const auto n = static_cast<uint32_t>(f->got.size());
  std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kTaken, n));
  peer::write_header(peer::Type::kTaken, f->offer_request, n, msg.data());
  for (uint32_t i = 0; i < n; ++i) {
    const bool here = f->got[i] != 0 || cache_->contains(f->keys[i]);
    msg[sizeof(peer::Header) + i] = static_cast<uint8_t>(here ? Code::kSuccess : Code::kNotFound);
    counters_.offered_chunks += here;
  }
  const uint64_t to = f->offer_from;
  f->offer_from = 0;
  if (!stopping_) send(link(to), std::move(msg), {});
}

// ---- prefill-to-decode transfers ---------------------------------------------------

Status ClusterNode::push(uint64_t node, const ChunkKey* keys, uint32_t n, PushCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (keys == nullptr || n == 0 || n > peer::kMaxKeys || cb == nullptr || node == node_id())
    return Code::kInvalidValue;
  auto o = std::make_unique<Offer>();
  o->id = next_request_++;
  o->link = link(node);
  o->cb = cb;
  o->arg = arg;
  o->n = n;
  o->deadline_ms = monotonic_ms() + 8ull * opts_.request_timeout_ms;  // the reads take time
  std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kOffer, n));
  peer::write_header(peer::Type::kOffer, o->id, n, msg.data());
  std::memcpy(msg.data() + sizeof(peer::Header), keys, n * sizeof(ChunkKey));
  Link* l = o->link;
  offers_.emplace(o->id, std::move(o));
  ++counters_.pushes;
  send(l, std::move(msg), {});  // a link that fails ends the offer (link_failed)
  return Code::kSuccess;
}

void ClusterNode::offer_done(Offer* o, Status st, const uint8_t* taken) {
  std::unique_ptr<Offer> owned = std::move(offers_[o->id]);
  offers_.erase(o->id);
  std::vector<uint8_t> none;
  if (taken == nullptr) {
    none.assign(o->n, static_cast<uint8_t>(st.code()));
    taken = none.data();
  } else {
    for (uint32_t i = 0; i < o->n; ++i) counters_.pushed_chunks += taken[i] == 0;
  }
  o->cb(o->arg, st, taken, o->n);
}

void ClusterNode::on_offer(uint64_t sender, const peer::Message& m) {
  ++counters_.offers;
  if (free_fetches_.empty()) {
    fetches_.push_back(std::make_unique<Fetch>());
    fetches_.back()->owner = this;
    free_fetches_.push_back(fetches_.back().get());
  }
  Fetch* f = free_fetches_.back();
  free_fetches_.pop_back();
  f->in_use = true;
  ++fetching_;
  f->cb = nullptr;
  f->arg = nullptr;
  f->keys.resize(m.count);
  for (uint32_t i = 0; i < m.count; ++i) f->keys[i] = m.key(i);
  f->got.assign(m.count, 0);
  f->asks = 0;
  f->tier.clear();
  f->tier_from = UINT32_MAX;
  f->tier_retried = false;
  f->offer_from = sender;
  f->offer_request = m.request;
  plan(f, nullptr, link(sender));  // the offering node holds them all
}

void ClusterNode::on_taken(Link* l, const peer::Message& m) {
  auto it = offers_.find(m.request);
  if (it == offers_.end() || it->second->link != l || it->second->n != m.count) {
    ++counters_.bad_messages;  // late (timed out), or not an answer to us
    return;
  }
  offer_done(it->second.get(), Code::kSuccess, m.items);
}

// ---- holder side -------------------------------------------------------------------

void ClusterNode::on_pin(uint64_t sender, const peer::Message& m) {
  ++counters_.served_requests;
  auto s = std::make_unique<Serve>();
  s->owner = this;
  s->sender = sender;
  s->request = m.request;
  s->keys.resize(m.count);
  s->placed.resize(m.count);
  s->status.assign(m.count, static_cast<uint8_t>(Code::kNotFound));
  Serve* raw = s.get();
  serves_.push_back(std::move(s));
  raw->prefetching = 1;  // a guard: a prefetch may complete at once
  for (uint32_t i = 0; i < m.count; ++i) {
    raw->keys[i] = m.key(i);
    const Status st = cache_->locate(raw->keys[i], &raw->placed[i]);
    raw->status[i] = static_cast<uint8_t>(st.code());
    if (st != Code::kAgain) continue;
    ++raw->prefetching;
    if (!cache_->prefetch(raw->keys[i], &ClusterNode::on_prefetched, raw).ok()) --raw->prefetching;
  }
  on_prefetched(raw, Code::kSuccess);  // drops the guard
}

void ClusterNode::on_prefetched(void* arg, Status) {
  auto* s = static_cast<Serve*>(arg);
  if (--s->prefetching != 0) return;
  ClusterNode* self = s->owner;
  for (size_t i = 0; i < s->keys.size(); ++i)
    if (s->status[i] == static_cast<uint8_t>(Code::kAgain))
      s->status[i] = static_cast<uint8_t>(self->cache_->locate(s->keys[i], &s->placed[i]).code());
  self->answer(s);
  for (size_t i = 0; i < self->serves_.size(); ++i)
    if (self->serves_[i].get() == s) {
      self->serves_[i] = std::move(self->serves_.back());
      self->serves_.pop_back();
      break;
    }
}

void ClusterNode::answer(Serve* s) {
  const auto n = static_cast<uint32_t>(s->keys.size());
  std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kPlaced, n));
  peer::write_header(peer::Type::kPlaced, s->request, n, msg.data());
  std::vector<ChunkKey> pinned;
  Link* l = link(s->sender);
  for (uint32_t i = 0; i < n; ++i) {
    peer::Placed p{};
    p.status = s->status[i] == static_cast<uint8_t>(Code::kAgain)
                   ? static_cast<uint8_t>(Code::kNotFound)
                   : s->status[i];
    if (p.status == 0) {
      p.encoded = s->placed[i].encoded ? 1 : 0;
      p.offset = s->placed[i].offset;
      p.stored = s->placed[i].stored;
      p.size = s->placed[i].size;
      p.checksum = s->placed[i].checksum;
      pinned.push_back(s->keys[i]);
      ++counters_.served_chunks;
      counters_.served_bytes += p.stored;
      ++l->stats.served;
      l->stats.served_bytes += p.stored;
    }
    std::memcpy(msg.data() + sizeof(peer::Header) + i * sizeof(p), &p, sizeof(p));
  }
  send(l, std::move(msg), std::move(pinned));
}

// ---- pins lent to readers -----------------------------------------------------------

void ClusterNode::lend(uint64_t node, const std::vector<uint8_t>& placed,
                       std::vector<ChunkKey> keys) {
  peer::Header h;
  std::memcpy(&h, placed.data(), sizeof(h));
  auto [it, fresh] = lent_.try_emplace({node, h.request});
  if (!fresh)  // the same request asked twice: the earlier pins go
    cache_->unpin(it->second.keys.data(), static_cast<uint32_t>(it->second.keys.size()));
  it->second.deadline_ms = monotonic_ms() + opts_.lend_timeout_ms;
  it->second.keys = std::move(keys);
}

void ClusterNode::give_back(std::map<std::pair<uint64_t, uint64_t>, Lent>::iterator it) {
  cache_->unpin(it->second.keys.data(), static_cast<uint32_t>(it->second.keys.size()));
  lent_.erase(it);
}

// A reader that died, or never read, between PLACED and UNPIN.
size_t ClusterNode::expire_lent(uint64_t now) {
  size_t n = 0;
  for (auto it = lent_.begin(); it != lent_.end();) {
    auto next = std::next(it);
    if (now >= it->second.deadline_ms) {
      counters_.pins_expired += it->second.keys.size();
      give_back(it);
      ++n;
    }
    it = next;
  }
  return n;
}

// ---- links ---------------------------------------------------------------------

ClusterNode::Link* ClusterNode::link(uint64_t node) {
  auto& l = links_[node];
  if (!l) {
    l = std::make_unique<Link>();
    l->node = node;
    l->stats.node = node;
  }
  return l.get();
}

void ClusterNode::send(Link* l, std::vector<uint8_t> msg, std::vector<ChunkKey> pinned) {
  if (l->state == Link::State::kReady) {
    if (ucx_->send_control(l->peer, msg.data(), msg.size()).ok()) {
      if (!pinned.empty()) lend(l->node, msg, std::move(pinned));
      return;
    }
    link_failed(l, "cannot send");
  }
  if (stopping_ || (l->state == Link::State::kFailed && monotonic_ms() < l->retry_at_ms)) {
    if (!pinned.empty()) cache_->unpin(pinned.data(), static_cast<uint32_t>(pinned.size()));
    return;  // an ask sent nowhere times out; see poll()
  }
  l->queued.push_back({std::move(msg), std::move(pinned)});
  if (l->state == Link::State::kResolving) return;
  l->state = Link::State::kResolving;
  auto* r = new Resolve{this, l->node};
  ++resolving_;
  if (!dir_->find_node(l->node, &ClusterNode::on_node, r).ok()) {
    --resolving_;
    delete r;
    link_failed(l, "directory unreachable");
  }
}

void ClusterNode::on_node(void* arg, Status st, const std::string& description) {
  std::unique_ptr<Resolve> r(static_cast<Resolve*>(arg));
  ClusterNode* self = r->owner;
  --self->resolving_;
  auto it = self->links_.find(r->node);
  if (it == self->links_.end()) return;
  Link* l = it->second.get();
  if (self->stopping_) {
    self->link_failed(l, "stopping");
    return;
  }
  if (!st.ok()) {
    self->link_failed(l, st == Code::kNotFound ? "not live in the directory" : "directory error");
    return;
  }
  // The description must be the node's own: a directory entry cannot redirect us.
  PeerDescription d;
  const auto* blob = reinterpret_cast<const uint8_t*>(description.data());
  uint32_t peer = UcxNode::kUnknownPeer;
  if (!parse_peer_description(blob, description.size(), &d).ok() || d.node_id != r->node ||
      !self->ucx_->connect(blob, description.size(), &peer).ok()) {
    self->link_failed(l, "bad description");
    return;
  }
  l->peer = peer;
  l->state = Link::State::kReady;
  l->stats.connected = true;
  std::vector<Link::Queued> q = std::move(l->queued);
  l->queued.clear();
  for (auto& m : q) self->send(l, std::move(m.msg), std::move(m.pinned));
}

void ClusterNode::link_failed(Link* l, const char* why) {
  if (l->state == Link::State::kReady) {
    ucx_->disconnect(l->peer);
    ++counters_.peers_failed;
  }
  if (!stopping_)
    LOG_WARN("cluster: peer %016llx: %s; its chunks are misses for %u ms",
             static_cast<unsigned long long>(l->node), why, opts_.retry_ms);
  l->state = Link::State::kFailed;
  l->peer = UcxNode::kUnknownPeer;
  l->stats.connected = false;
  l->retry_at_ms = monotonic_ms() + opts_.retry_ms;
  for (auto& m : l->queued)
    if (!m.pinned.empty()) cache_->unpin(m.pinned.data(), static_cast<uint32_t>(m.pinned.size()));
  l->queued.clear();
  // Its unanswered asks end now; answered ones end with their (breaking) reads.
  std::vector<Ask*> lost;
  for (auto& [id, a] : asks_)
    if (a->link == l && !a->answered) lost.push_back(a.get());
  for (Ask* a : lost) ask_failed(a, &counters_.read_errors);
  std::vector<Offer*> gone;
  for (auto& [id, o] : offers_)
    if (o->link == l) gone.push_back(o.get());
  for (Offer* o : gone) offer_done(o, Code::kConnectionReset, nullptr);
}

void ClusterNode::on_control(void* arg, uint64_t sender, uint32_t, const uint8_t* msg, size_t len) {
  auto* self = static_cast<ClusterNode*>(arg);
  if (self->stopping_) return;
  peer::Message m;
  if (!parse_peer_message(msg, len, &m).ok() || sender == self->node_id()) {
    ++self->counters_.bad_messages;
    auto it = self->links_.find(sender);
    if (it != self->links_.end()) self->link_failed(it->second.get(), "malformed message");
    LOG_WARN("cluster: malformed control message (%zu bytes) from %016llx; dropped", len,
             static_cast<unsigned long long>(sender));
    return;
  }
  switch (m.type) {
    case peer::Type::kPin:
      self->on_pin(sender, m);
      return;
    case peer::Type::kPlaced: {
      auto it = self->links_.find(sender);
      if (it != self->links_.end()) {
        self->on_placed(it->second.get(), m);
      } else {
        ++self->counters_.bad_messages;  // we asked it nothing
      }
      return;
    }
    case peer::Type::kUnpin: {
      // Releases what this reader was lent for that request, whatever keys it names:
      // no one else's pins, and each once.
      auto it = self->lent_.find({sender, m.request});
      if (it == self->lent_.end()) {
        ++self->counters_.bad_messages;
        return;
      }
      self->give_back(it);
      return;
    }
    case peer::Type::kOffer:
      self->on_offer(sender, m);
      return;
    case peer::Type::kTaken: {
      auto it = self->links_.find(sender);
      if (it != self->links_.end())
        self->on_taken(it->second.get(), m);
      else
        ++self->counters_.bad_messages;
      return;
    }
  }
}

size_t ClusterNode::poll() {
  if (state() != CtxState::kRunning) return 0;
  size_t n = uploads_.size();
  if (!uploads_.empty()) upload_some();
  const uint64_t now = monotonic_ms();
  if (!lent_.empty() && now >= lent_check_ms_) {  // a walk of them, at most ten times a second
    n += expire_lent(now);
    lent_check_ms_ = now + 100;
  }
  for (auto& [node, l] : links_)
    if (l->state == Link::State::kReady && !ucx_->peer_ok(l->peer)) {
      link_failed(l.get(), "connection lost");
      ++n;
    }
  std::vector<uint64_t> late;
  for (auto& [id, a] : asks_)
    if (!a->answered && a->deadline_ms != 0 && now >= a->deadline_ms) late.push_back(id);
  for (uint64_t id : late) {
    auto it = asks_.find(id);
    if (it == asks_.end() || it->second->answered) continue;  // ended with its holder
    Ask* a = it->second.get();
    LOG_WARN("cluster: peer %016llx did not answer in %u ms; %zu keys are misses",
             static_cast<unsigned long long>(a->link->node), opts_.request_timeout_ms,
             a->index.size());
    Link* l = a->link;
    ask_failed(a, &counters_.timeouts);
    // A holder that does not answer (partitioned, hung) is not asked again for
    // retry_ms: later lookups miss at once instead of waiting for it each time.
    if (l->state == Link::State::kReady) link_failed(l, "not answering");
    ++n;
  }
  std::vector<Offer*> late_offers;
  for (auto& [id, o] : offers_)
    if (now >= o->deadline_ms) late_offers.push_back(o.get());
  for (Offer* o : late_offers) {
    ++counters_.timeouts;
    offer_done(o, Code::kTimeout, nullptr);
    ++n;
  }
  return n;
}

std::vector<ClusterNode::PeerStats> ClusterNode::peer_stats() const {
  std::vector<PeerStats> out;
  for (const auto& [node, l] : links_) out.push_back(l->stats);
  std::sort(out.begin(), out.end(),
            [](const PeerStats& a, const PeerStats& b) { return a.node < b.node; });
  return out;
}

}  // namespace dpukv
