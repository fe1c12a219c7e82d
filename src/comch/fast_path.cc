#include "comch/fast_path.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "runtime/copy_routines.h"
#include "runtime/fd_passing.h"
#include "runtime/log.h"

namespace dpukv {

using fastpath::CompEntry;
using fastpath::PostEntry;
using fastpath::RingShared;

void FastPathConsumer::on_fd_ready(uint32_t) {
  uint64_t v;
  ssize_t r = ::read(doorbell_, &v, sizeof(v));
  (void)r;  // the ring, not the counter, says what arrived; poll() reads it
}

Status FastPathConsumer::post_recv(Buf* buf, UserData ud) {
  if (buf == nullptr || buf->mmap() != data_map_ || buf->list_len() != 1)
    return Code::kInvalidValue;
  if (!conn_->open()) return Code::kConnectionReset;
  if (posted_ == q_) return Code::kAgain;
  const size_t room = buf->tail_room();
  if (room == 0 || room > UINT32_MAX) return Code::kInvalidValue;
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  slots_[slot] = {buf, ud};
  ++posted_;
  PostEntry e{static_cast<uint64_t>(buf->data() + buf->data_len() - data_map_->addr()),
              static_cast<uint32_t>(room), slot};
  fastpath::posts(ring_)[post_tail_ & (q_ - 1)] = e;
  ring_->post_tail.store(++post_tail_, std::memory_order_release);
  return Code::kSuccess;
}

size_t FastPathConsumer::poll() {
  const uint64_t tail = ring_->comp_tail.load(std::memory_order_acquire);
  if (tail == comp_head_) return 0;
  if (tail - comp_head_ > q_) {
    owner_->close_connection(conn_, Code::kInvalidValue,
                             "fast path: completion index out of range");
    return 1;
  }
  size_t n = 0;
  CompEntry* comps = fastpath::comps(ring_, q_);
  while (comp_head_ != tail) {
    CompEntry e;
    std::memcpy(&e, &comps[comp_head_ & (q_ - 1)], sizeof(e));
    Slot* s = e.post_id < q_ ? &slots_[e.post_id] : nullptr;
    if (s == nullptr || s->buf == nullptr || e.len > s->buf->tail_room() ||
        e.imm_len > kMaxImmData) {
      owner_->close_connection(conn_, Code::kInvalidValue, "fast path: bad completion");
      return n + 1;
    }
    Buf* buf = s->buf;
    UserData ud = s->ud;
    s->buf = nullptr;
    free_slots_.push_back(e.post_id);
    --posted_;
    (void)buf->set_data_len(buf->data_len() + e.len);
    ring_->comp_head.store(++comp_head_, std::memory_order_release);
    ++owner_->counters_.received;
    ++n;
    owner_->host_->fast_path_received(this, buf, e.imm, e.imm_len, Code::kSuccess, ud);
    if (!conn_->open()) break;  // the callback may have closed things
  }
  return n;
}

void FastPathConsumer::disarm() {
  if (!sleeping_) return;
  ring_->consumer_sleeping.store(0, std::memory_order_relaxed);
  sleeping_ = false;
}

bool FastPathConsumer::arm() {
  sleeping_ = true;
  ring_->consumer_sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return ring_->comp_tail.load(std::memory_order_acquire) != comp_head_;
}

Status FastPath::create_consumer(ComchConnection* c, Mmap* map, uint32_t queue_size,
                                 FastPathConsumer** out) {
  if (c == nullptr || map == nullptr || out == nullptr) return Code::kInvalidValue;
  if (queue_size == 0 || queue_size > 65536 || (queue_size & (queue_size - 1)) != 0)
    return Code::kInvalidValue;
  if (!c->open()) return Code::kBadState;
  if ((map->access() & kAccessExportReadWrite) == 0) return Code::kNotPermitted;
  auto fc = std::unique_ptr<FastPathConsumer>(new FastPathConsumer());
  fc->owner_ = this;
  fc->conn_ = c;
  fc->id_ = next_consumer_id_++;
  fc->q_ = queue_size;
  fc->data_map_ = map;
  fc->slots_.resize(queue_size);
  for (uint32_t i = queue_size; i-- > 0;) fc->free_slots_.push_back(i);
  MemRegionOptions mo;
  mo.name = "dpukv-fastpath";
  mo.huge_pages = false;
  DPUKV_RETURN_IF_ERROR(MemRegion::create(fastpath::ring_bytes(queue_size), mo, &fc->ring_mem_));
  DPUKV_RETURN_IF_ERROR(Mmap::create(fc->ring_mem_->data(), fc->ring_mem_->size(),
                                     kAccessLocalReadWrite | kAccessExportReadWrite,
                                     fc->ring_mem_->fd(), 0, &fc->ring_map_));
  DPUKV_RETURN_IF_ERROR(fc->ring_map_->start());
  fc->ring_ = new (fc->ring_mem_->data()) RingShared();
  fc->ring_->magic = RingShared::kMagic;
  fc->ring_->queue_size = queue_size;
  fc->doorbell_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fc->doorbell_ < 0) return Code::kDriver;

  // Announce: first the data map (an ordinary export), then the consumer.
  comch::ExportPayload ep{};
  int map_fd = -1;
  Status st = map->export_to(&ep.desc, &map_fd);
  if (st.ok()) st = host_->send_ctrl(c, comch::MsgType::kExport, &ep, sizeof(ep), &map_fd, 1);
  comch::ConsumerNewPayload np{};
  np.consumer_id = fc->id_;
  np.data_map_id = map->id();
  int ring_fd = -1;
  if (st.ok()) st = fc->ring_map_->export_to(&np.ring, &ring_fd);
  int fds[2] = {ring_fd, fc->doorbell_};
  if (st.ok()) st = host_->send_ctrl(c, comch::MsgType::kConsumerNew, &np, sizeof(np), fds, 2);
  if (st.ok()) st = pe_->watch_fd(fc->doorbell_, EPOLLIN, fc.get());
  if (!st.ok()) {
    ::close(fc->doorbell_);
    if (st == Code::kConnectionReset) close_connection(c, st, "peer closed the connection");
    return st;
  }
  *out = fc.get();
  consumers_.push_back(std::move(fc));
  return Code::kSuccess;
}

void FastPath::flush(FastPathConsumer* fc, Status why) {
  for (uint32_t i = 0; i < fc->q_; ++i) {
    FastPathConsumer::Slot& s = fc->slots_[i];
    if (s.buf == nullptr) continue;
    Buf* buf = s.buf;
    UserData ud = s.ud;
    s.buf = nullptr;
    fc->free_slots_.push_back(i);
    --fc->posted_;
    host_->fast_path_received(fc, buf, nullptr, 0, why, ud);
  }
}

void FastPath::flush_consumers_of(ComchConnection* c) {
  for (auto& fc : consumers_)
    if (fc->conn_ == c) flush(fc.get(), Code::kConnectionReset);
}

void FastPath::forget(ComchConnection* c) {
  for (auto it = peer_consumers_.begin(); it != peer_consumers_.end();) {
    if ((*it)->conn != c) {
      ++it;
      continue;
    }
    if ((*it)->doorbell_fd >= 0) ::close((*it)->doorbell_fd);
    it = peer_consumers_.erase(it);
  }
  for (auto it = consumers_.begin(); it != consumers_.end();) {
    FastPathConsumer* fc = it->get();
    if (fc->conn_ != c) {
      ++it;
      continue;
    }
    flush(fc, Code::kConnectionReset);
    pe_->unwatch_fd(fc->doorbell_, fc);
    ::close(fc->doorbell_);
    it = consumers_.erase(it);
  }
}

Status FastPath::destroy_consumer(FastPathConsumer* fc) {
  auto it = std::find_if(consumers_.begin(), consumers_.end(),
                         [&](const auto& p) { return p.get() == fc; });
  if (it == consumers_.end()) return Code::kNotFound;
  ComchConnection* c = fc->conn_;
  if (c->open()) {
    comch::ConsumerExpiredPayload p{fc->id_};
    (void)host_->send_ctrl(c, comch::MsgType::kConsumerExpired, &p, sizeof(p), nullptr, 0);
  }
  flush(fc, Code::kShutdown);
  pe_->unwatch_fd(fc->doorbell_, fc);
  ::close(fc->doorbell_);
  consumers_.erase(it);
  return Code::kSuccess;
}

Status FastPath::producer_send(ComchConnection* c, uint64_t consumer_id, const Buf* src,
                               const void* imm, uint32_t imm_len) {
  if (c == nullptr || src == nullptr || (imm == nullptr && imm_len != 0))
    return Code::kInvalidValue;
  if (imm_len > kMaxImmData) return Code::kTooBig;
  if (!c->open()) return Code::kConnectionReset;
  fastpath::PeerConsumer* pc = find_peer_consumer(c, consumer_id);
  if (pc == nullptr) return Code::kNotFound;
  RingShared* r = pc->ring;
  const uint32_t q = pc->q;
  const uint64_t post_tail = r->post_tail.load(std::memory_order_acquire);
  const uint64_t comp_head = r->comp_head.load(std::memory_order_acquire);
  if (post_tail - pc->post_head > q || pc->comp_tail - comp_head > q) {
    close_connection(c, Code::kInvalidValue, "fast path: peer ring indices out of range");
    return Code::kConnectionReset;
  }
  if (post_tail == pc->post_head || pc->comp_tail - comp_head == q) return Code::kAgain;
  PostEntry e;
  std::memcpy(&e, &fastpath::posts(r)[pc->post_head & (q - 1)], sizeof(e));
  if (e.post_id >= q || e.offset > pc->data_map->length() ||
      e.capacity > pc->data_map->length() - e.offset) {
    close_connection(c, Code::kInvalidValue, "fast path: posted buffer outside the peer's map");
    return Code::kConnectionReset;
  }
  uint64_t total = 0;
  for (const Buf* b = src; b != nullptr; b = b->next()) {
    if (b->mmap() == nullptr || !b->mmap()->readable()) return Code::kNotPermitted;
    total += b->data_len();
  }
  if (total > e.capacity) return Code::kTooBig;
  uint8_t* dst = pc->data_map->addr() + e.offset;
  static const CopyPolicy kCopy = [] {
    CopyPolicy p;
    p.resolve();
    return p;
  }();
  for (const Buf* b = src; b != nullptr; b = b->next()) {
    kCopy.pick(b->data_len())(dst, b->data(), b->data_len());
    dst += b->data_len();
  }
  CompEntry ce{};
  ce.post_id = e.post_id;
  ce.len = static_cast<uint32_t>(total);
  ce.imm_len = imm_len;
  if (imm_len) std::memcpy(ce.imm, imm, imm_len);
  std::memcpy(&fastpath::comps(r, q)[pc->comp_tail & (q - 1)], &ce, sizeof(ce));
  r->post_head.store(++pc->post_head, std::memory_order_release);
  r->comp_tail.store(++pc->comp_tail, std::memory_order_release);
  ++counters_.sent;
  // Ring the doorbell only for a consumer that announced it is going to sleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (r->consumer_sleeping.load(std::memory_order_relaxed) != 0) {
    r->consumer_sleeping.store(0, std::memory_order_relaxed);
    const uint64_t one = 1;
    ssize_t w = ::write(pc->doorbell_fd, &one, sizeof(one));
    (void)w;
    ++counters_.doorbells;
  }
  return Code::kSuccess;
}

void FastPath::on_consumer_new(ComchConnection* c, const uint8_t* payload, int* fds, int nfds) {
  comch::ConsumerNewPayload p;
  std::memcpy(&p, payload, sizeof(p));
  auto pc = std::make_unique<fastpath::PeerConsumer>();
  pc->conn = c;
  pc->id = p.consumer_id;
  pc->data_map = c->imported_map(p.data_map_id);
  Status is = pc->data_map == nullptr ? Status(Code::kNotFound)
              : !pc->data_map->writable()
                  ? Status(Code::kNotPermitted)
                  : Mmap::import(&p.ring, sizeof(p.ring), fds[0], &pc->ring_map);
  if (is.ok()) is = pc->ring_map->start();
  if (is.ok()) {
    // Read the geometry once; later reads of the peer's header are not trusted.
    pc->ring = reinterpret_cast<RingShared*>(pc->ring_map->addr());
    const uint32_t magic = pc->ring->magic;
    pc->q = pc->ring->queue_size;
    if (pc->ring_map->length() < sizeof(RingShared) || magic != RingShared::kMagic || pc->q == 0 ||
        pc->q > 65536 || (pc->q & (pc->q - 1)) != 0 ||
        pc->ring_map->length() < fastpath::ring_bytes(pc->q) || !pc->ring_map->writable())
      is = Code::kInvalidValue;
  }
  const auto of_c = std::count_if(peer_consumers_.begin(), peer_consumers_.end(),
                                  [&](const auto& x) { return x->conn == c; });
  if (is.ok() && (find_peer_consumer(c, p.consumer_id) != nullptr ||
                  static_cast<uint64_t>(of_c) >= max_peer_consumers_))
    is = Code::kInvalidValue;
  if (!is.ok()) {
    close_fds(fds, nfds);
    close_connection(c, Code::kInvalidValue, "bad consumer announcement");
    return;
  }
  ::close(fds[0]);
  pc->doorbell_fd = fds[1];
  pc->post_head = pc->ring->post_head.load(std::memory_order_acquire);
  pc->comp_tail = pc->ring->comp_tail.load(std::memory_order_acquire);
  peer_consumers_.push_back(std::move(pc));
  host_->peer_consumer(c, p.consumer_id, true);
}

void FastPath::on_consumer_expired(ComchConnection* c, const uint8_t* payload) {
  comch::ConsumerExpiredPayload p;
  std::memcpy(&p, payload, sizeof(p));
  auto it = std::find_if(peer_consumers_.begin(), peer_consumers_.end(),
                         [&](const auto& pc) { return pc->conn == c && pc->id == p.consumer_id; });
  if (it == peer_consumers_.end()) {
    close_connection(c, Code::kInvalidValue, "unknown consumer expired");
    return;
  }
  ::close((*it)->doorbell_fd);
  peer_consumers_.erase(it);
  host_->peer_consumer(c, p.consumer_id, false);
}

size_t FastPath::poll() {
  size_t events = 0;
  for (size_t i = 0; i < consumers_.size(); ++i) events += consumers_[i]->poll();
  return events;
}

bool FastPath::arm() {
  bool pending = false;
  for (auto& fc : consumers_) pending |= fc->arm();
  return pending;
}

void FastPath::disarm() {
  for (auto& fc : consumers_) fc->disarm();
}

fastpath::PeerConsumer* FastPath::find_peer_consumer(const ComchConnection* c, uint64_t id) {
  for (auto& pc : peer_consumers_)
    if (pc->conn == c && pc->id == id) return pc.get();
  return nullptr;
}

}  // namespace dpukv
