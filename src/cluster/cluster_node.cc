#include "cluster/cluster_node.h"

#include <algorithm>
#include <cstring>

#include "cluster/cluster_node_parts.h"
#include "cluster/cluster_node_read.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

ClusterNode::ClusterNode(ProgressEngine* pe, CacheEngine* cache, const ClusterOptions& o)
    : Context(pe), opts_(o), cache_(cache), lent_(cache, o.lend_timeout_ms) {}

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
  d.user = o.redis_user;
  d.password = o.redis_password;
  d.prefix = o.prefix;
  d.node_id = c->ucx_->node_id();
  d.lease_ms = o.lease_ms;
  d.live_refresh_ms = o.live_refresh_ms;
  d.retry_ms = o.retry_ms;
  d.lookup_timeout_ms = o.lookup_timeout_ms;
  d.replicate = o.replica_max_keys > 0;
  d.replica_max_keys = o.replica_max_keys > 0 ? o.replica_max_keys : 1;
  DPUKV_RETURN_IF_ERROR(c->ucx_->description(&d.description));
  DPUKV_RETURN_IF_ERROR(Directory::create(pe, d, &c->dir_));
  if (o.remote_tier) c->tier_ = std::make_unique<RemoteTier>(cache, c->dir_.get());
  c->ucx_->set_control_handler(&ClusterNode::on_control, c.get());
  *out = std::move(c);
  return Code::kSuccess;
}

ClusterNode::~ClusterNode() {
  stopping_ = true;
  if (tier_) tier_->stop();
  cache_->remove_residency_listener(&ClusterNode::on_residency, this);
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
  cache_->add_residency_listener(&ClusterNode::on_residency, this, true);
  return Code::kSuccess;
}

void ClusterNode::do_stop() {
  stopping_ = true;
  if (tier_) tier_->stop();
  cache_->remove_residency_listener(&ClusterNode::on_residency, this);
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
  lent_.give_all_back();
}

bool ClusterNode::drained() {
  return serves_.empty() && fetching_ == 0 && ucx_->state() == CtxState::kIdle &&
         dir_->state() == CtxState::kIdle;
}

void ClusterNode::on_residency(void* arg, const ChunkKey& k, bool present) {
  auto* self = static_cast<ClusterNode*>(arg);
  if (present) {
    self->dir_->add(k);
    if (self->tier_) self->tier_->on_present(k);
  } else {
    self->dir_->remove(k);
  }
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
      if (!pinned.empty()) {
        peer::Header h;
        std::memcpy(&h, msg.data(), sizeof(h));
        lent_.lend(l->node, h.request, std::move(pinned), monotonic_ms());
      }
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
      if (!self->lent_.give_back(sender, m.request)) ++self->counters_.bad_messages;
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
  size_t n = tier_ ? tier_->poll() : 0;
  const uint64_t now = monotonic_ms();
  if (!lent_.empty() && now >= lent_check_ms_) {  // a walk of them, at most ten times a second
    const uint64_t expired = lent_.expire(now);
    counters_.pins_expired += expired;
    n += expired;
    lent_check_ms_ = now + 100;
  }
  if (now >= forget_check_ms_) {  // at most once a second
    n += forget_gone_peers(now);
    forget_check_ms_ = now + 1000;
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

// Agents come and go (restarts take a new node id): a peer no longer live in the
// directory, with nothing of ours in flight to it, is dropped after forget_peer_ms,
// so peer_stats() and the per-peer metrics do not grow with every restart.
size_t ClusterNode::forget_gone_peers(uint64_t now) {
  if (!dir_->connected()) return 0;  // its live set may be stale
  size_t forgotten = 0;
  for (auto it = links_.begin(); it != links_.end();) {
    Link* l = it->second.get();
    bool busy = l->state == Link::State::kResolving || !l->queued.empty() || l->reads != 0;
    for (auto& [id, a] : asks_) busy = busy || a->link == l;
    for (auto& [id, o] : offers_) busy = busy || o->link == l;
    busy = busy || lent_.lends_to(l->node);
    if (busy || dir_->is_live(l->node)) {
      l->gone_since_ms = 0;
      ++it;
      continue;
    }
    if (l->gone_since_ms == 0) l->gone_since_ms = now;
    if (now - l->gone_since_ms < opts_.forget_peer_ms) {
      ++it;
      continue;
    }
    if (l->state == Link::State::kReady) ucx_->disconnect(l->peer);
    ++counters_.peers_forgotten;
    ++forgotten;
    it = links_.erase(it);
  }
  return forgotten;
}

ClusterNode::Counters ClusterNode::counters() const {
  Counters c = counters_;
  if (tier_) {
    const RemoteTier::Counters& t = tier_->counters();
    c.tier_puts = t.puts;
    c.tier_hits = t.hits;
    c.tier_bytes = t.bytes;
    c.tier_rejects = t.rejects;
    c.no_room += t.no_room;
  }
  return c;
}

std::vector<ClusterNode::PeerStats> ClusterNode::peer_stats() const {
  std::vector<PeerStats> out;
  for (const auto& [node, l] : links_) out.push_back(l->stats);
  std::sort(out.begin(), out.end(),
            [](const PeerStats& a, const PeerStats& b) { return a.node < b.node; });
  return out;
}

}  // namespace dpukv
