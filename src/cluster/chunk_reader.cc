#include "cluster/chunk_reader.h"

#include <algorithm>
#include <cstring>

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

ChunkReader::ChunkReader(const ClusterOptions& o, uint64_t self, CacheEngine* cache, UcxNode* ucx,
                         Directory* dir, RemoteTier* tier, PeerLinks* links,
                         ClusterCounters* counters)
    : opts_(o),
      self_(self),
      cache_(cache),
      ucx_(ucx),
      dir_(dir),
      tier_(tier),
      links_(links),
      counters_(counters) {}

// A fetch from the pool (grown on demand), its keys copied in; not yet in use.
ChunkReader::Fetch* ChunkReader::new_fetch(const ChunkKey* keys, uint32_t n) {
  if (free_fetches_.empty()) {
    fetches_.push_back(std::make_unique<Fetch>());
    fetches_.back()->owner = this;
    free_fetches_.push_back(fetches_.back().get());
  }
  Fetch* f = free_fetches_.back();
  f->cb = nullptr;
  f->arg = nullptr;
  f->keys.assign(keys, keys + n);
  f->got.assign(n, 0);
  f->asks = 0;
  f->tier.clear();
  f->tier_from = UINT32_MAX;
  f->tier_retried = false;
  f->offer_from = 0;
  return f;
}

Status ChunkReader::fetch(const ChunkKey* keys, uint32_t n, FetchCb cb, void* arg) {
  if (keys == nullptr || n == 0 || cb == nullptr) return Code::kInvalidValue;
  if (!dir_->connected()) {
    ++counters_->directory_unreachable;
    return Code::kConnectionReset;
  }
  Fetch* f = new_fetch(keys, n);
  f->cb = cb;
  f->arg = arg;
  Status st = dir_->lookup(keys, n, &ChunkReader::on_holders, f);
  if (!st.ok()) {
    if (st == Code::kConnectionReset) ++counters_->directory_unreachable;
    return st;
  }
  free_fetches_.pop_back();
  f->in_use = true;
  ++fetching_;
  ++counters_->fetches;
  counters_->fetch_keys += n;
  return Code::kSuccess;
}

void ChunkReader::take_offer(uint64_t sender, const peer::Message& m) {
  ++counters_->offers;
  Fetch* f = new_fetch(nullptr, 0);
  f->keys.resize(m.count);
  for (uint32_t i = 0; i < m.count; ++i) f->keys[i] = m.key(i);
  f->got.assign(m.count, 0);
  free_fetches_.pop_back();
  f->in_use = true;
  ++fetching_;
  f->offer_from = sender;
  f->offer_request = m.request;
  plan(f, nullptr, links_->link(sender));  // the offering node holds them all
}

void ChunkReader::link_failed(PeerLink* l) {
  // Its unanswered asks end now; answered ones end with their (breaking) reads.
  std::vector<Ask*> lost;
  for (auto& [id, a] : asks_)
    if (a->link == l && !a->answered) lost.push_back(a.get());
  for (Ask* a : lost) ask_failed(a, &counters_->read_errors);
}

void ChunkReader::fail_open() {
  // Unanswered asks end now (their keys are misses); answered ones finish with
  // their reads, which the UcxNode's stop breaks.
  std::vector<Ask*> open;
  for (auto& [id, a] : asks_)
    if (!a->answered) open.push_back(a.get());
  for (Ask* a : open) ask_failed(a, nullptr);
}

bool ChunkReader::uses(const PeerLink* l) const {
  for (const auto& [id, a] : asks_)
    if (a->link == l) return true;
  return false;
}

size_t ChunkReader::expire(uint64_t now) {
  size_t n = 0;
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
    PeerLink* l = a->link;
    ask_failed(a, &counters_->timeouts);
    // A holder that does not answer (partitioned, hung) is not asked again for
    // retry_ms: later lookups miss at once instead of waiting for it each time.
    if (l->ready()) links_->fail(l, "not answering");
    ++n;
  }
  return n;
}

PeerLink* ChunkReader::pick_holder(const std::vector<uint64_t>& holders) {
  PeerLink* best = nullptr;
  const uint64_t now = monotonic_ms();
  for (uint64_t node : holders) {
    if (node == self_) continue;  // a stale entry of our own: we do not have it
    PeerLink* l = links_->link(node);
    if (l->state == PeerLink::State::kFailed && now < l->retry_at_ms) continue;
    const bool ready = l->state == PeerLink::State::kReady;
    if (best == nullptr || l->reads < best->reads ||
        (l->reads == best->reads && ready && best->state != PeerLink::State::kReady))
      best = l;
  }
  return best;
}

void ChunkReader::on_holders(void* arg, Status st,
                             const std::vector<std::vector<uint64_t>>& holders) {
  auto* f = static_cast<Fetch*>(arg);
  ChunkReader* self = f->owner;
  if (!st.ok() || self->stopping_ || holders.size() != f->keys.size()) {
    self->fetch_done(f);
    return;
  }
  self->plan(f, &holders, nullptr);
}

void ChunkReader::plan(Fetch* f, const std::vector<std::vector<uint64_t>>* holders,
                       PeerLink* only) {
  // Keys with a reachable holder (the leading ones for a lookup; all for an
  // offer), grouped into one ask per holder and peer::kMaxKeys keys.
  std::unordered_map<PeerLink*, Ask*> open;
  for (uint32_t i = 0; i < f->keys.size(); ++i) {
    if (cache_->contains(f->keys[i])) {  // here already: nothing to ask
      f->got[i] = 1;
      continue;
    }
    PeerLink* l = only != nullptr ? only : pick_holder((*holders)[i]);
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
bool ChunkReader::ask_tier(Fetch* f) {
  if (f->tier.empty() || !tier_) return false;
  std::vector<ChunkKey> ks;
  ks.reserve(f->tier.size());
  for (uint32_t i : f->tier) ks.push_back(f->keys[i]);
  if (!tier_->get(std::move(ks), &ChunkReader::on_tier, f).ok()) {
    f->tier.clear();
    return false;
  }
  ++f->asks;
  return true;
}

void ChunkReader::on_tier(void* arg, const uint8_t* got, uint32_t n) {
  auto* f = static_cast<Fetch*>(arg);
  for (uint32_t j = 0; j < n && j < f->tier.size(); ++j)
    if (got[j]) f->got[f->tier[j]] = 1;
  f->tier.clear();
  if (--f->asks == 0) f->owner->fetch_done(f);
}

void ChunkReader::send_ask(Ask* a) {
  const Fetch* f = a->fetch;
  const auto n = static_cast<uint32_t>(a->index.size());
  std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kPin, n));
  peer::write_header(peer::Type::kPin, a->id, n, msg.data());
  for (uint32_t j = 0; j < n; ++j)
    std::memcpy(msg.data() + sizeof(peer::Header) + j * sizeof(ChunkKey), &f->keys[a->index[j]],
                sizeof(ChunkKey));
  a->deadline_ms = monotonic_ms() + opts_.request_timeout_ms;
  links_->send(a->link, std::move(msg), {});
}

void ChunkReader::on_placed(PeerLink* l, const peer::Message& m) {
  auto it = asks_.find(m.request);
  if (it == asks_.end() || it->second->link != l || it->second->answered ||
      it->second->index.size() != m.count) {
    // Late (the ask timed out and its keys went as misses) or not ours. A PLACED
    // names no keys, so what it pinned stays pinned until the holder's pin timeout.
    if (it != asks_.end()) ++counters_->bad_messages;
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
      ++counters_->stale;
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
      if (st == Code::kNoMemory) ++counters_->no_room;
      continue;
    }
    auto* pull = new Pull{this, a, i, p.size};
    st = ucx_->read(l->peer, p.offset, dst, p.stored, &ChunkReader::on_read, pull);
    if (!st.ok()) {
      delete pull;
      (void)cache_->end_ingest(k, false);
      ++counters_->read_errors;
      ++l->stats.errors;
      continue;
    }
    ++a->reads;
  }
  if (a->reads == 0) ask_done(a);
}

void ChunkReader::on_read(void* arg, Status st) {
  std::unique_ptr<Pull> p(static_cast<Pull*>(arg));
  ChunkReader* self = p->owner;
  Ask* a = p->ask;
  const ChunkKey& k = a->fetch->keys[p->index];
  if (self->tier_) self->tier_->mark_arrival(k);  // another agent has it: not uploaded
  const Status kept = self->cache_->end_ingest(k, st.ok());
  if (!kept.ok() && self->tier_) self->tier_->arrival_failed(k);
  if (kept.ok()) {
    a->fetch->got[p->index] = 1;
    ++self->counters_->remote_hits;
    self->counters_->remote_bytes += p->bytes;
    ++a->link->stats.fetched;
    a->link->stats.fetched_bytes += p->bytes;
  } else {
    ++(kept == Code::kCorrupted ? self->counters_->checksum_failures
                                : self->counters_->read_errors);
    ++a->link->stats.errors;
  }
  if (--a->reads == 0) self->ask_done(a);
}

void ChunkReader::ask_done(Ask* a) {
  if (!a->unpin.empty() && a->link->state == PeerLink::State::kReady && !stopping_) {
    const auto n = static_cast<uint32_t>(a->unpin.size());
    std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kUnpin, n));
    peer::write_header(peer::Type::kUnpin, a->id, n, msg.data());
    std::memcpy(msg.data() + sizeof(peer::Header), a->unpin.data(), n * sizeof(ChunkKey));
    links_->send(a->link, std::move(msg), {});
  }
  Fetch* f = a->fetch;
  a->link->reads -= std::min<uint32_t>(a->link->reads, static_cast<uint32_t>(a->index.size()));
  asks_.erase(a->id);
  if (--f->asks == 0) fetch_done(f);
}

// An ask that will not be answered (timeout, failed holder, stopping): its keys
// are misses.
void ChunkReader::ask_failed(Ask* a, uint64_t* counter) {
  if (counter != nullptr) ++*counter;
  ++a->link->stats.errors;
  a->answered = true;
  a->unpin.clear();
  ask_done(a);
}

void ChunkReader::fetch_done(Fetch* f) {
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
    ++counters_->tier_fallbacks;
    if (ask_tier(f)) return;  // on_tier ends the fetch
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
    counters_->offered_chunks += here;
  }
  const uint64_t to = f->offer_from;
  f->offer_from = 0;
  if (!stopping_) links_->send(links_->link(to), std::move(msg), {});
}

}  // namespace dpukv
