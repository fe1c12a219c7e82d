#include "cluster/chunk_holder.h"

#include <cstring>

#include "runtime/clock.h"

namespace dpukv {

ChunkHolder::ChunkHolder(const ClusterOptions& o, CacheEngine* cache, PeerLinks* links,
                         ClusterCounters* counters)
    : opts_(o), cache_(cache), links_(links), counters_(counters) {}

// ---- answering PINs ------------------------------------------------------------

void ChunkHolder::on_pin(uint64_t sender, const peer::Message& m) {
  ++counters_->served_requests;
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
    if (!cache_->prefetch(raw->keys[i], &ChunkHolder::on_prefetched, raw).ok()) --raw->prefetching;
  }
  on_prefetched(raw, Code::kSuccess);  // drops the guard
}

void ChunkHolder::on_prefetched(void* arg, Status) {
  auto* s = static_cast<Serve*>(arg);
  if (--s->prefetching != 0) return;
  ChunkHolder* self = s->owner;
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

void ChunkHolder::answer(Serve* s) {
  const auto n = static_cast<uint32_t>(s->keys.size());
  std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kPlaced, n));
  peer::write_header(peer::Type::kPlaced, s->request, n, msg.data());
  std::vector<ChunkKey> pinned;
  PeerLink* l = links_->link(s->sender);
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
      ++counters_->served_chunks;
      counters_->served_bytes += p.stored;
      ++l->stats.served;
      l->stats.served_bytes += p.stored;
    }
    std::memcpy(msg.data() + sizeof(peer::Header) + i * sizeof(p), &p, sizeof(p));
  }
  links_->send(l, std::move(msg), std::move(pinned));
}

// ---- prefill-to-decode offers ----------------------------------------------------

void ChunkHolder::push(uint64_t node, const ChunkKey* keys, uint32_t n, PushCb cb, void* arg) {
  auto o = std::make_unique<Offer>();
  o->id = next_request_++;
  o->link = links_->link(node);
  o->cb = cb;
  o->arg = arg;
  o->n = n;
  o->deadline_ms = monotonic_ms() + 8ull * opts_.request_timeout_ms;  // the reads take time
  std::vector<uint8_t> msg(peer::message_bytes(peer::Type::kOffer, n));
  peer::write_header(peer::Type::kOffer, o->id, n, msg.data());
  std::memcpy(msg.data() + sizeof(peer::Header), keys, n * sizeof(ChunkKey));
  PeerLink* l = o->link;
  offers_.emplace(o->id, std::move(o));
  ++counters_->pushes;
  links_->send(l, std::move(msg), {});  // a link that fails ends the offer (link_failed)
}

void ChunkHolder::offer_done(Offer* o, Status st, const uint8_t* taken) {
  std::unique_ptr<Offer> owned = std::move(offers_[o->id]);
  offers_.erase(o->id);
  std::vector<uint8_t> none;
  if (taken == nullptr) {
    none.assign(o->n, static_cast<uint8_t>(st.code()));
    taken = none.data();
  } else {
    for (uint32_t i = 0; i < o->n; ++i) counters_->pushed_chunks += taken[i] == 0;
  }
  o->cb(o->arg, st, taken, o->n);
}

void ChunkHolder::on_taken(PeerLink* l, const peer::Message& m) {
  auto it = offers_.find(m.request);
  if (it == offers_.end() || it->second->link != l || it->second->n != m.count) {
    ++counters_->bad_messages;  // late (timed out), or not an answer to us
    return;
  }
  offer_done(it->second.get(), Code::kSuccess, m.items);
}

void ChunkHolder::link_failed(PeerLink* l) {
  std::vector<Offer*> gone;
  for (auto& [id, o] : offers_)
    if (o->link == l) gone.push_back(o.get());
  for (Offer* o : gone) offer_done(o, Code::kConnectionReset, nullptr);
}

size_t ChunkHolder::expire(uint64_t now) {
  std::vector<Offer*> late;
  for (auto& [id, o] : offers_)
    if (now >= o->deadline_ms) late.push_back(o.get());
  for (Offer* o : late) {
    ++counters_->timeouts;
    offer_done(o, Code::kTimeout, nullptr);
  }
  return late.size();
}

void ChunkHolder::end_offers(Status st) {
  std::vector<Offer*> all;
  for (auto& [id, o] : offers_) all.push_back(o.get());
  for (Offer* o : all) offer_done(o, st, nullptr);
}

bool ChunkHolder::uses(const PeerLink* l) const {
  for (const auto& [id, o] : offers_)
    if (o->link == l) return true;
  return false;
}

}  // namespace dpukv
