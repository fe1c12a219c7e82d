#include "comch/channel.h"

#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>

#include "runtime/fd_passing.h"
#include "runtime/log.h"

namespace dpukv {

using comch::MsgHeader;
using comch::MsgType;

ComchConnection::ComchConnection(ComchBase* owner, int fd, uint64_t id, uint32_t queue_depth)
    : owner_(owner),
      fd_(fd),
      id_(id),
      max_msg_(owner->opts_.max_msg_size),
      peer_heartbeat_ms_(owner->opts_.heartbeat_interval_ms),
      pending_(queue_depth) {}

void ComchConnection::on_fd_ready(uint32_t events) {
  owner_->on_conn_ready(this, events);
}

uint64_t ComchConnection::imported_bytes() const {
  uint64_t n = 0;
  for (const auto& m : imports_) n += m->length();
  return n;
}

bool ComchBase::import_fits(const ComchConnection* c, uint64_t more, const char** why) const {
  const uint64_t mine = c->imported_bytes() + c->other_import_bytes_;
  if (more > opts_.max_import_bytes_per_connection ||
      mine > opts_.max_import_bytes_per_connection - more) {
    *why = "exported memory over the per-client limit";
    return false;
  }
  const uint64_t all = import_bytes_all();
  if (more > opts_.max_import_bytes_total || all > opts_.max_import_bytes_total - more) {
    *why = "exported memory over the limit for all clients together";
    return false;
  }
  return opts_.import_allowed == nullptr || opts_.import_allowed(opts_.import_arg, c, more, why);
}

Mmap* ComchConnection::imported_map(uint64_t peer_map_id) const {
  for (const auto& m : imports_)
    if (m->peer_map_id() == peer_map_id) return m.get();
  return nullptr;
}

Status ComchConnection::release_import(Mmap* map) {
  for (auto it = imports_.begin(); it != imports_.end(); ++it) {
    if (it->get() != map) continue;
    if (map->live_buffers() != 0) return Code::kBadState;
    imports_.erase(it);
    ++owner_->counters_.imports_released;
    return Code::kSuccess;
  }
  return Code::kNotFound;
}

void ComchBase::fast_path_received(FastPathConsumer* fc, Buf* buf, const uint8_t* imm,
                                   uint32_t imm_len, Status st, UserData ud) {
  if (cb_.on_fp_recv) cb_.on_fp_recv(fc, buf, imm, imm_len, st, ud, user_data());
}

void ComchBase::peer_consumer(ComchConnection* c, uint64_t id, bool created) {
  auto cb = created ? cb_.on_consumer_new : cb_.on_consumer_expired;
  if (cb) cb(c, id, user_data());
}

ComchBase::ComchBase(ProgressEngine* pe, const ComchOptions& opts)
    : Context(pe), opts_(opts), fp_(this, pe, opts.max_imports_per_connection) {
  rx_.reset(new uint8_t[sizeof(MsgHeader) + comch::kMaxMsgLimit]);
  timer_.owner = this;
}

ComchBase::~ComchBase() {
  stop_timer();
  reap();
  for (ComchConnection* c : graveyard_) delete c;  // only if the user never drained
}

ComchBase::Counters ComchBase::counters() const {
  Counters c = counters_;
  c.fp_sent = fp_.counters().sent;
  c.fp_received = fp_.counters().received;
  c.fp_doorbells = fp_.counters().doorbells;
  return c;
}

Status ComchBase::create_consumer(ComchConnection* c, Mmap* map, uint32_t queue_size,
                                  FastPathConsumer** out) {
  return fp_.create_consumer(c, map, queue_size, out);
}

Status ComchBase::destroy_consumer(FastPathConsumer* consumer) {
  return fp_.destroy_consumer(consumer);
}

Status ComchBase::producer_send(ComchConnection* c, uint64_t consumer_id, const Buf* src,
                                const void* imm, uint32_t imm_len) {
  return fp_.producer_send(c, consumer_id, src, imm, imm_len);
}

Status ComchBase::set_callbacks(const ComchCallbacks& cb) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  cb_ = cb;
  return Code::kSuccess;
}

Status ComchBase::set_send_conf(uint32_t num_tasks) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  if (num_tasks == 0 || num_tasks > (1u << 20)) return Code::kInvalidValue;
  DPUKV_RETURN_IF_ERROR(pool_.reset(num_tasks));
  for (uint32_t i = 0; i < num_tasks; ++i)
    pool_.at(i).buf_.reset(new uint8_t[sizeof(MsgHeader) + opts_.max_msg_size]);
  done_ = std::make_unique<SpscRing<ComchSendTask*>>(num_tasks);
  return Code::kSuccess;
}

Status ComchBase::send_alloc_init(ComchConnection* c, const void* data, uint32_t len, UserData ud,
                                  ComchSendTask** out) {
  if (data == nullptr && len != 0) return Code::kInvalidValue;
  uint8_t* payload = nullptr;
  DPUKV_RETURN_IF_ERROR(send_alloc_payload(c, len, ud, out, &payload));
  if (len) std::memcpy(payload, data, len);
  return Code::kSuccess;
}

Status ComchBase::send_alloc_payload(ComchConnection* c, uint32_t len, UserData ud,
                                     ComchSendTask** out, uint8_t** payload) {
  if (c == nullptr || out == nullptr || payload == nullptr) return Code::kInvalidValue;
  if (!c->open()) return Code::kBadState;
  if (len > c->max_msg_) return Code::kTooBig;
  ComchSendTask* t = pool_.alloc();
  if (t == nullptr) return Code::kNoMemory;
  MsgHeader h{comch::kMagic, comch::kVersion, static_cast<uint16_t>(MsgType::kData), len, 0};
  std::memcpy(t->buf_.get(), &h, sizeof(h));
  t->len_ = static_cast<uint32_t>(sizeof(h)) + len;
  t->fd_ = -1;
  t->conn_ = c;
  t->ud_ = ud;
  t->status_ = Code::kSuccess;
  t->state_ = ComchSendTask::State::kAllocated;
  ++c->task_refs_;
  *out = t;
  *payload = t->buf_.get() + sizeof(h);
  return Code::kSuccess;
}

Status ComchBase::export_alloc_init(ComchConnection* c, const Mmap& map, uint64_t cookie,
                                    UserData ud, ComchSendTask** out) {
  if (c == nullptr || out == nullptr) return Code::kInvalidValue;
  if (!c->open()) return Code::kBadState;
  comch::ExportPayload p{};
  int fd = -1;
  DPUKV_RETURN_IF_ERROR(map.export_to(&p.desc, &fd));
  p.cookie = cookie;
  ComchSendTask* t = pool_.alloc();
  if (t == nullptr) return Code::kNoMemory;
  MsgHeader h{comch::kMagic, comch::kVersion, static_cast<uint16_t>(MsgType::kExport),
              static_cast<uint32_t>(sizeof(p)), 0};
  std::memcpy(t->buf_.get(), &h, sizeof(h));
  std::memcpy(t->buf_.get() + sizeof(h), &p, sizeof(p));
  t->len_ = static_cast<uint32_t>(sizeof(h) + sizeof(p));
  t->fd_ = fd;
  t->conn_ = c;
  t->ud_ = ud;
  t->status_ = Code::kSuccess;
  t->state_ = ComchSendTask::State::kAllocated;
  ++c->task_refs_;
  *out = t;
  return Code::kSuccess;
}

Status ComchBase::free(ComchSendTask* t) {
  if (!pool_.owns(t) || t->state_ != ComchSendTask::State::kAllocated) return Code::kInvalidValue;
  t->state_ = ComchSendTask::State::kFree;
  --t->conn_->task_refs_;
  t->conn_ = nullptr;
  pool_.free(t);
  return Code::kSuccess;
}

Status ComchBase::write_task(ComchConnection* c, ComchSendTask* t) {
  // The sequence number is stamped when the bytes leave, so queued tasks keep order.
  MsgHeader h;
  std::memcpy(&h, t->buf_.get(), sizeof(h));
  h.seq = c->send_seq_;
  std::memcpy(t->buf_.get(), &h, sizeof(h));
  Status st = send_with_fds(c->fd_, t->buf_.get(), t->len_, &t->fd_, t->fd_ >= 0 ? 1 : 0);
  if (st.ok()) {
    ++c->send_seq_;
    c->last_send_ns_ = monotonic_ns();
    ++counters_.msgs_sent;
  }
  return st;
}

Status ComchBase::submit(ComchSendTask* t) {
  if (!pool_.owns(t) || t->state_ != ComchSendTask::State::kAllocated) return Code::kInvalidValue;
  ComchConnection* c = t->conn_;
  if (!c->open()) return Code::kConnectionReset;
  if (c->pending_.empty()) {
    Status st = write_task(c, t);
    if (st.ok()) {
      t->state_ = ComchSendTask::State::kDone;
      (void)done_->push(t);  // sized to the pool
      return Code::kSuccess;
    }
    if (st != Code::kAgain) {
      close_connection(c, Code::kConnectionReset, "send failed");
      return Code::kConnectionReset;
    }
  }
  // Socket buffer full: queue, bounded.
  if (!c->pending_.push(t)) return Code::kAgain;
  t->state_ = ComchSendTask::State::kQueued;
  if (!c->want_out_) {
    c->want_out_ = true;
    (void)pe()->modify_fd(c->fd_, EPOLLIN | EPOLLOUT, c);
  }
  return Code::kSuccess;
}

void ComchBase::flush_pending(ComchConnection* c) {
  ComchSendTask* t;
  while (c->state_ != ComchConnection::State::kClosed && c->pending_.peek(&t)) {
    Status st = write_task(c, t);
    if (st == Code::kAgain) return;  // EPOLLOUT stays armed
    (void)c->pending_.pop(&t);
    if (!st.ok()) {
      finish_task(t, Code::kConnectionReset);
      close_connection(c, Code::kConnectionReset, "send failed");
      return;
    }
    t->state_ = ComchSendTask::State::kDone;
    (void)done_->push(t);
  }
  if (c->want_out_ && c->state_ != ComchConnection::State::kClosed) {
    c->want_out_ = false;
    (void)pe()->modify_fd(c->fd_, EPOLLIN, c);
  }
}

void ComchBase::finish_task(ComchSendTask* t, Status st) {
  t->status_ = st;
  t->state_ = ComchSendTask::State::kDone;
  (void)done_->push(t);
}

ComchConnection* ComchBase::new_connection(int fd, uint64_t id) {
  auto* c = new ComchConnection(this, fd, id, opts_.send_queue_depth);
  c->opened_ns_ = c->last_recv_ns_ = c->last_send_ns_ = monotonic_ns();
  if (!pe()->watch_fd(fd, EPOLLIN, c).ok()) {
    ::close(fd);
    delete c;
    return nullptr;
  }
  return c;
}

Status ComchBase::send_ctrl(ComchConnection* c, MsgType type, const void* payload, uint32_t len,
                            const int* fds, int nfds) {
  uint8_t buf[sizeof(MsgHeader) + 64];
  if (len > 64) return Code::kTooBig;
  MsgHeader h{comch::kMagic, comch::kVersion, static_cast<uint16_t>(type), len, c->send_seq_};
  std::memcpy(buf, &h, sizeof(h));
  if (len) std::memcpy(buf + sizeof(h), payload, len);
  // Control messages may not overtake queued data: their seq would be out of order
  // only if queued tasks were stamped already, which they are not (stamped on write).
  Status st = send_with_fds(c->fd_, buf, sizeof(h) + len, fds, nfds);
  if (st.ok()) {
    ++c->send_seq_;
    c->last_send_ns_ = monotonic_ns();
  }
  return st;
}

void ComchBase::open_connection(ComchConnection* c) {
  c->state_ = ComchConnection::State::kOpen;
  ++num_open_;
  if (cb_.on_connect) cb_.on_connect(c, user_data());
}

void ComchBase::close_connection(ComchConnection* c, Status reason, const char* why) {
  if (c->state_ == ComchConnection::State::kClosed) return;
  const bool was_open = c->state_ == ComchConnection::State::kOpen;
  if (reason == Code::kInvalidValue || reason == Code::kTooBig || reason == Code::kNotPermitted) {
    ++counters_.protocol_errors;
    LOG_WARN_LIMITED("comch: closing connection %llu (pid %d): %s",
                     static_cast<unsigned long long>(c->id_), static_cast<int>(c->peer_.pid), why);
  } else {
    LOG_INFO("comch: connection %llu (pid %d) closed: %s", static_cast<unsigned long long>(c->id_),
             static_cast<int>(c->peer_.pid), why);
  }
  if (reason == Code::kTimeout) ++counters_.heartbeat_timeouts;
  ++counters_.connections_closed;
  if (was_open) {
    // Best effort goodbye so the peer learns at once; ignored if the socket is full.
    if (reason == Code::kShutdown) (void)send_ctrl(c, MsgType::kBye, nullptr, 0);
  }
  c->state_ = ComchConnection::State::kClosed;
  pe()->unwatch_fd(c->fd_, c);
  ::close(c->fd_);
  c->fd_ = -1;
  ComchSendTask* t;
  while (c->pending_.pop(&t)) finish_task(t, Code::kConnectionReset);
  fp_.flush_consumers_of(c);
  if (was_open) {
    --num_open_;
    if (cb_.on_disconnect) cb_.on_disconnect(c, reason, user_data());
  }
  fp_.forget(c);  // before the imports its peer consumers' maps are
  for (auto& m : c->imports_) {
    ++counters_.imports_released;
    if (m->live_buffers() != 0) dead_maps_.push_back(std::move(m));
  }
  c->imports_.clear();
  on_connection_closed(c);
  graveyard_.push_back(c);
}

void ComchBase::on_conn_ready(ComchConnection* c, uint32_t events) {
  if (c->state_ == ComchConnection::State::kClosed) return;
  if (events & EPOLLOUT) flush_pending(c);
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    for (uint32_t i = 0; i < opts_.recv_budget && c->state_ != ComchConnection::State::kClosed;
         ++i) {
      size_t n = 0;
      int fds[kMaxPassedFds];
      int nfds = 0;
      Status st = recv_with_fds(c->fd_, rx_.get(), sizeof(MsgHeader) + c->max_msg_, &n, fds,
                                kMaxPassedFds, &nfds);
      if (st == Code::kAgain) break;
      if (st == Code::kTooBig) {
        close_connection(c, Code::kTooBig, "oversized message");
        break;
      }
      if (!st.ok()) {
        close_connection(c, Code::kConnectionReset, "peer closed the connection");
        break;
      }
      handle_record(c, n, fds, nfds);
    }
  }
}

void ComchBase::handle_record(ComchConnection* c, size_t n, int* fds, int nfds) {
  MsgHeader h;
  Status st = comch::parse_header(rx_.get(), n, c->max_msg_, c->recv_seq_, &h);
  if (!st.ok()) {
    close_fds(fds, nfds);
    close_connection(c, st, st == Code::kTooBig ? "message above max size" : "malformed header");
    return;
  }
  const auto type = static_cast<MsgType>(h.type);
  if (nfds != comch::fds_for_type(type)) {
    close_fds(fds, nfds);
    close_connection(c, Code::kInvalidValue, "unexpected file descriptors");
    return;
  }
  ++c->recv_seq_;
  c->last_recv_ns_ = monotonic_ns();
  ++counters_.msgs_received;
  counters_.bytes_received += n;
  const uint8_t* payload = rx_.get() + sizeof(MsgHeader);
  if (c->state_ == ComchConnection::State::kHandshake) {
    on_handshake_msg(c, h, payload);  // the subclass opens or closes it
    return;
  }
  switch (type) {
    case MsgType::kData:
      if (cb_.on_recv) cb_.on_recv(c, payload, h.length, user_data());
      return;
    case MsgType::kHeartbeat:
      return;
    case MsgType::kBye:
      close_connection(c, Code::kConnectionReset, "peer said goodbye");
      return;
    case MsgType::kExport: {
      comch::ExportPayload p;
      std::memcpy(&p, payload, sizeof(p));
      if (c->imports_.size() >= opts_.max_imports_per_connection) {
        close_fds(fds, nfds);
        close_connection(c, Code::kNotPermitted, "too many exported maps");
        return;
      }
      // The limits before anything is mapped: the length is the one the import
      // maps (it checks the fd holds it).
      const char* over = nullptr;
      if (!import_fits(c, p.desc.length, &over)) {
        close_fds(fds, nfds);
        close_connection(c, Code::kNotPermitted, over);
        return;
      }
      std::unique_ptr<Mmap> m;
      Status is = Mmap::import(&p.desc, sizeof(p.desc), fds[0], &m);
      close_fds(fds, nfds);  // the mapping keeps the memory
      if (is.ok()) is = m->start();
      if (!is.ok()) {
        close_connection(c, Code::kInvalidValue, "bad memory export");
        return;
      }
      ++counters_.imports;
      Mmap* raw = m.get();
      c->imports_.push_back(std::move(m));
      if (cb_.on_export) cb_.on_export(c, raw, p.cookie, user_data());
      return;
    }
    case MsgType::kConsumerNew:
      fp_.on_consumer_new(c, payload, fds, nfds);
      return;
    case MsgType::kConsumerExpired:
      fp_.on_consumer_expired(c, payload);
      return;
    case MsgType::kHello:
    case MsgType::kHelloAck:
    case MsgType::kRefused:
      close_connection(c, Code::kInvalidValue, "handshake message after handshake");
      return;
  }
}

void ComchBase::heartbeat_tick(ComchConnection* c, uint64_t now) {
  if (c->state_ != ComchConnection::State::kOpen) return;
  const uint64_t ms = 1000000ull;
  if (now - c->last_recv_ns_ >
      static_cast<uint64_t>(c->peer_heartbeat_ms_) * opts_.heartbeat_misses * ms) {
    // This side may be the one that was starved: the peer's heartbeats then wait
    // unread in the socket. Silence is judged on what arrived, not on what was read.
    int unread = 0;
    if (::ioctl(c->fd(), FIONREAD, &unread) == 0 && unread > 0) {
      c->last_recv_ns_ = now;
      return;
    }
    close_connection(c, Code::kTimeout, "heartbeat timeout");
    return;
  }
  if (now - c->last_send_ns_ >= static_cast<uint64_t>(opts_.heartbeat_interval_ms) * ms &&
      c->pending_.empty()) {
    Status st = send_ctrl(c, MsgType::kHeartbeat, nullptr, 0);
    if (st == Code::kConnectionReset) close_connection(c, st, "peer closed the connection");
  }
}

void ComchBase::Timer::on_fd_ready(uint32_t) {
  uint64_t expirations;
  ssize_t r = ::read(fd, &expirations, sizeof(expirations));
  (void)r;
  owner->on_timer();
}

Status ComchBase::start_timer(uint32_t period_ms) {
  if (timer_.fd >= 0) return Code::kSuccess;
  timer_.fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (timer_.fd < 0) return Code::kDriver;
  itimerspec its{};
  its.it_interval.tv_sec = period_ms / 1000;
  its.it_interval.tv_nsec = static_cast<long>(period_ms % 1000) * 1000000L;
  its.it_value = its.it_interval;
  if (timerfd_settime(timer_.fd, 0, &its, nullptr) != 0 ||
      !pe()->watch_fd(timer_.fd, EPOLLIN, &timer_).ok()) {
    ::close(timer_.fd);
    timer_.fd = -1;
    return Code::kDriver;
  }
  return Code::kSuccess;
}

void ComchBase::stop_timer() {
  if (timer_.fd < 0) return;
  pe()->unwatch_fd(timer_.fd, &timer_);
  ::close(timer_.fd);
  timer_.fd = -1;
}

void ComchBase::reap() {
  graveyard_.erase(std::remove_if(graveyard_.begin(), graveyard_.end(),
                                  [](ComchConnection* c) {
                                    if (c->task_refs_ != 0) return false;
                                    delete c;
                                    return true;
                                  }),
                   graveyard_.end());
  dead_maps_.erase(std::remove_if(dead_maps_.begin(), dead_maps_.end(),
                                  [](const std::unique_ptr<Mmap>& m) {
                                    if (m->live_buffers() != 0) return false;
                                    (void)m->stop();
                                    return true;
                                  }),
                   dead_maps_.end());
}

size_t ComchBase::poll() {
  size_t events = fp_.poll();
  ComchSendTask* batch[64];
  if (done_) {
    size_t n;
    while ((n = done_->pop_bulk(batch, 64)) != 0) {
      for (size_t i = 0; i < n; ++i) {
        ComchSendTask* t = batch[i];
        t->state_ = ComchSendTask::State::kAllocated;
        if (t->status_.ok() && state() == CtxState::kStopping) t->status_ = Code::kShutdown;
        ComchSendCb cb = t->status_.ok() ? cb_.on_send_done : cb_.on_send_error;
        if (cb != nullptr)
          cb(t, t->ud_, user_data());
        else
          (void)free(t);
      }
      events += n;
    }
  }
  if (!graveyard_.empty() || !dead_maps_.empty()) reap();
  return events;
}

void ComchBase::disarm_notification() {
  fp_.disarm();
}

bool ComchBase::arm_notification() {
  bool pending = done_ && !done_->empty();
  pending |= fp_.arm();
  return pending;
}

bool ComchBase::drained() {
  if (pool_.outstanding() != 0 || (done_ && !done_->empty())) return false;
  reap();
  return true;
}

}  // namespace dpukv
