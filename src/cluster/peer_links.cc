#include "cluster/peer_links.h"

#include <algorithm>
#include <cstring>

#include "cluster/peer_wire.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

PeerLinks::PeerLinks(const ClusterOptions& o, CacheEngine* cache, UcxNode* ucx, Directory* dir,
                     ClusterCounters* counters)
    : opts_(o),
      cache_(cache),
      ucx_(ucx),
      dir_(dir),
      counters_(counters),
      lent_(cache, o.lend_timeout_ms) {}

void PeerLinks::set_listener(FailedCb failed, BusyCb busy, void* arg) {
  failed_cb_ = failed;
  busy_cb_ = busy;
  cb_arg_ = arg;
}

PeerLink* PeerLinks::link(uint64_t node) {
  auto& l = links_[node];
  if (!l) {
    l = std::make_unique<PeerLink>();
    l->node = node;
    l->stats.node = node;
  }
  return l.get();
}

PeerLink* PeerLinks::find(uint64_t node) {
  auto it = links_.find(node);
  return it == links_.end() ? nullptr : it->second.get();
}

void PeerLinks::send(PeerLink* l, std::vector<uint8_t> msg, std::vector<ChunkKey> pinned) {
  if (l->ready()) {
    if (ucx_->send_control(l->peer, msg.data(), msg.size()).ok()) {
      if (!pinned.empty()) {
        peer::Header h;
        std::memcpy(&h, msg.data(), sizeof(h));
        lent_.lend(l->node, h.request, std::move(pinned), monotonic_ms());
      }
      return;
    }
    fail(l, "cannot send");
  }
  if (stopping_ || l->resting(monotonic_ms())) {
    if (!pinned.empty()) cache_->unpin(pinned.data(), static_cast<uint32_t>(pinned.size()));
    return;  // an ask sent nowhere times out (the reader's expire)
  }
  l->queued.push_back({std::move(msg), std::move(pinned)});
  if (l->state == PeerLink::State::kResolving) return;
  l->state = PeerLink::State::kResolving;
  auto* r = new Resolve{this, l->node};
  if (!dir_->find_node(l->node, &PeerLinks::on_node, r).ok()) {
    delete r;
    fail(l, "directory unreachable");
  }
}

void PeerLinks::on_node(void* arg, Status st, const std::string& description) {
  std::unique_ptr<Resolve> r(static_cast<Resolve*>(arg));
  PeerLinks* self = r->owner;
  PeerLink* l = self->find(r->node);
  if (l == nullptr) return;
  if (self->stopping_) {
    self->fail(l, "stopping");
    return;
  }
  if (!st.ok()) {
    self->fail(l, st == Code::kNotFound ? "not live in the directory" : "directory error");
    return;
  }
  // The description must be the node's own: a directory entry cannot redirect us.
  PeerDescription d;
  const auto* blob = reinterpret_cast<const uint8_t*>(description.data());
  uint32_t peer = UcxNode::kUnknownPeer;
  if (!parse_peer_description(blob, description.size(), &d).ok() || d.node_id != r->node ||
      !self->ucx_->connect(blob, description.size(), &peer).ok()) {
    self->fail(l, "bad description");
    return;
  }
  l->peer = peer;
  l->state = PeerLink::State::kReady;
  l->stats.connected = true;
  std::vector<PeerLink::Queued> q = std::move(l->queued);
  l->queued.clear();
  for (auto& m : q) self->send(l, std::move(m.msg), std::move(m.pinned));
}

void PeerLinks::fail(PeerLink* l, const char* why) {
  if (l->ready()) {
    ucx_->disconnect(l->peer);
    ++counters_->peers_failed;
  }
  if (!stopping_)
    LOG_WARN("cluster: peer %016llx: %s; its chunks are misses for %u ms",
             static_cast<unsigned long long>(l->node), why, opts_.retry_ms);
  l->state = PeerLink::State::kFailed;
  l->peer = UcxNode::kUnknownPeer;
  l->stats.connected = false;
  l->retry_at_ms = monotonic_ms() + opts_.retry_ms;
  for (auto& m : l->queued)
    if (!m.pinned.empty()) cache_->unpin(m.pinned.data(), static_cast<uint32_t>(m.pinned.size()));
  l->queued.clear();
  if (failed_cb_ != nullptr) failed_cb_(cb_arg_, l);
}

size_t PeerLinks::check(uint64_t now) {
  size_t n = 0;
  if (!lent_.empty() && now >= lent_check_ms_) {  // a walk of them, at most ten times a second
    const uint64_t expired = lent_.expire(now);
    counters_->pins_expired += expired;
    n += expired;
    lent_check_ms_ = now + 100;
  }
  if (now >= forget_check_ms_) {  // at most once a second
    n += forget_gone(now);
    forget_check_ms_ = now + 1000;
  }
  for (auto& [node, l] : links_)
    if (l->ready() && !ucx_->peer_ok(l->peer)) {
      fail(l.get(), "connection lost");
      ++n;
    }
  return n;
}

// Agents come and go (restarts take a new node id): a peer no longer live in the
// directory, with nothing of ours in flight to it, is dropped after forget_peer_ms,
// so stats() and the per-peer metrics do not grow with every restart.
size_t PeerLinks::forget_gone(uint64_t now) {
  if (!dir_->connected()) return 0;  // its live set may be stale
  size_t forgotten = 0;
  for (auto it = links_.begin(); it != links_.end();) {
    PeerLink* l = it->second.get();
    const bool busy = l->state == PeerLink::State::kResolving || !l->queued.empty() ||
                      l->reads != 0 || (busy_cb_ != nullptr && busy_cb_(cb_arg_, l)) ||
                      lent_.lends_to(l->node);
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
    if (l->ready()) ucx_->disconnect(l->peer);
    ++counters_->peers_forgotten;
    ++forgotten;
    it = links_.erase(it);
  }
  return forgotten;
}

std::vector<ClusterPeerStats> PeerLinks::stats() const {
  std::vector<ClusterPeerStats> out;
  for (const auto& [node, l] : links_) out.push_back(l->stats);
  std::sort(out.begin(), out.end(),
            [](const ClusterPeerStats& a, const ClusterPeerStats& b) { return a.node < b.node; });
  return out;
}

}  // namespace dpukv
