#include "cluster/cluster_node.h"

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

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
  ClusterNode* n = c.get();
  n->links_ = std::make_unique<PeerLinks>(o, cache, n->ucx_.get(), n->dir_.get(), &n->counters_);
  n->links_->set_listener(&ClusterNode::on_link_failed, &ClusterNode::link_busy, n);
  n->reader_ =
      std::make_unique<ChunkReader>(o, n->ucx_->node_id(), cache, n->ucx_.get(), n->dir_.get(),
                                    n->tier_.get(), n->links_.get(), &n->counters_);
  n->holder_ = std::make_unique<ChunkHolder>(o, cache, n->links_.get(), &n->counters_);
  n->ucx_->set_control_handler(&ClusterNode::on_control, n);
  *out = std::move(c);
  return Code::kSuccess;
}

ClusterNode::~ClusterNode() {
  stopping_ = true;
  if (links_) links_->set_stopping();
  if (reader_) reader_->set_stopping();
  if (tier_) tier_->stop();
  cache_->remove_residency_listener(&ClusterNode::on_residency, this);
  dir_.reset();  // its pending callbacks run now, into parts that still exist
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
  links_->set_stopping();
  reader_->set_stopping();
  if (tier_) tier_->stop();
  cache_->remove_residency_listener(&ClusterNode::on_residency, this);
  reader_->fail_open();
  holder_->end_offers(Code::kShutdown);
  (void)ucx_->stop();
  (void)dir_->stop();
  links_->give_all_back();
}

bool ClusterNode::drained() {
  return !holder_->serving() && reader_->fetching() == 0 && ucx_->state() == CtxState::kIdle &&
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

void ClusterNode::on_link_failed(void* arg, PeerLink* l) {
  auto* self = static_cast<ClusterNode*>(arg);
  self->reader_->link_failed(l);
  self->holder_->link_failed(l);
}

bool ClusterNode::link_busy(void* arg, const PeerLink* l) {
  auto* self = static_cast<ClusterNode*>(arg);
  return self->reader_->uses(l) || self->holder_->uses(l);
}

Status ClusterNode::fetch(const ChunkKey* keys, uint32_t n, FetchCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  return reader_->fetch(keys, n, cb, arg);
}

Status ClusterNode::push(uint64_t node, const ChunkKey* keys, uint32_t n, PushCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (keys == nullptr || n == 0 || n > peer::kMaxKeys || cb == nullptr || node == node_id())
    return Code::kInvalidValue;
  holder_->push(node, keys, n, cb, arg);
  return Code::kSuccess;
}

// Every control message is parsed and checked first; each type goes to its part,
// and an answer only from a node this one knows.
void ClusterNode::on_control(void* arg, uint64_t sender, uint32_t, const uint8_t* msg, size_t len) {
  auto* self = static_cast<ClusterNode*>(arg);
  if (self->stopping_) return;
  peer::Message m;
  if (!parse_peer_message(msg, len, &m).ok() || sender == self->node_id()) {
    ++self->counters_.bad_messages;
    if (PeerLink* l = self->links_->find(sender)) self->links_->fail(l, "malformed message");
    LOG_WARN("cluster: malformed control message (%zu bytes) from %016llx; dropped", len,
             static_cast<unsigned long long>(sender));
    return;
  }
  PeerLink* known = self->links_->find(sender);
  switch (m.type) {
    case peer::Type::kPin:
      self->holder_->on_pin(sender, m);
      return;
    case peer::Type::kPlaced:
      if (known != nullptr)
        self->reader_->on_placed(known, m);
      else
        ++self->counters_.bad_messages;  // we asked it nothing
      return;
    case peer::Type::kUnpin:
      // Releases what this reader was lent for that request, whatever keys it names:
      // no one else's pins, and each once.
      if (!self->links_->give_back(sender, m.request)) ++self->counters_.bad_messages;
      return;
    case peer::Type::kOffer:
      self->reader_->take_offer(sender, m);
      return;
    case peer::Type::kTaken:
      if (known != nullptr)
        self->holder_->on_taken(known, m);
      else
        ++self->counters_.bad_messages;
      return;
  }
}

size_t ClusterNode::poll() {
  if (state() != CtxState::kRunning) return 0;
  size_t n = tier_ ? tier_->poll() : 0;
  const uint64_t now = monotonic_ms();
  n += links_->check(now);
  n += reader_->expire(now);
  n += holder_->expire(now);
  return n;
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
  return links_->stats();
}

}  // namespace dpukv
