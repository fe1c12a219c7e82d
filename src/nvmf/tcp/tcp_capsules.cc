// A queue pair's capsules (tcp_connection.h): the fabrics Connect that binds it
// to a controller, and the NVMe commands it carries with their in-capsule data,
// R2Ts and the responses sent back.
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

namespace {
// A fixed-width, NUL-padded field of the Connect data (NQNs) as a string.
std::string fixed_string(const char* p, size_t n) {
  return std::string(p, strnlen(p, n));
}
}  // namespace

void TcpConnection::send_resp(uint16_t cid, uint16_t status, uint32_t dw0, uint32_t dw1) {
  Cqe c{};
  c.dw0 = dw0;
  c.dw1 = dw1;
  c.sq_head = sq_flow_control_ ? sqhd_ : 0;
  c.sq_id = qid_;
  c.cid = cid;
  c.status = cqe_status(status, false);
  put_header(kCapsuleResp, hdgst_ ? kFlagHdgst : 0, sizeof(CapsuleResp), 0,
             sizeof(CapsuleResp) + (hdgst_ ? kDigestLen : 0), &c, sizeof c);
  if (status != kSuccess) ++t_->counters().errors;
}

void TcpConnection::on_connect(const Sqe& sqe, const uint8_t* data, uint32_t dlen) {
  const ConnectCommand cmd = connect_command(sqe);
  const uint16_t qid = cmd.qid, sqsize = cmd.sqsize;
  constexpr auto kQidField = static_cast<uint32_t>(offsetof(ConnectCommand, qid));
  constexpr auto kSqsizeField = static_cast<uint32_t>(offsetof(ConnectCommand, sqsize));
  // Invalid-parameter answers name the field: bits 15:0 its byte offset, bit 16
  // set when it is in the connect data rather than the command.
  auto reject = [&](uint16_t status, uint32_t dw0) {
    ++t_->counters().connect_rejects;
    send_resp(sqe.cid, status, dw0, 0);
  };
  if (cmd.recfmt != 0) return reject(kConnectIncompatibleFormat, 0);
  const SglDescriptor& sgl = cmd.sgl1;
  if (data == nullptr || dlen < sizeof(ConnectData) || sgl.type != kSglDataBlockOffset ||
      sgl.length != sizeof(ConnectData))
    return reject(kConnectInvalidParameters, 24);
  ConnectData cd;
  std::memcpy(&cd, data, sizeof cd);
  std::string subnqn = fixed_string(cd.subnqn, sizeof cd.subnqn);
  std::string hostnqn = fixed_string(cd.hostnqn, sizeof cd.hostnqn);
  Subsystem* s = t_->connect_target(subnqn);
  if (s == nullptr || (!s->discovery && std::find(s->listeners.begin(), s->listeners.end(),
                                                  listener_) == s->listeners.end()))
    return reject(kConnectInvalidParameters, (1u << 16) | 256);
  if (s->discovery && qid != 0) return reject(kConnectInvalidParameters, kQidField);
  if (!s->host_allowed(hostnqn)) {
    LOG_WARN_LIMITED("nvme-tcp: host %s is not allowed on %s", hostnqn.c_str(), subnqn.c_str());
    return reject(kConnectInvalidHost, 0);
  }
  uint32_t max_depth = qid == 0 ? 128u : opts_->max_queue_depth;
  if (sqsize == 0 || sqsize + 1u > max_depth || (qid == 0 && sqsize < 31))
    return reject(kConnectInvalidParameters, kSqsizeField);
  sq_flow_control_ = !(cmd.cattr & kCattrDisableSqFlowControl);
  if (qid == 0) {
    if (cd.cntlid != kCntlidDynamic) return reject(kConnectInvalidParameters, (1u << 16) | 16);
    ControllerConfig cc;
    cc.fabrics = true;
    cc.discovery = s->discovery;
    cc.serial = s->cfg.serial;
    cc.model = s->cfg.model;
    cc.subnqn = s->cfg.nqn;
    cc.cntlid = s->next_cntlid;
    cc.max_io_queues = opts_->max_io_queues;
    cc.mqes = static_cast<uint16_t>(opts_->max_queue_depth - 1);
    cc.mdts =
        static_cast<uint8_t>(std::countr_zero(std::max<uint32_t>(opts_->max_io_size, 4096) / 4096));
    cc.in_capsule_bytes = opts_->in_capsule_data_size;
    s->next_cntlid = s->next_cntlid >= 0xffef ? 1 : static_cast<uint16_t>(s->next_cntlid + 1);
    uint32_t pool = 128u + uint32_t{opts_->max_io_queues} * opts_->max_queue_depth;
    if (s->discovery) pool = 128;  // the admin queue only
    auto c = std::make_unique<FabricsController>(cc, s->ns, pool, s, hostnqn);
    c->target = t_;
    c->set_connect_kato(cmd.kato);
    c->queues.assign(s->discovery ? 1u : opts_->max_io_queues + 1u, nullptr);
    if (!setup_queue(static_cast<uint16_t>(sqsize + 1))) return reject(kConnectControllerBusy, 0);
    ctrl_ = c.get();
    c->queues[0] = this;
    s->controllers.push_back(std::move(c));
    qid_ = 0;
    LOG_INFO("nvme-tcp: host %s connected to %s as controller %u", hostnqn.c_str(), subnqn.c_str(),
             cc.cntlid);
    return send_resp(sqe.cid, kSuccess, cc.cntlid, 0);
  }
  FabricsController* c = nullptr;
  for (auto& x : s->controllers)
    if (x->config().cntlid == cd.cntlid) c = x.get();
  if (c == nullptr || c->hostnqn != hostnqn)
    return reject(kConnectInvalidParameters, (1u << 16) | 16);
  if (!c->ready()) return reject(kCommandSequenceError, 0);  // enable the controller first
  if (qid > std::min(c->allocated_sqs(), c->allocated_cqs()) || c->queues[qid] != nullptr)
    return reject(kConnectInvalidParameters, kQidField);
  if (!setup_queue(static_cast<uint16_t>(sqsize + 1))) return reject(kConnectControllerBusy, 0);
  ctrl_ = c;
  qid_ = qid;
  c->queues[qid] = this;
  send_resp(sqe.cid, kSuccess, c->config().cntlid, 0);
}

bool TcpConnection::on_capsule(const uint8_t* p, uint32_t plen, const uint8_t* data,
                               uint32_t dlen) {
  (void)plen;
  Sqe sqe;
  std::memcpy(&sqe, p + sizeof(CommonHeader), sizeof sqe);
  ++t_->counters().commands;
  if (sq_flow_control_ && depth_ > 0) sqhd_ = static_cast<uint16_t>((sqhd_ + 1) % depth_);
  bool fabrics = sqe.opc == kFabricsOpcode;
  const uint8_t fctype = fabrics_type(sqe);
  if (ctrl_ == nullptr) {
    if (fabrics && fctype == kConnect) {
      on_connect(sqe, data, dlen);
    } else {
      send_resp(sqe.cid, kCommandSequenceError, 0, 0);
    }
    return true;
  }
  if (fabrics && fctype == kConnect) {
    send_resp(sqe.cid, kCommandSequenceError, 0, 0);
    return true;
  }
  // Traffic-based keep alive (TBKAS in Identify): a command on any queue shows
  // the host is there, as a Keep Alive does.
  ctrl_->last_activity_ms = monotonic_ms();
  if (free_slots_.empty()) {
    fatal(kFesPduSequence, 0, p, sizeof(CapsuleCmd));  // the host overran its queue
    return false;
  }
  ControllerCore::Request* r = ctrl_->alloc_request();
  if (r == nullptr) {
    send_resp(sqe.cid, kInternalError, 0, 0);
    return true;
  }
  uint16_t slot = free_slots_.back();
  free_slots_.pop_back();
  set_slot(slot, SlotState::kExecuting);
  Slot& s = slots_[slot];
  s.r = r;
  s.received = 0;
  s.digest_error = false;
  r->cmd = sqe;
  r->qid = qid_;
  r->queue = this;
  r->tag = slot;
  uint64_t len = 0;
  bool to_host = false;
  uint16_t st = kSuccess;
  if (fabrics) {
    if (qid_ != 0) st = kInvalidOpcode;
  } else {
    st = ctrl_->data_length(sqe, qid_ == 0, &len, &to_host);
  }
  s.len = static_cast<uint32_t>(len);
  s.to_host = to_host;
  s.iov = iovec{s.buf, static_cast<size_t>(len)};
  r->iov = &s.iov;
  r->iovcnt = len > 0 ? 1 : 0;
  if (st == kSuccess && len > 0) {
    const SglDescriptor sgl = sgl1(sqe);
    uint32_t icd_limit = qid_ == 0 ? 8192u : opts_->in_capsule_data_size;
    if (((sqe.flags >> 6) & 3) != 1) {
      st = kInvalidField;
    } else if (sgl.length < len) {
      st = kSglLengthInvalid;
    } else if (sgl.type == kSglDataBlockOffset) {
      if (to_host || sgl.address != 0)
        st = kInvalidField;
      else if (dlen != sgl.length || dlen > icd_limit)
        st = kSglLengthInvalid;
      else
        std::memcpy(s.buf, data, len);
    } else if (sgl.type == kSglTransportDataBlock) {
      if (!to_host) {
        set_slot(slot, SlotState::kAwaitingData);
        send_r2t(sqe.cid, slot, static_cast<uint32_t>(len));
        return true;
      }
    } else {
      st = kSglTypeInvalid;
    }
  }
  if (st != kSuccess) {
    req_complete(r, st);
    return true;
  }
  ctrl_->execute(r);
  return true;
}

}  // namespace dpukv::nvme
