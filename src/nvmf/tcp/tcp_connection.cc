#include <arpa/inet.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "nvme/tcp_wire.h"
#include "nvmf/tcp/tcp_connection.h"
#include "runtime/call_queue.h"
#include "runtime/clock.h"
#include "runtime/crc32c.h"
#include "runtime/log.h"

namespace dpukv::nvme {

using namespace tcp;

void TcpConnection::close(const char* why) {
  if (closing_) return;
  closing_ = true;
  LOG_INFO("nvme-tcp: connection %d (qid %u) closed: %s", fd_, qid_, why);
  ::shutdown(fd_, SHUT_RDWR);
  // A shut-down socket is readable forever (EOF): out of the poll set now, or the
  // poll group would wake on it in every pass until the connection is reaped.
  epoll_ctl(poll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
  // Commands waiting for data will never get it; those on a block device finish
  // and are dropped in req_complete().
  for (uint16_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == SlotState::kAwaitingData) {
      ctrl_->release(s.r);
      s.r = nullptr;
      set_slot(i, SlotState::kFree);
    }
  }
  discard_output();  // nothing queued will reach the host now
  // The host's Asynchronous Event Requests wait in the controller, each holding
  // a slot of this queue: with the admin queue gone nobody can receive them.
  if (qid_ == 0 && ctrl_ != nullptr) ctrl_->drop_async_events();
}

void TcpConnection::put_header(uint8_t type, uint8_t flags, uint8_t hlen, uint8_t pdo,
                               uint32_t plen, const void* rest, size_t rest_len) {
  uint8_t* h = out(hlen);
  CommonHeader ch{type, flags, hlen, pdo, plen};
  std::memcpy(h, &ch, sizeof ch);
  std::memcpy(h + sizeof ch, rest, rest_len);
  if (hdgst_ && type != kIcResp && type != kC2HTermReq) {
    uint32_t d = crc32c(obuf_.get() + olen_ - hlen, hlen);
    std::memcpy(out(4), &d, 4);
  }
  ++t_->counters().pdus_out;
}

void TcpConnection::fatal(uint16_t fes, uint32_t fei, const uint8_t* hdr, uint32_t hlen) {
  // C2HTermReq carries the offending header (up to 128 bytes); no digests.
  uint32_t copy = std::min<uint32_t>(hlen, 128);
  TermReq tr{};
  tr.ch = CommonHeader{kC2HTermReq, 0, sizeof(TermReq), 0,
                       static_cast<uint32_t>(sizeof(TermReq) + copy)};
  tr.fes = fes;
  tr.fei = fei;
  std::memcpy(out(sizeof tr), &tr, sizeof tr);
  if (copy > 0) std::memcpy(out(copy), hdr, copy);
  ++t_->counters().term_reqs_sent;
  ++t_->counters().pdus_out;
  LOG_WARN_LIMITED("nvme-tcp: connection %d: fatal transport error %u (field %u); terminating", fd_,
                   fes, fei);
  flush();
  close("fatal transport error");
}

bool TcpConnection::flush() {
  constexpr size_t kMaxIov = 64;
  while (!segs_.empty()) {
    iovec iov[kMaxIov];
    size_t n = 0;
    for (size_t i = 0; i < segs_.size() && n < kMaxIov; ++i, ++n) {
      const OutSeg& g = segs_[i];
      const uint8_t* base = g.data != nullptr ? g.data : obuf_.get() + g.off;
      const size_t skip = i == 0 ? seg_pos_ : 0;
      iov[n] = iovec{const_cast<uint8_t*>(base) + skip, g.len - skip};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    ssize_t sent = ::sendmsg(fd_, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (sent <= 0) {
      discard_output();
      close("send failed");
      return false;
    }
    // Whole segments leave the queue; a slot whose data went is free again.
    size_t left = static_cast<size_t>(sent), done = 0;
    while (done < segs_.size() && left >= segs_[done].len - seg_pos_) {
      left -= segs_[done].len - seg_pos_;
      seg_pos_ = 0;
      if (segs_[done].data != nullptr) {
        set_slot(segs_[done].slot, SlotState::kFree);  // its command already completed
      }
      ++done;
    }
    seg_pos_ += left;
    segs_.erase(segs_.begin(), segs_.begin() + static_cast<long>(done));
  }
  olen_ = 0;
  seg_pos_ = 0;
  return true;
}

void TcpConnection::discard_output() {
  for (const OutSeg& g : segs_)
    if (g.data != nullptr && slots_[g.slot].state == SlotState::kSendingData)
      set_slot(g.slot, SlotState::kFree);
  segs_.clear();
  olen_ = 0;
  seg_pos_ = 0;
}

// The slot life cycle of tcp_connection.h, the one place it is written down as
// code: [from][to]. Staying in a state is not a transition (set_slot returns).
bool TcpConnection::slot_transition_allowed(SlotState from, SlotState to) {
  constexpr bool kAllowed[4][4] = {
      // to: Free  Executing AwaitingData SendingData
      {false, true, false, false},  // from Free: a command capsule took it
      {true, false, true, true},    // from Executing: done, R2T sent, or answered with data
      {true, true, false, false},   // from AwaitingData: the data came (or the queue closed)
      {true, false, false, false},  // from SendingData: the socket took its data
  };
  return kAllowed[static_cast<size_t>(from)][static_cast<size_t>(to)];
}

void TcpConnection::set_slot(uint16_t slot, SlotState to) {
  Slot& s = slots_[slot];
  if (s.state == to) return;
  if (!slot_transition_allowed(s.state, to)) {
    // A bug in this file: debug and sanitizer builds stop here; a release build
    // says so and goes on, the slot accounting kept.
    LOG_ERR("nvme-tcp: slot %u moved from state %u to %u, which its life cycle does not allow",
            slot, static_cast<unsigned>(s.state), static_cast<unsigned>(to));
    assert(false && "slot transition not in the life cycle");
  }
  if (to == SlotState::kFree) {
    free_slots_.push_back(slot);
    --busy_slots_;
  } else if (s.state == SlotState::kFree) {  // taken: the caller popped it off free_slots_
    ++busy_slots_;
  }
  s.state = to;
}

int TcpConnection::on_readable() {
  if (closing_) return 0;
  if (rbuf_.size() - rlen_ < 4096) rbuf_.resize(rbuf_.size() * 2);
  ssize_t n = ::recv(fd_, rbuf_.data() + rlen_, rbuf_.size() - rlen_, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
  if (n <= 0) {
    close(n == 0 ? "host closed the connection" : "receive error");
    return 1;
  }
  rlen_ += static_cast<size_t>(n);
  size_t pos = 0;
  int pdus = 0;
  // A host that has proved nothing gets no large buffer: before its ICReq only an
  // ICReq fits, before its Connect only a capsule with the Connect's 1 KiB of data.
  const uint32_t max_pdu = !ready_ ? sizeof(IcReq)
                           : ctrl_ == nullptr
                               ? static_cast<uint32_t>(sizeof(CapsuleCmd)) + 1024 + 2 * 4
                               : std::max(opts_->max_h2c_data, opts_->in_capsule_data_size) + 256;
  while (!closing_ && rlen_ - pos >= sizeof(CommonHeader)) {
    CommonHeader ch;
    std::memcpy(&ch, rbuf_.data() + pos, sizeof ch);
    if (ch.plen < sizeof ch || ch.plen > max_pdu || ch.hlen < sizeof ch || ch.hlen > ch.plen) {
      fatal(kFesInvalidHeader, ch.plen > max_pdu || ch.plen < sizeof ch ? 4 : 2, rbuf_.data() + pos,
            sizeof ch);
      break;
    }
    if (rlen_ - pos < ch.plen) {
      if (rbuf_.size() < ch.plen + 1024) rbuf_.resize(ch.plen + 1024);
      break;
    }
    ++t_->counters().pdus_in;
    ++pdus;
    if (!handle_pdu(rbuf_.data() + pos, ch.plen)) break;
    pos += ch.plen;
  }
  if (pos > 0) {
    std::memmove(rbuf_.data(), rbuf_.data() + pos, rlen_ - pos);
    rlen_ -= pos;
  }
  // The deadline runs from when the PDU now first in the buffer began to arrive.
  if (rlen_ == 0)
    partial_since_ms_ = 0;
  else if (pos > 0 || partial_since_ms_ == 0)
    partial_since_ms_ = monotonic_ms();
  return pdus + 1;
}

// Validates the generic layout of a PDU (header length, digests, data offset)
// and dispatches it. False: the connection is being terminated.
bool TcpConnection::handle_pdu(const uint8_t* p, uint32_t plen) {
  CommonHeader ch;
  std::memcpy(&ch, p, sizeof ch);
  if (!ready_) {
    if (ch.type != kIcReq) {
      fatal(kFesPduSequence, 0, p, ch.hlen);
      return false;
    }
    return on_icreq(p, plen);
  }
  uint32_t want_hlen;
  switch (ch.type) {
    case kCapsuleCmd:
      want_hlen = sizeof(CapsuleCmd);
      break;
    case kH2CData:
      want_hlen = sizeof(DataHeader);
      break;
    case kH2CTermReq:
      close("host sent a termination request");
      return false;
    case kIcReq:
      fatal(kFesPduSequence, 0, p, ch.hlen);
      return false;
    default:
      fatal(kFesInvalidHeader, 0, p, ch.hlen);
      return false;
  }
  if (ch.hlen != want_hlen) {
    fatal(kFesInvalidHeader, 2, p, ch.hlen);
    return false;
  }
  bool has_hd = (ch.flags & kFlagHdgst) != 0, has_dd = (ch.flags & kFlagDdgst) != 0;
  if (has_hd != hdgst_) {
    fatal(kFesInvalidHeader, 1, p, ch.hlen);
    return false;
  }
  uint32_t hd = hdgst_ ? kDigestLen : 0;
  if (ch.hlen + hd > plen) {
    fatal(kFesInvalidHeader, 4, p, ch.hlen);
    return false;
  }
  if (hdgst_) {
    uint32_t got;
    std::memcpy(&got, p + ch.hlen, 4);
    if (got != crc32c(p, ch.hlen)) {
      fatal(kFesHeaderDigest, 0, p, ch.hlen);
      return false;
    }
  }
  const uint8_t* data = nullptr;
  uint32_t dlen = 0;
  if (plen > ch.hlen + hd) {
    if (has_dd != ddgst_ || ch.pdo < ch.hlen + hd || ch.pdo > plen || ch.pdo % 4 != 0) {
      fatal(kFesInvalidHeader, has_dd != ddgst_ ? 1 : 3, p, ch.hlen);
      return false;
    }
    uint32_t dd = ddgst_ ? kDigestLen : 0;
    if (plen - ch.pdo < dd) {
      fatal(kFesInvalidHeader, 4, p, ch.hlen);
      return false;
    }
    data = p + ch.pdo;
    dlen = plen - ch.pdo - dd;
  } else if (has_dd) {
    fatal(kFesInvalidHeader, 1, p, ch.hlen);
    return false;
  }
  bool data_digest_ok = true;
  if (data != nullptr && ddgst_) {
    uint32_t got;
    std::memcpy(&got, data + dlen, 4);
    data_digest_ok = got == crc32c(data, dlen);
  }
  if (ch.type == kCapsuleCmd) {
    if (!data_digest_ok) {  // the command is answered, the connection survives
      Sqe sqe;
      std::memcpy(&sqe, p + sizeof ch, sizeof sqe);
      send_resp(sqe.cid, kTransientTransportError, 0, 0);
      return true;
    }
    return on_capsule(p, plen, data, dlen);
  }
  if (!data_digest_ok) {
    DataHeader h;
    std::memcpy(&h, p, sizeof h);
    if (h.ttag < slots_.size() && slots_[h.ttag].state != SlotState::kFree)
      slots_[h.ttag].digest_error = true;
  }
  return on_h2c_data(p, data, dlen);
}

bool TcpConnection::on_icreq(const uint8_t* p, uint32_t plen) {
  IcReq req;
  if (plen != sizeof req) {
    fatal(kFesInvalidHeader, 4, p, std::min<uint32_t>(plen, 128));
    return false;
  }
  std::memcpy(&req, p, sizeof req);
  if (req.ch.hlen != sizeof req) {
    fatal(kFesInvalidHeader, 2, p, 128);
    return false;
  }
  if (req.pfv != 0) {
    fatal(kFesUnsupportedParameter, 8, p, 128);
    return false;
  }
  if (req.hpda > 31) {
    fatal(kFesUnsupportedParameter, 10, p, 128);
    return false;
  }
  hpda_ = req.hpda;
  hdgst_ = (req.dgst & kDigestHeader) != 0;
  ddgst_ = (req.dgst & kDigestData) != 0;
  IcResp r{};
  r.ch = CommonHeader{kIcResp, 0, sizeof r, 0, sizeof r};
  r.pfv = 0;
  r.cpda = 0;
  r.dgst = req.dgst & (kDigestHeader | kDigestData);
  r.maxh2cdata = opts_->max_h2c_data;
  std::memcpy(out(sizeof r), &r, sizeof r);
  ++t_->counters().pdus_out;
  ready_ = true;
  ready_ms_ = monotonic_ms();
  return true;
}

bool TcpConnection::setup_queue(uint16_t depth) {
  depth_ = depth;
  slots_.assign(depth, Slot{});
  free_slots_.clear();
  for (uint32_t i = depth; i-- > 0;) free_slots_.push_back(static_cast<uint16_t>(i));
  uint32_t per = std::max(opts_->max_io_size, opts_->in_capsule_data_size);
  per = std::max<uint32_t>(per, 8192);  // admin in-capsule data and log pages
  data_area_len_ = size_t{per} * depth;
  void* m =
      mmap(nullptr, data_area_len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return false;
  data_area_ = static_cast<uint8_t*>(m);  // touched page by page as commands use it
  for (uint32_t i = 0; i < depth; ++i) slots_[i].buf = data_area_ + size_t{per} * i;
  return true;
}

void TcpConnection::send_r2t(uint16_t cid, uint16_t ttag, uint32_t len) {
  R2THeader h{};
  h.cccid = cid;
  h.ttag = ttag;
  h.r2to = 0;
  h.r2tl = len;
  put_header(kR2T, hdgst_ ? kFlagHdgst : 0, sizeof h, 0, sizeof h + (hdgst_ ? kDigestLen : 0),
             reinterpret_cast<const uint8_t*>(&h) + sizeof(CommonHeader),
             sizeof h - sizeof(CommonHeader));
}

void TcpConnection::send_c2h(uint16_t cid, uint16_t slot, uint32_t len, bool success) {
  const uint8_t* data = slots_[slot].buf;
  uint32_t hd = hdgst_ ? kDigestLen : 0;
  uint32_t align = (hpda_ + 1) * 4;
  uint32_t pdo = (sizeof(DataHeader) + hd + align - 1) / align * align;
  uint32_t plen = pdo + len + (ddgst_ ? kDigestLen : 0);
  DataHeader h{};
  h.cccid = cid;
  h.ttag = 0;
  h.datao = 0;
  h.datal = len;
  uint8_t flags = kFlagLastPdu | (success ? kFlagSuccess : 0) | (hdgst_ ? kFlagHdgst : 0) |
                  (ddgst_ ? kFlagDdgst : 0);
  put_header(kC2HData, flags, sizeof h, static_cast<uint8_t>(pdo), plen,
             reinterpret_cast<const uint8_t*>(&h) + sizeof(CommonHeader),
             sizeof h - sizeof(CommonHeader));
  uint32_t pad = pdo - sizeof(DataHeader) - hd;
  if (pad > 0) std::memset(out(pad), 0, pad);
  out_slot_data(slot, data, len);
  if (ddgst_) {
    uint32_t d = crc32c(data, len);
    std::memcpy(out(4), &d, 4);
  }
}

bool TcpConnection::on_h2c_data(const uint8_t* p, const uint8_t* data, uint32_t dlen) {
  DataHeader h;
  std::memcpy(&h, p, sizeof h);
  if (h.ttag >= slots_.size() || slots_[h.ttag].state != SlotState::kAwaitingData ||
      slots_[h.ttag].r->cmd.cid != h.cccid) {
    fatal(kFesPduSequence, 10, p, sizeof h);  // no R2T outstanding for this tag
    return false;
  }
  Slot& s = slots_[h.ttag];
  if (h.datal != dlen || h.datal > opts_->max_h2c_data) {
    fatal(h.datal > opts_->max_h2c_data ? kFesDataLimitExceeded : kFesInvalidHeader, 16, p,
          sizeof h);
    return false;
  }
  if (h.datao != s.received || h.datal > s.len - s.received) {
    fatal(kFesDataOutOfRange, h.datao != s.received ? 12 : 16, p, sizeof h);
    return false;
  }
  std::memcpy(s.buf + h.datao, data, dlen);
  s.received += dlen;
  if (s.received < s.len) return true;
  if (!(h.ch.flags & kFlagLastPdu)) {
    fatal(kFesInvalidHeader, 1, p, sizeof h);  // all data arrived but not marked last
    return false;
  }
  set_slot(h.ttag, SlotState::kExecuting);
  if (s.digest_error) {
    req_complete(s.r, kTransientTransportError);
    return true;
  }
  ctrl_->execute(s.r);
  return true;
}

void TcpConnection::req_complete(ControllerCore::Request* r, uint16_t status) {
  const uint16_t slot = static_cast<uint16_t>(r->tag);
  Slot& s = slots_[slot];
  uint16_t cid = r->cmd.cid;
  uint32_t dw0 = r->dw0, dw1 = r->dw1;
  if (!closing_) {
    bool data_out = status == kSuccess && s.to_host && s.len > 0;
    bool success_flag = data_out && opts_->c2h_success && !sq_flow_control_;
    if (data_out) send_c2h(cid, slot, s.len, success_flag);
    if (!success_flag) send_resp(cid, status, dw0, dw1);
  }
  req_drop(r);
}

void TcpConnection::req_drop(ControllerCore::Request* r) {
  const uint16_t slot = static_cast<uint16_t>(r->tag);
  ctrl_->release(r);
  slots_[slot].r = nullptr;
  // Data queued for the socket frees the slot once sent (flush, discard_output).
  if (slots_[slot].state != SlotState::kSendingData) set_slot(slot, SlotState::kFree);
}

}  // namespace dpukv::nvme
