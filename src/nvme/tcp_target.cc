// NvmfTarget: subsystems and the NVMe/TCP transport (connections, PDUs, Fabrics
// commands, controllers per host association).
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

#include "nvme/nvmf_target.h"
#include "nvme/tcp_wire.h"
#include "runtime/call_queue.h"
#include "runtime/clock.h"
#include "runtime/crc32c.h"
#include "runtime/log.h"

namespace dpukv::nvme {
namespace {

using namespace tcp;

std::string fixed_string(const char* p, size_t n) {
  return std::string(p, strnlen(p, n));
}

struct Subsystem;
class Connection;
class Impl_;

// A controller created by a host's admin-queue Connect (dynamic controller model).
class FabricsController final : public ControllerCore {
 public:
  FabricsController(const ControllerConfig& c, std::shared_ptr<NamespaceSet> ns, uint32_t pool,
                    Subsystem* s, std::string host)
      : ControllerCore(c, std::move(ns), pool), subsys(s), hostnqn(std::move(host)) {}
  ~FabricsController() override { drain_inflight(); }

  Subsystem* subsys;
  std::string hostnqn;
  std::vector<Connection*> queues;  // [qid]; admin at 0
  uint64_t last_activity_ms = monotonic_ms();
  uint32_t kato_ms = 0;

  void set_kato(uint32_t ms) { kato_ms = ms; }

 private:
  void complete(Request* r, uint16_t status) override;
  uint16_t admin_transport(Request* r) override;
  void on_disable() override;
};

struct Subsystem {
  SubsystemConfig cfg;
  std::shared_ptr<NamespaceSet> ns = std::make_shared<NamespaceSet>();
  std::vector<std::string> listeners;
  uint16_t next_cntlid = 1;
  std::vector<std::unique_ptr<FabricsController>> controllers;
  bool host_allowed(const std::string& h) const {
    return cfg.allow_any_host ||
           std::find(cfg.hosts.begin(), cfg.hosts.end(), h) != cfg.hosts.end();
  }
};

struct Listener {
  std::string key;  // "tcp:ADDR:PORT"
  int fd = -1;
  uint16_t port = 0;
};

}  // namespace

struct NvmfTarget::Impl {
  TcpTransportOptions opts;
  int epfd = -1, wake_fd = -1;
  std::thread thread;
  std::atomic<bool> stop{false};
  CallQueue calls;

  std::map<std::string, std::unique_ptr<Subsystem>> subsystems;
  std::vector<std::unique_ptr<Listener>> listeners;
  std::vector<std::unique_ptr<Connection>> conns;
  TargetStats stats;
  EmulationManager* emu = nullptr;

  void run();
  void accept_on(Listener* l);
  void close_controller(FabricsController* c, const char* why);
  void reap_closed();
  Subsystem* find_subsystem(const std::string& nqn) {
    auto it = subsystems.find(nqn);
    return it == subsystems.end() ? nullptr : it->second.get();
  }
};

namespace {

// One NVMe/TCP connection = one queue pair of one controller.
class Connection {
 public:
  Connection(NvmfTarget::Impl* t, int fd, std::string listener)
      : t_(t), fd_(fd), listener_(std::move(listener)) {
    rbuf_.resize(64 * 1024 + 1024);
  }
  ~Connection() {
    if (fd_ >= 0) ::close(fd_);
    if (data_area_ != nullptr) munmap(data_area_, data_area_len_);
  }

  int fd() const { return fd_; }
  bool closed() const { return closing_; }
  bool idle() const { return busy_slots_ == 0; }
  FabricsController* controller() const { return ctrl_; }
  uint16_t qid() const { return qid_; }

  // Reads what the socket has and handles every whole PDU in it. Returns work done.
  int on_readable();
  // Sends pending output; returns false if the connection broke.
  bool flush();
  bool has_output() const { return opos_ < obuf_.size(); }
  void close(const char* why);
  void complete(ControllerCore::Request* r, uint16_t status);

 private:
  struct Slot {
    ControllerCore::Request* r = nullptr;
    uint8_t* buf = nullptr;
    uint32_t len = 0, received = 0;
    bool to_host = false, waiting_h2c = false, digest_error = false, busy = false;
    iovec iov{};
  };

  bool handle_pdu(const uint8_t* p, uint32_t plen);
  bool on_icreq(const uint8_t* p, uint32_t plen);
  bool on_capsule(const uint8_t* p, uint32_t plen, const uint8_t* data, uint32_t dlen);
  bool on_h2c_data(const uint8_t* p, const uint8_t* data, uint32_t dlen);
  void on_connect(const Sqe& sqe, const uint8_t* data, uint32_t dlen);
  bool setup_queue(uint16_t depth);
  void send_resp(uint16_t cid, uint16_t status, uint32_t dw0, uint32_t dw1);
  void send_r2t(uint16_t cid, uint16_t ttag, uint32_t len);
  void send_c2h(uint16_t cid, const uint8_t* data, uint32_t len, bool success);
  void fatal(uint16_t fes, uint32_t fei, const uint8_t* hdr, uint32_t hlen);
  uint8_t* out(size_t n) {
    size_t at = obuf_.size();
    obuf_.resize(at + n);
    return obuf_.data() + at;
  }
  void put_header(uint8_t type, uint8_t flags, uint8_t hlen, uint8_t pdo, uint32_t plen,
                  const void* rest, size_t rest_len);

  NvmfTarget::Impl* t_;
  int fd_;
  std::string listener_;
  bool closing_ = false;
  bool ready_ = false;  // ICReq done
  bool hdgst_ = false, ddgst_ = false;
  uint32_t hpda_ = 0;
  FabricsController* ctrl_ = nullptr;
  uint16_t qid_ = 0;
  bool sq_flow_control_ = true;
  uint16_t sqhd_ = 0;
  uint32_t depth_ = 0;

  std::vector<uint8_t> rbuf_;
  size_t rlen_ = 0;
  std::vector<uint8_t> obuf_;
  size_t opos_ = 0;

  std::vector<Slot> slots_;
  std::vector<uint16_t> free_slots_;
  uint32_t busy_slots_ = 0;
  uint8_t* data_area_ = nullptr;
  size_t data_area_len_ = 0;
};

void Connection::close(const char* why) {
  if (closing_) return;
  closing_ = true;
  LOG_INFO("nvme-tcp: connection %d (qid %u) closed: %s", fd_, qid_, why);
  ::shutdown(fd_, SHUT_RDWR);
  // Commands waiting for data will never get it; those on a block device finish
  // and are dropped in complete().
  for (uint16_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.busy && s.waiting_h2c) {
      ctrl_->release(s.r);
      s = Slot{s.r, s.buf};
      s.r = nullptr;
      --busy_slots_;
    }
  }
}

void Connection::put_header(uint8_t type, uint8_t flags, uint8_t hlen, uint8_t pdo, uint32_t plen,
                            const void* rest, size_t rest_len) {
  uint8_t* h = out(hlen);
  CommonHeader ch{type, flags, hlen, pdo, plen};
  std::memcpy(h, &ch, sizeof ch);
  std::memcpy(h + sizeof ch, rest, rest_len);
  if (hdgst_ && type != kIcResp && type != kC2HTermReq) {
    uint32_t d = crc32c(obuf_.data() + obuf_.size() - hlen, hlen);
    std::memcpy(out(4), &d, 4);
  }
  ++t_->stats.pdus_out;
}

void Connection::fatal(uint16_t fes, uint32_t fei, const uint8_t* hdr, uint32_t hlen) {
  // C2HTermReq carries the offending header (up to 128 bytes); no digests.
  uint32_t copy = std::min<uint32_t>(hlen, 128);
  TermReq tr{};
  tr.ch = CommonHeader{kC2HTermReq, 0, sizeof(TermReq), 0,
                       static_cast<uint32_t>(sizeof(TermReq) + copy)};
  tr.fes = fes;
  tr.fei = fei;
  std::memcpy(out(sizeof tr), &tr, sizeof tr);
  if (copy > 0) std::memcpy(out(copy), hdr, copy);
  ++t_->stats.term_reqs_sent;
  ++t_->stats.pdus_out;
  LOG_WARN("nvme-tcp: connection %d: fatal transport error %u (field %u); terminating", fd_, fes,
           fei);
  flush();
  close("fatal transport error");
}

bool Connection::flush() {
  while (opos_ < obuf_.size()) {
    ssize_t n =
        ::send(fd_, obuf_.data() + opos_, obuf_.size() - opos_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
      obuf_.clear();
      opos_ = 0;
      close("send failed");
      return false;
    }
    opos_ += static_cast<size_t>(n);
  }
  obuf_.clear();
  opos_ = 0;
  return true;
}

int Connection::on_readable() {
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
  const uint32_t max_pdu = std::max(t_->opts.max_h2c_data, t_->opts.in_capsule_data_size) + 256;
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
    ++t_->stats.pdus_in;
    ++pdus;
    if (!handle_pdu(rbuf_.data() + pos, ch.plen)) break;
    pos += ch.plen;
  }
  if (pos > 0) {
    std::memmove(rbuf_.data(), rbuf_.data() + pos, rlen_ - pos);
    rlen_ -= pos;
  }
  return pdus + 1;
}

// Validates the generic layout of a PDU (header length, digests, data offset)
// and dispatches it. False: the connection is being terminated.
bool Connection::handle_pdu(const uint8_t* p, uint32_t plen) {
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
    if (h.ttag < slots_.size() && slots_[h.ttag].busy) slots_[h.ttag].digest_error = true;
  }
  return on_h2c_data(p, data, dlen);
}

bool Connection::on_icreq(const uint8_t* p, uint32_t plen) {
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
  r.maxh2cdata = t_->opts.max_h2c_data;
  std::memcpy(out(sizeof r), &r, sizeof r);
  ++t_->stats.pdus_out;
  ready_ = true;
  return true;
}

bool Connection::setup_queue(uint16_t depth) {
  depth_ = depth;
  slots_.assign(depth, Slot{});
  free_slots_.clear();
  for (uint32_t i = depth; i-- > 0;) free_slots_.push_back(static_cast<uint16_t>(i));
  uint32_t per = std::max(t_->opts.max_io_size, t_->opts.in_capsule_data_size);
  per = std::max<uint32_t>(per, 8192);  // admin in-capsule data and log pages
  data_area_len_ = size_t{per} * depth;
  void* m =
      mmap(nullptr, data_area_len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return false;
  data_area_ = static_cast<uint8_t*>(m);  // touched page by page as commands use it
  for (uint32_t i = 0; i < depth; ++i) slots_[i].buf = data_area_ + size_t{per} * i;
  return true;
}

void Connection::send_resp(uint16_t cid, uint16_t status, uint32_t dw0, uint32_t dw1) {
  Cqe c{};
  c.dw0 = dw0;
  c.dw1 = dw1;
  c.sq_head = sq_flow_control_ ? sqhd_ : 0;
  c.sq_id = qid_;
  c.cid = cid;
  c.status = cqe_status(status, false);
  put_header(kCapsuleResp, hdgst_ ? kFlagHdgst : 0, sizeof(CapsuleResp), 0,
             sizeof(CapsuleResp) + (hdgst_ ? kDigestLen : 0), &c, sizeof c);
  if (status != kSuccess) ++t_->stats.errors;
}

void Connection::send_r2t(uint16_t cid, uint16_t ttag, uint32_t len) {
  R2THeader h{};
  h.cccid = cid;
  h.ttag = ttag;
  h.r2to = 0;
  h.r2tl = len;
  put_header(kR2T, hdgst_ ? kFlagHdgst : 0, sizeof h, 0, sizeof h + (hdgst_ ? kDigestLen : 0),
             reinterpret_cast<const uint8_t*>(&h) + sizeof(CommonHeader),
             sizeof h - sizeof(CommonHeader));
}

void Connection::send_c2h(uint16_t cid, const uint8_t* data, uint32_t len, bool success) {
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
  std::memcpy(out(len), data, len);
  if (ddgst_) {
    uint32_t d = crc32c(data, len);
    std::memcpy(out(4), &d, 4);
  }
}

void Connection::on_connect(const Sqe& sqe, const uint8_t* data, uint32_t dlen) {
  const auto* raw = reinterpret_cast<const uint8_t*>(&sqe);
  uint16_t recfmt, qid, sqsize;
  uint32_t kato;
  std::memcpy(&recfmt, raw + kConnectRecfmt, 2);
  std::memcpy(&qid, raw + kConnectQid, 2);
  std::memcpy(&sqsize, raw + kConnectSqsize, 2);
  std::memcpy(&kato, raw + kConnectKato, 4);
  uint8_t cattr = raw[kConnectCattr];
  // Invalid-parameter answers name the field: bits 15:0 its byte offset, bit 16
  // set when it is in the connect data rather than the command.
  auto reject = [&](uint16_t status, uint32_t dw0) {
    ++t_->stats.connect_rejects;
    send_resp(sqe.cid, status, dw0, 0);
  };
  if (recfmt != 0) return reject(kConnectIncompatibleFormat, 0);
  SglDescriptor sgl;
  std::memcpy(&sgl, raw + 24, sizeof sgl);
  if (data == nullptr || dlen < sizeof(ConnectData) || sgl.type != kSglDataBlockOffset ||
      sgl.length != sizeof(ConnectData))
    return reject(kConnectInvalidParameters, 24);
  ConnectData cd;
  std::memcpy(&cd, data, sizeof cd);
  std::string subnqn = fixed_string(cd.subnqn, sizeof cd.subnqn);
  std::string hostnqn = fixed_string(cd.hostnqn, sizeof cd.hostnqn);
  Subsystem* s = t_->find_subsystem(subnqn);
  if (s == nullptr ||
      std::find(s->listeners.begin(), s->listeners.end(), listener_) == s->listeners.end())
    return reject(kConnectInvalidParameters, (1u << 16) | 256);
  if (!s->host_allowed(hostnqn)) {
    LOG_WARN("nvme-tcp: host %s is not allowed on %s", hostnqn.c_str(), subnqn.c_str());
    return reject(kConnectInvalidHost, 0);
  }
  uint32_t max_depth = qid == 0 ? 128u : t_->opts.max_queue_depth;
  if (sqsize == 0 || sqsize + 1u > max_depth || (qid == 0 && sqsize < 31))
    return reject(kConnectInvalidParameters, kConnectSqsize);
  sq_flow_control_ = !(cattr & kCattrDisableSqFlowControl);
  if (qid == 0) {
    if (cd.cntlid != kCntlidDynamic) return reject(kConnectInvalidParameters, (1u << 16) | 16);
    ControllerConfig cc;
    cc.fabrics = true;
    cc.serial = s->cfg.serial;
    cc.model = s->cfg.model;
    cc.subnqn = s->cfg.nqn;
    cc.cntlid = s->next_cntlid;
    cc.max_io_queues = t_->opts.max_io_queues;
    cc.mqes = static_cast<uint16_t>(t_->opts.max_queue_depth - 1);
    cc.mdts = static_cast<uint8_t>(
        std::countr_zero(std::max<uint32_t>(t_->opts.max_io_size, 4096) / 4096));
    cc.in_capsule_bytes = t_->opts.in_capsule_data_size;
    s->next_cntlid = s->next_cntlid >= 0xffef ? 1 : static_cast<uint16_t>(s->next_cntlid + 1);
    uint32_t pool = 128u + uint32_t{t_->opts.max_io_queues} * t_->opts.max_queue_depth;
    auto c = std::make_unique<FabricsController>(cc, s->ns, pool, s, hostnqn);
    c->set_kato(kato);
    c->queues.assign(t_->opts.max_io_queues + 1u, nullptr);
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
  if (qid > c->allocated_queues() || c->queues[qid] != nullptr)
    return reject(kConnectInvalidParameters, kConnectQid);
  if (!setup_queue(static_cast<uint16_t>(sqsize + 1))) return reject(kConnectControllerBusy, 0);
  ctrl_ = c;
  qid_ = qid;
  c->queues[qid] = this;
  send_resp(sqe.cid, kSuccess, c->config().cntlid, 0);
}

bool Connection::on_capsule(const uint8_t* p, uint32_t plen, const uint8_t* data, uint32_t dlen) {
  (void)plen;
  Sqe sqe;
  std::memcpy(&sqe, p + sizeof(CommonHeader), sizeof sqe);
  ++t_->stats.commands;
  if (sq_flow_control_ && depth_ > 0) sqhd_ = static_cast<uint16_t>((sqhd_ + 1) % depth_);
  bool fabrics = sqe.opc == kFabricsOpcode;
  uint8_t fctype = reinterpret_cast<const uint8_t*>(&sqe)[4];
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
  if (qid_ == 0) ctrl_->last_activity_ms = monotonic_ms();
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
  ++busy_slots_;
  Slot& s = slots_[slot];
  s.r = r;
  s.busy = true;
  s.received = 0;
  s.waiting_h2c = false;
  s.digest_error = false;
  r->cmd = sqe;
  r->qid = qid_;
  r->transport = this;
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
    SglDescriptor sgl;
    std::memcpy(&sgl, reinterpret_cast<const uint8_t*>(&sqe) + 24, sizeof sgl);
    uint32_t icd_limit = qid_ == 0 ? 8192u : t_->opts.in_capsule_data_size;
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
        s.waiting_h2c = true;
        send_r2t(sqe.cid, slot, static_cast<uint32_t>(len));
        return true;
      }
    } else {
      st = kSglTypeInvalid;
    }
  }
  if (st != kSuccess) {
    complete(r, st);
    return true;
  }
  ctrl_->execute(r);
  return true;
}

bool Connection::on_h2c_data(const uint8_t* p, const uint8_t* data, uint32_t dlen) {
  DataHeader h;
  std::memcpy(&h, p, sizeof h);
  if (h.ttag >= slots_.size() || !slots_[h.ttag].busy || !slots_[h.ttag].waiting_h2c ||
      slots_[h.ttag].r->cmd.cid != h.cccid) {
    fatal(kFesPduSequence, 10, p, sizeof h);  // no R2T outstanding for this tag
    return false;
  }
  Slot& s = slots_[h.ttag];
  if (h.datal != dlen || h.datal > t_->opts.max_h2c_data) {
    fatal(h.datal > t_->opts.max_h2c_data ? kFesDataLimitExceeded : kFesInvalidHeader, 16, p,
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
  s.waiting_h2c = false;
  if (s.digest_error) {
    complete(s.r, kTransientTransportError);
    return true;
  }
  ctrl_->execute(s.r);
  return true;
}

void Connection::complete(ControllerCore::Request* r, uint16_t status) {
  Slot& s = slots_[r->tag];
  uint16_t cid = r->cmd.cid;
  uint32_t dw0 = r->dw0, dw1 = r->dw1;
  if (!closing_) {
    bool data_out = status == kSuccess && s.to_host && s.len > 0;
    bool success_flag = data_out && t_->opts.c2h_success && !sq_flow_control_;
    if (data_out) send_c2h(cid, s.buf, s.len, success_flag);
    if (!success_flag) send_resp(cid, status, dw0, dw1);
  }
  ctrl_->release(r);
  s.r = nullptr;
  s.busy = false;
  s.waiting_h2c = false;
  free_slots_.push_back(static_cast<uint16_t>(r->tag));
  --busy_slots_;
}

void FabricsController::complete(Request* r, uint16_t status) {
  static_cast<Connection*>(r->transport)->complete(r, status);
}

// Property Get/Set: the registers over the admin queue.
uint16_t FabricsController::admin_transport(Request* r) {
  if (r->cmd.opc != kFabricsOpcode) return kInvalidOpcode;
  const auto* raw = reinterpret_cast<const uint8_t*>(&r->cmd);
  uint8_t fctype = raw[4], attrib = raw[40];
  uint32_t offset;
  std::memcpy(&offset, raw + 44, 4);
  uint32_t size = (attrib & 7) == 1 ? 8 : (attrib & 7) == 0 ? 4 : 0;
  bool wide = offset == kRegCap || offset == kRegAsq || offset == kRegAcq;
  if (size == 0 || offset >= kRegEnd || offset % 4 != 0 || (size == 8) != wide)
    return kInvalidField;
  if (fctype == kPropertyGet) {
    uint64_t v = read_reg(offset, size);
    r->dw0 = static_cast<uint32_t>(v);
    r->dw1 = static_cast<uint32_t>(v >> 32);
    return kSuccess;
  }
  if (fctype == kPropertySet) {
    if (offset != kRegCc && offset != kRegNssr) return kInvalidField;  // read-only over fabrics
    uint64_t v;
    std::memcpy(&v, raw + 48, 8);
    write_reg(offset, size, v);
    return kSuccess;
  }
  return kInvalidOpcode;
}

// A controller reset ends the association's I/O queues; the host reconnects them.
void FabricsController::on_disable() {
  for (size_t q = 1; q < queues.size(); ++q)
    if (queues[q] != nullptr) queues[q]->close("controller reset");
}

}  // namespace

// ---- the poll group ----------------------------------------------------------

void NvmfTarget::Impl::accept_on(Listener* l) {
  for (;;) {
    int fd = accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // A queue of 128 reads of 128 KiB answers 16 MiB at once; start with room for
    // a busy pass instead of waiting for autotuning.
    int sndbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    auto c = std::make_unique<Connection>(this, fd, l->key);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = c.get();
    epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
    conns.push_back(std::move(c));
    ++stats.connections;
  }
}

void NvmfTarget::Impl::close_controller(FabricsController* c, const char* why) {
  for (Connection* q : c->queues)
    if (q != nullptr) q->close(why);
}

// Connections that closed leave once their requests are back; a controller leaves
// with its admin queue.
void NvmfTarget::Impl::reap_closed() {
  for (auto& s : subsystems) {
    for (auto& c : s.second->controllers) {
      Connection* admin = c->queues.empty() ? nullptr : c->queues[0];
      if (admin != nullptr && admin->closed()) close_controller(c.get(), "admin queue closed");
    }
  }
  for (size_t i = 0; i < conns.size();) {
    Connection* c = conns[i].get();
    if (!c->closed()) {
      ++i;
      continue;
    }
    FabricsController* ctrl = c->controller();
    if (ctrl != nullptr) ctrl->poll_bdevs();
    if (!c->idle()) {
      ++i;
      continue;
    }
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd(), nullptr);
    if (ctrl != nullptr) {
      ctrl->queues[c->qid()] = nullptr;
      bool empty = std::all_of(ctrl->queues.begin(), ctrl->queues.end(),
                               [](Connection* q) { return q == nullptr; });
      if (empty) {
        Subsystem* s = ctrl->subsys;
        std::erase_if(s->controllers,
                      [&](const std::unique_ptr<FabricsController>& x) { return x.get() == ctrl; });
      }
    }
    conns.erase(conns.begin() + static_cast<long>(i));
  }
  stats.active_connections = conns.size();
}

void NvmfTarget::Impl::run() {
  if (opts.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(opts.cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  uint64_t last_work = monotonic_us(), last_ka_check = monotonic_ms();
  epoll_event evs[64];
  while (!stop.load(std::memory_order_relaxed)) {
    bool idle = monotonic_us() - last_work > 2000;
    int n = epoll_wait(epfd, evs, 64, idle ? 1 : 0);
    int work = 0;
    for (int i = 0; i < n; ++i) {
      void* ptr = evs[i].data.ptr;
      if (ptr == nullptr) {
        uint64_t v;
        (void)::read(wake_fd, &v, sizeof v);
        continue;
      }
      bool is_listener = false;
      for (auto& l : listeners)
        if (l.get() == ptr) {
          accept_on(l.get());
          is_listener = true;
          ++work;
        }
      if (!is_listener) work += static_cast<Connection*>(ptr)->on_readable();
    }
    for (auto& s : subsystems)
      for (auto& c : s.second->controllers) work += c->poll_bdevs();
    if (emu != nullptr) work += emu->poll_once();
    bool closed_any = false;
    for (auto& c : conns) {
      if (c->has_output()) {
        c->flush();
        ++work;  // a full socket buffer is work pending: do not fall asleep on it
      }
      closed_any |= c->closed();
    }
    if (closed_any) reap_closed();
    if (work > 0) last_work = monotonic_us();
    uint64_t ms = monotonic_ms();
    if (ms - last_ka_check >= 100) {
      last_ka_check = ms;
      for (auto& s : subsystems)
        for (auto& c : s.second->controllers)
          if (c->kato_ms > 0 && ms - c->last_activity_ms > c->kato_ms + opts.keep_alive_grace_ms) {
            LOG_WARN("nvme-tcp: controller %u of %s: keep alive timeout (%u ms)",
                     c->config().cntlid, s.first.c_str(), c->kato_ms);
            ++stats.keep_alive_expiries;
            c->last_activity_ms = ms;  // once
            close_controller(c.get(), "keep alive timeout");
          }
    }
    if (calls.run_pending()) last_work = monotonic_us();
  }
}

// ---- configuration ------------------------------------------------------------

namespace {
bool valid_tcp_options(const TcpTransportOptions& o) {
  return o.max_h2c_data >= 4096 && o.max_h2c_data % 4 == 0 && o.max_io_size >= 4096 &&
         (o.max_io_size & (o.max_io_size - 1)) == 0 && o.max_io_size <= (1u << 20) &&
         o.max_queue_depth >= 2 && o.max_queue_depth <= 1024 && o.max_io_queues >= 1 &&
         o.max_io_queues <= 64 && o.in_capsule_data_size <= 128 * 1024 &&
         o.in_capsule_data_size % 16 == 0;
}
}  // namespace

Status NvmfTarget::create(const TcpTransportOptions& o, std::unique_ptr<NvmfTarget>* out) {
  if (!valid_tcp_options(o)) return Code::kInvalidValue;
  std::unique_ptr<NvmfTarget> t(new NvmfTarget());
  t->opts_ = o;
  t->impl_ = std::make_unique<Impl>();
  Impl* m = t->impl_.get();
  m->opts = o;
  m->epfd = epoll_create1(EPOLL_CLOEXEC);
  m->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (m->epfd < 0 || m->wake_fd < 0) return Code::kDriver;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(m->epfd, EPOLL_CTL_ADD, m->wake_fd, &ev);
  m->calls.set_wake_fd(m->wake_fd);
  m->thread = std::thread([m] { m->run(); });
  *out = std::move(t);
  return Code::kSuccess;
}

NvmfTarget::~NvmfTarget() {
  if (!impl_) return;
  impl_->stop.store(true);
  uint64_t one = 1;
  (void)::write(impl_->wake_fd, &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& c : impl_->conns) c->close("target stopping");
  for (auto& s : impl_->subsystems)
    for (auto& c : s.second->controllers) c->drain_inflight();
  impl_->conns.clear();
  impl_->subsystems.clear();
  for (auto& l : impl_->listeners) ::close(l->fd);
  ::close(impl_->epfd);
  ::close(impl_->wake_fd);
}

Status NvmfTarget::call(std::function<Status()> fn) {
  return impl_->calls.call(std::move(fn));
}

namespace {
bool valid_nqn(const std::string& n) {
  return n.size() >= 5 && n.size() <= 223 && n.rfind("nqn.", 0) == 0 &&
         std::all_of(n.begin(), n.end(), [](char ch) { return ch > 0x20 && ch < 0x7f; });
}
}  // namespace

Status NvmfTarget::set_tcp_options(const TcpTransportOptions& o) {
  if (!valid_tcp_options(o)) return Code::kInvalidValue;
  return call([&]() -> Status {
    if (!impl_->listeners.empty()) return Code::kBadState;
    int cpu = impl_->opts.cpu;
    impl_->opts = o;
    impl_->opts.cpu = cpu;
    opts_ = impl_->opts;
    return Code::kSuccess;
  });
}

Status NvmfTarget::create_subsystem(const SubsystemConfig& c) {
  if (!valid_nqn(c.nqn) || c.nqn == kDiscoveryNqn || c.serial.empty() || c.serial.size() > 20 ||
      c.model.size() > 40)
    return Code::kInvalidValue;
  for (const auto& h : c.hosts)
    if (!valid_nqn(h)) return Code::kInvalidValue;
  return call([&]() -> Status {
    if (impl_->subsystems.count(c.nqn)) return Code::kBadState;
    auto s = std::make_unique<Subsystem>();
    s->cfg = c;
    impl_->subsystems[c.nqn] = std::move(s);
    return Code::kSuccess;
  });
}

Status NvmfTarget::delete_subsystem(const std::string& nqn) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    for (auto& c : s->controllers) impl_->close_controller(c.get(), "subsystem deleted");
    // Connections finish their requests before the subsystem's memory goes.
    while (!s->controllers.empty()) impl_->reap_closed();
    impl_->subsystems.erase(nqn);
    return Code::kSuccess;
  });
}

Status NvmfTarget::add_host(const std::string& nqn, const std::string& hostnqn) {
  if (!valid_nqn(hostnqn)) return Code::kInvalidValue;
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    if (std::find(s->cfg.hosts.begin(), s->cfg.hosts.end(), hostnqn) != s->cfg.hosts.end())
      return Code::kBadState;
    s->cfg.hosts.push_back(hostnqn);
    return Code::kSuccess;
  });
}

Status NvmfTarget::remove_host(const std::string& nqn, const std::string& hostnqn) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    auto it = std::find(s->cfg.hosts.begin(), s->cfg.hosts.end(), hostnqn);
    if (it == s->cfg.hosts.end()) return Code::kNotFound;
    s->cfg.hosts.erase(it);
    for (auto& c : s->controllers)
      if (c->hostnqn == hostnqn && !s->cfg.allow_any_host)
        impl_->close_controller(c.get(), "host removed");
    return Code::kSuccess;
  });
}

Status NvmfTarget::add_namespace(const std::string& nqn, std::shared_ptr<Bdev> bdev,
                                 uint32_t nsid_hint, uint32_t* nsid) {
  if (!bdev || nsid_hint > ControllerCore::kMaxNamespaces) return Code::kInvalidValue;
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    uint32_t id = nsid_hint;
    if (id == 0)
      for (uint32_t i = 1;
           i <= std::min<uint32_t>(s->cfg.max_namespaces, NamespaceSet::kMax) && id == 0; ++i)
        if (!s->ns->ns[i]) id = i;
    // One bdev is at most one namespace of a subsystem: two would alias each other.
    for (uint32_t i = 1; i <= NamespaceSet::kMax; ++i)
      if (s->ns->ns[i] == bdev) return Code::kNotPermitted;
    if (id == 0) return Code::kFull;
    if (s->ns->ns[id]) return Code::kBadState;
    s->ns->ns[id] = bdev;
    ++s->ns->generation;
    *nsid = id;
    return Code::kSuccess;
  });
}

Status NvmfTarget::remove_namespace(const std::string& nqn, uint32_t nsid) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    if (nsid == 0 || nsid > NamespaceSet::kMax || !s->ns->ns[nsid]) return Code::kNotFound;
    for (auto& c : s->controllers) c->drain_inflight();
    s->ns->ns[nsid].reset();
    ++s->ns->generation;
    return Code::kSuccess;
  });
}

Status NvmfTarget::add_listener(const std::string& nqn, const std::string& addr, uint16_t port,
                                uint16_t* bound_port) {
  in_addr ia{};
  if (inet_pton(AF_INET, addr.c_str(), &ia) != 1) return Code::kInvalidValue;
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    Listener* l = nullptr;
    for (auto& x : impl_->listeners)
      if (x->key == "tcp:" + addr + ":" + std::to_string(port) || (port == 0 && false)) l = x.get();
    if (l == nullptr) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return Code::kDriver;
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(port);
      sa.sin_addr = ia;
      if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 64) != 0) {
        LOG_ERR("nvme-tcp: cannot listen on %s:%u: %s", addr.c_str(), port, strerror(errno));
        ::close(fd);
        return Code::kIoFailed;
      }
      socklen_t sl = sizeof sa;
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &sl);
      auto nl = std::make_unique<Listener>();
      nl->fd = fd;
      nl->port = ntohs(sa.sin_port);
      nl->key = "tcp:" + addr + ":" + std::to_string(nl->port);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = nl.get();
      epoll_ctl(impl_->epfd, EPOLL_CTL_ADD, fd, &ev);
      l = nl.get();
      impl_->listeners.push_back(std::move(nl));
      LOG_INFO("nvme-tcp: listening on %s:%u", addr.c_str(), l->port);
    }
    if (std::find(s->listeners.begin(), s->listeners.end(), l->key) != s->listeners.end())
      return Code::kBadState;
    s->listeners.push_back(l->key);
    if (bound_port != nullptr) *bound_port = l->port;
    return Code::kSuccess;
  });
}

Status NvmfTarget::remove_listener(const std::string& nqn, const std::string& addr, uint16_t port) {
  return call([&]() -> Status {
    Subsystem* s = impl_->find_subsystem(nqn);
    if (s == nullptr) return Code::kNotFound;
    std::string key = "tcp:" + addr + ":" + std::to_string(port);
    auto it = std::find(s->listeners.begin(), s->listeners.end(), key);
    if (it == s->listeners.end()) return Code::kNotFound;
    s->listeners.erase(it);
    bool used = false;
    for (auto& x : impl_->subsystems)
      used |= std::find(x.second->listeners.begin(), x.second->listeners.end(), key) !=
              x.second->listeners.end();
    if (!used)
      for (size_t i = 0; i < impl_->listeners.size(); ++i)
        if (impl_->listeners[i]->key == key) {
          epoll_ctl(impl_->epfd, EPOLL_CTL_DEL, impl_->listeners[i]->fd, nullptr);
          ::close(impl_->listeners[i]->fd);
          impl_->listeners.erase(impl_->listeners.begin() + static_cast<long>(i));
          break;
        }
    return Code::kSuccess;
  });
}

std::vector<SubsystemInfo> NvmfTarget::subsystems() {
  std::vector<SubsystemInfo> v;
  (void)call([&]() -> Status {
    for (auto& [nqn, s] : impl_->subsystems) {
      SubsystemInfo i{
          nqn,          s->cfg.serial, s->cfg.model, s->cfg.allow_any_host,
          s->cfg.hosts, s->listeners,  {},           static_cast<uint32_t>(s->controllers.size())};
      for (uint32_t id = 1; id <= NamespaceSet::kMax; ++id)
        if (s->ns->ns[id]) i.namespaces.emplace_back(id, s->ns->ns[id]->name());
      v.push_back(std::move(i));
    }
    return Code::kSuccess;
  });
  return v;
}

TargetStats NvmfTarget::stats() {
  TargetStats st;
  (void)call([&]() -> Status {
    st = impl_->stats;
    return Code::kSuccess;
  });
  return st;
}

void NvmfTarget::attach_emulation(EmulationManager* m) {
  (void)call([&]() -> Status {
    impl_->emu = m;
    return Code::kSuccess;
  });
}

std::shared_ptr<NamespaceSet> NvmfTarget::namespace_set(const std::string& nqn) {
  std::shared_ptr<NamespaceSet> ns;
  (void)call([&]() -> Status {
    if (Subsystem* s = impl_->find_subsystem(nqn)) ns = s->ns;
    return Code::kSuccess;
  });
  return ns;
}

bool NvmfTarget::uses_bdev(const Bdev* b) {
  bool used = false;
  (void)call([&]() -> Status {
    for (auto& [nqn, s] : impl_->subsystems)
      for (const auto& n : s->ns->ns) used |= n.get() == b;
    return Code::kSuccess;
  });
  return used;
}

}  // namespace dpukv::nvme
