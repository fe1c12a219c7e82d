#include "nvme/tcp_host.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "nvme/tcp_wire.h"
#include "runtime/clock.h"
#include "runtime/crc32c.h"
#include "runtime/host_port.h"

namespace dpukv::nvme {
namespace {

using namespace tcp;

Status send_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno == EAGAIN) {
      pollfd pf{fd, POLLOUT, 0};
      ::poll(&pf, 1, 1000);
      continue;
    }
    if (k <= 0) return Code::kConnectionReset;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Code::kSuccess;
}

// n bytes into p by deadline_ms (monotonic): TIMEOUT when the peer is silent that
// long, CONNECTION_RESET when it closes.
Status recv_all(int fd, uint8_t* p, size_t n, uint64_t deadline_ms) {
  while (n > 0) {
    const uint64_t now = monotonic_ms();
    if (now >= deadline_ms) return Code::kTimeout;
    pollfd pf{fd, POLLIN, 0};
    const int r = ::poll(&pf, 1, static_cast<int>(std::min<uint64_t>(deadline_ms - now, 1000)));
    if (r < 0 && errno != EINTR) return Code::kConnectionReset;
    if (r <= 0) continue;
    const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (k <= 0) return Code::kConnectionReset;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Code::kSuccess;
}

// connect(2) by deadline_ms: a blackholed address would otherwise hold the caller
// for the kernel's SYN retries (minutes). 0, else -errno (-ETIMEDOUT at the deadline).
int connect_by(int fd, const sockaddr_in& sa, uint64_t deadline_ms) {
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return -errno;
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0 ? 0 : -errno;
  if (rc == -EINPROGRESS) {
    rc = -ETIMEDOUT;
    for (uint64_t now = monotonic_ms(); now < deadline_ms; now = monotonic_ms()) {
      pollfd pf{fd, POLLOUT, 0};
      const int r = ::poll(&pf, 1, static_cast<int>(std::min<uint64_t>(deadline_ms - now, 1000)));
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      int err = 0;
      socklen_t len = sizeof err;
      rc = r < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ? -errno : -err;
      break;
    }
  }
  (void)fcntl(fd, F_SETFL, fl);
  return rc;
}

}  // namespace

NvmeTcpHost::~NvmeTcpHost() {
  if (admin_.fd >= 0) ::close(admin_.fd);
  for (auto& q : io_)
    if (q.fd >= 0) ::close(q.fd);
}

Status NvmeTcpHost::open_queue(Queue* q, uint16_t qid, uint16_t depth, uint16_t* status) {
  q->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (q->fd < 0) return Code::kDriver;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(opts_.port);
  std::string ip, why;
  if (!resolve_ipv4(opts_.addr, &ip, &why) || inet_pton(AF_INET, ip.c_str(), &sa.sin_addr) != 1)
    return Code::kNotFound;  // no such host
  // timeout_ms bounds the whole of it: connect, ICReq/ICResp and the Connect.
  uint64_t deadline = monotonic_ms() + static_cast<uint64_t>(opts_.timeout_ms);
  while (connect_by(q->fd, sa, deadline) != 0) {
    if (monotonic_ms() >= deadline) return Code::kTimeout;
    ::close(q->fd);
    q->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    usleep(10000);
  }
  int one = 1;
  setsockopt(q->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  q->qid = qid;
  q->rbuf.resize(256 * 1024);
  q->pending.assign(65536, Pending{});
  IcReq req{};
  req.ch = CommonHeader{kIcReq, 0, sizeof req, 0, sizeof req};
  req.dgst = static_cast<uint8_t>((opts_.header_digest ? kDigestHeader : 0) |
                                  (opts_.data_digest ? kDigestData : 0));
  if (Status st = send_all(q->fd, reinterpret_cast<uint8_t*>(&req), sizeof req); !st.ok())
    return st;
  IcResp resp{};
  if (Status st = recv_all(q->fd, reinterpret_cast<uint8_t*>(&resp), sizeof resp, deadline);
      !st.ok()) {
    // Taken at the TCP level, closed before any answer: a target at its connection
    // limit does that (NVMe/TCP has no status for it); FULL says so to the caller.
    return st == Code::kConnectionReset ? Status(Code::kFull) : st;
  }
  if (resp.ch.type != kIcResp || resp.pfv != 0 || resp.maxh2cdata < 4096) return Code::kCorrupted;
  q->maxh2cdata = resp.maxh2cdata;
  int fl = 1;
  (void)fl;
  // Connect: the data (host NQN, subsystem NQN, controller id) goes in the capsule.
  ConnectCommand cc{};
  cc.opcode = kFabricsOpcode;
  cc.psdt = 0x40;  // SGL
  cc.cid = static_cast<uint16_t>(0x7000 + qid);
  cc.fctype = kConnect;
  cc.sgl1 = SglDescriptor{0, sizeof(ConnectData), {}, kSglDataBlockOffset};
  cc.qid = qid;
  cc.sqsize = static_cast<uint16_t>(depth - 1);
  cc.cattr = opts_.disable_sq_flow_control ? kCattrDisableSqFlowControl : 0;
  if (qid == 0) cc.kato = opts_.kato_ms;
  const Sqe c = to_sqe(cc);
  ConnectData cd{};
  cd.cntlid = qid == 0 ? kCntlidDynamic : cntlid_;
  std::memcpy(cd.subnqn, opts_.subnqn.data(), std::min<size_t>(opts_.subnqn.size(), 255));
  std::memcpy(cd.hostnqn, opts_.hostnqn.data(), std::min<size_t>(opts_.hostnqn.size(), 255));
  cd.hostid[0] = 0xdb;
  Cqe e{};
  if (Status st = sync(*q, c, &e, reinterpret_cast<uint8_t*>(&cd), sizeof cd, false); !st.ok())
    return st;
  *status = status_of_cqe(e.status);
  if (*status == kSuccess && qid == 0) cntlid_ = static_cast<uint16_t>(e.dw0);
  return Code::kSuccess;
}

Status NvmeTcpHost::flush(Queue& q) {
  if (q.obuf.empty()) return Code::kSuccess;
  Status st = send_all(q.fd, q.obuf.data(), q.obuf.size());
  q.obuf.clear();
  return st;
}

// Capsules go out in batches: everything submitted between two reaps leaves in
// one send, as a busy initiator should.
Status NvmeTcpHost::send_capsule(Queue& q, const Sqe& cmd, const uint8_t* icd, uint32_t icd_len,
                                 bool now) {
  uint32_t hd = opts_.header_digest ? kDigestLen : 0,
           dd = (icd_len > 0 && opts_.data_digest) ? kDigestLen : 0;
  uint32_t pdo = icd_len > 0 ? sizeof(CapsuleCmd) + hd : 0;
  uint32_t plen = sizeof(CapsuleCmd) + hd + icd_len + dd;
  uint8_t flags = static_cast<uint8_t>((hd ? kFlagHdgst : 0) | (dd ? kFlagDdgst : 0));
  size_t at = q.obuf.size();
  q.obuf.resize(at + plen);
  uint8_t* pdu = q.obuf.data() + at;
  CapsuleCmd cc{
      CommonHeader{kCapsuleCmd, flags, sizeof(CapsuleCmd), static_cast<uint8_t>(pdo), plen}, cmd};
  std::memcpy(pdu, &cc, sizeof cc);
  if (hd) {
    uint32_t d = crc32c(pdu, sizeof cc);
    std::memcpy(pdu + sizeof cc, &d, 4);
  }
  if (icd_len > 0) {
    std::memcpy(pdu + pdo, icd, icd_len);
    if (dd) {
      uint32_t d = crc32c(icd, icd_len);
      std::memcpy(pdu + pdo + icd_len, &d, 4);
    }
  }
  return now ? flush(q) : Status(Code::kSuccess);
}

Status NvmeTcpHost::send_h2c(Queue& q, uint16_t cid, uint16_t ttag, uint32_t off, uint32_t len) {
  Pending& p = q.pending[cid];
  uint32_t hd = opts_.header_digest ? kDigestLen : 0, dd = opts_.data_digest ? kDigestLen : 0;
  for (uint32_t done = 0; done < len;) {
    uint32_t n = std::min(len - done, q.maxh2cdata);
    uint32_t pdo = sizeof(DataHeader) + hd;
    uint32_t plen = pdo + n + dd;
    DataHeader h{};
    bool last = done + n == len;
    h.ch = CommonHeader{kH2CData,
                        static_cast<uint8_t>((last ? kFlagLastPdu : 0) | (hd ? kFlagHdgst : 0) |
                                             (dd ? kFlagDdgst : 0)),
                        sizeof h, static_cast<uint8_t>(pdo), plen};
    h.cccid = cid;
    h.ttag = ttag;
    h.datao = off + done;
    h.datal = n;
    std::vector<uint8_t> pdu(plen);
    std::memcpy(pdu.data(), &h, sizeof h);
    if (hd) {
      uint32_t d = crc32c(&h, sizeof h);
      std::memcpy(pdu.data() + sizeof h, &d, 4);
    }
    std::memcpy(pdu.data() + pdo, p.buf + off + done, n);
    if (dd) {
      uint32_t d = crc32c(p.buf + off + done, n);
      std::memcpy(pdu.data() + pdo + n, &d, 4);
    }
    if (Status st = send_all(q.fd, pdu.data(), pdu.size()); !st.ok()) return st;
    done += n;
  }
  return Code::kSuccess;
}

// Handles every whole PDU in the receive buffer after one recv.
int NvmeTcpHost::pump(Queue& q) {
  if (q.broken) return -1;
  if (q.rbuf.size() - q.rlen < 4096) q.rbuf.resize(q.rbuf.size() * 2);
  ssize_t n = ::recv(q.fd, q.rbuf.data() + q.rlen, q.rbuf.size() - q.rlen, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    q.broken = true;
    return -1;
  }
  if (n > 0) q.rlen += static_cast<size_t>(n);
  size_t pos = 0;
  int handled = 0;
  uint32_t hd = opts_.header_digest ? kDigestLen : 0;
  while (q.rlen - pos >= sizeof(CommonHeader)) {
    CommonHeader ch;
    std::memcpy(&ch, q.rbuf.data() + pos, sizeof ch);
    if (ch.plen < sizeof ch) {
      q.broken = true;
      return -1;
    }
    if (q.rlen - pos < ch.plen) {
      if (q.rbuf.size() < ch.plen + 1024) q.rbuf.resize(ch.plen + 1024);
      break;
    }
    const uint8_t* p = q.rbuf.data() + pos;
    if (ch.type == kCapsuleResp) {
      CapsuleResp r;
      std::memcpy(&r, p, sizeof r);
      q.pending[r.cqe.cid].busy = false;
      q.ready.push_back(r.cqe);
    } else if (ch.type == kC2HData) {
      DataHeader h;
      std::memcpy(&h, p, sizeof h);
      Pending& pd = q.pending[h.cccid];
      if (pd.busy && h.datao <= pd.len && h.datal <= pd.len - h.datao)
        std::memcpy(pd.buf + h.datao, p + ch.pdo, h.datal);
      if (ch.flags & kFlagSuccess) {
        Cqe c{};
        c.cid = h.cccid;
        c.sq_id = q.qid;
        pd.busy = false;
        q.ready.push_back(c);
      }
    } else if (ch.type == kR2T) {
      R2THeader h;
      std::memcpy(&h, p, sizeof h);
      if (!send_h2c(q, h.cccid, h.ttag, h.r2to, h.r2tl).ok()) q.broken = true;
    } else if (ch.type == kC2HTermReq) {
      q.broken = true;
      return -1;
    }
    (void)hd;
    pos += ch.plen;
    ++handled;
  }
  if (pos > 0) {
    std::memmove(q.rbuf.data(), q.rbuf.data() + pos, q.rlen - pos);
    q.rlen -= pos;
  }
  return handled;
}

Status NvmeTcpHost::sync(Queue& q, Sqe cmd, Cqe* cqe, uint8_t* data, uint32_t len, bool to_host) {
  Pending& p = q.pending[cmd.cid];
  p = Pending{data, len, !to_host, true};
  cmd.flags = static_cast<uint8_t>((cmd.flags & 0x3f) | 0x40);
  SglDescriptor sgl{0, len, {}, kSglTransportDataBlock};
  bool icd = len > 0 && !to_host && len <= 8192;
  if (icd) sgl.type = kSglDataBlockOffset;
  if (len > 0) std::memcpy(reinterpret_cast<uint8_t*>(&cmd) + 24, &sgl, sizeof sgl);
  if (Status st = send_capsule(q, cmd, icd ? data : nullptr, icd ? len : 0); !st.ok()) return st;
  uint64_t deadline = monotonic_ms() + static_cast<uint64_t>(opts_.timeout_ms);
  for (;;) {
    for (size_t i = q.ready_head; i < q.ready.size(); ++i)
      if (q.ready[i].cid == cmd.cid) {
        *cqe = q.ready[i];
        q.ready.erase(q.ready.begin() + static_cast<long>(i));
        return Code::kSuccess;
      }
    if (pump(q) < 0) return Code::kConnectionReset;
    if (monotonic_ms() > deadline) return Code::kTimeout;
    pollfd pf{q.fd, POLLIN, 0};
    ::poll(&pf, 1, 10);
  }
}

Status NvmeTcpHost::connect_admin_only(const TcpHostOptions& o, uint16_t* status,
                                       std::unique_ptr<NvmeTcpHost>* out) {
  std::unique_ptr<NvmeTcpHost> h(new NvmeTcpHost());
  h->opts_ = o;
  if (Status st = h->open_queue(&h->admin_, 0, 32, status); !st.ok()) return st;
  *out = std::move(h);
  return Code::kSuccess;
}

// MDTS (Identify Controller byte 77) in bytes, at most 1 MiB; 0: no limit.
uint32_t NvmeTcpHost::max_transfer_of(const uint8_t* id) {
  return id[77] == 0 ? (1u << 20) : std::min<uint32_t>(1u << 20, 4096u << id[77]);
}

Status NvmeTcpHost::enable() {
  uint16_t status = 0;
  if (Status st = property_set(kRegCc, 4, kCcEn | 6u << 16 | 4u << 20, &status);
      !st.ok() || status != kSuccess)
    return Code::kIoFailed;
  uint64_t deadline = monotonic_ms() + static_cast<uint64_t>(opts_.timeout_ms);
  for (;;) {
    uint64_t csts = 0;
    if (Status st = property_get(kRegCsts, 4, &csts, &status); !st.ok()) return st;
    if (csts & kCstsRdy) return Code::kSuccess;
    if ((csts & kCstsCfs) || monotonic_ms() > deadline) return Code::kIoFailed;
    usleep(1000);
  }
}

Status NvmeTcpHost::read_log(uint8_t lid, uint64_t offset, uint8_t* out, uint32_t len) {
  for (uint32_t done = 0; done < len;) {
    const uint32_t n = std::min(len - done, max_transfer_);
    const uint32_t numd = n / 4 - 1;
    Sqe c{};
    c.opc = kAdminGetLogPage;
    c.cdw10 = lid | (numd & 0xffff) << 16;
    c.cdw11 = numd >> 16;
    c.cdw12 = static_cast<uint32_t>(offset + done);
    c.cdw13 = static_cast<uint32_t>((offset + done) >> 32);
    Cqe e{};
    if (Status st = admin(c, &e, out + done, n, true); !st.ok()) return st;
    if (status_of_cqe(e.status) != kSuccess) return Code::kIoFailed;
    done += n;
  }
  return Code::kSuccess;
}

Status NvmeTcpHost::discover(const TcpHostOptions& o, uint64_t* genctr,
                             std::vector<DiscoveryEntry>* out) {
  TcpHostOptions d = o;
  d.subnqn = kDiscoveryNqn;
  uint16_t status = 0;
  std::unique_ptr<NvmeTcpHost> h;
  if (Status st = connect_admin_only(d, &status, &h); !st.ok()) return st;
  if (status != kSuccess) return Code::kNotPermitted;
  if (Status st = h->enable(); !st.ok()) return st;
  uint8_t id[kIdentifySize];
  if (Status st = h->identify(kCnsController, 0, id, &status); !st.ok() || status != kSuccess)
    return Code::kIoFailed;
  // CNTRLTYPE 2: a discovery controller; 0 ("not reported", before NVMe 1.4)
  // is what SPDK's reports. An I/O or administrative controller is not one.
  if (id[111] != 2 && id[111] != 0) return Code::kInvalidValue;
  h->max_transfer_ = max_transfer_of(id);
  // The header, then header and records in one read; a GENCTR that moved in
  // between means the log changed while it was read: read it again.
  for (int attempt = 0; attempt < 4; ++attempt) {
    uint8_t hdr[1024];
    if (Status st = h->read_log(kLogDiscovery, 0, hdr, sizeof hdr); !st.ok()) return st;
    uint64_t numrec;
    std::memcpy(&numrec, hdr + 8, 8);
    if (numrec > 1024) return Code::kTooBig;  // more records than a sane log has
    std::vector<uint8_t> log(1024 * (numrec + 1));
    if (Status st = h->read_log(kLogDiscovery, 0, log.data(), static_cast<uint32_t>(log.size()));
        !st.ok())
      return st;
    if (std::memcmp(log.data(), hdr, 8) != 0) continue;
    std::memcpy(genctr, hdr, 8);
    auto text = [](const uint8_t* p, size_t n) {
      std::string s(reinterpret_cast<const char*>(p), strnlen(reinterpret_cast<const char*>(p), n));
      while (!s.empty() && s.back() == ' ') s.pop_back();
      return s;
    };
    out->clear();
    for (uint64_t i = 0; i < numrec; ++i) {
      const uint8_t* e = log.data() + 1024 * (i + 1);
      DiscoveryEntry x;
      x.trtype = e[0];
      x.adrfam = e[1];
      x.subtype = e[2];
      x.treq = e[3];
      x.sectype = e[768];
      std::memcpy(&x.portid, e + 4, 2);
      std::memcpy(&x.cntlid, e + 6, 2);
      std::memcpy(&x.asqsz, e + 8, 2);
      x.trsvcid = text(e + 32, 32);
      x.subnqn = text(e + 256, 256);
      x.traddr = text(e + 512, 256);
      out->push_back(std::move(x));
    }
    return Code::kSuccess;
  }
  return Code::kAgain;  // the log kept changing
}

Status NvmeTcpHost::connect(const TcpHostOptions& o, std::unique_ptr<NvmeTcpHost>* out) {
  uint16_t status = 0;
  std::unique_ptr<NvmeTcpHost> h;
  if (Status st = connect_admin_only(o, &status, &h); !st.ok()) return st;
  if (status != kSuccess) return Code::kNotPermitted;
  // I/O queues no deeper than the controller allows (CAP.MQES, 0-based).
  uint64_t cap = 0;
  if (Status st = h->property_get(kRegCap, 8, &cap, &status); !st.ok() || status != kSuccess)
    return Code::kIoFailed;
  h->opts_.queue_depth =
      static_cast<uint16_t>(std::min<uint64_t>(o.queue_depth, (cap & 0xffff) + 1));
  if (Status st = h->enable(); !st.ok()) return st;
  uint8_t id[kIdentifySize];
  if (Status st = h->identify(kCnsController, 0, id, &status); !st.ok() || status != kSuccess)
    return Code::kIoFailed;
  uint32_t ioccsz;
  std::memcpy(&ioccsz, id + 1792, 4);
  h->icd_bytes_ = ioccsz >= 4 ? ioccsz * 16 - 64 : 0;
  h->max_transfer_ = max_transfer_of(id);
  if (Status st = h->identify(kCnsActiveNsList, 0, id, &status); !st.ok() || status != kSuccess)
    return Code::kIoFailed;
  for (size_t i = 0; i < 1024; ++i) {
    uint32_t nsid;
    std::memcpy(&nsid, id + 4 * i, 4);
    if (nsid == 0) break;
    h->nsids_.push_back(nsid);
  }
  h->bs_.assign(33, 0);
  h->blocks_.assign(33, 0);
  for (uint32_t nsid : h->nsids_) {
    if (nsid > 32) continue;
    if (Status st = h->identify(kCnsNamespace, nsid, id, &status); !st.ok() || status != kSuccess)
      return Code::kIoFailed;
    std::memcpy(&h->blocks_[nsid], id, 8);
    h->bs_[nsid] = 1u << id[128 + 2 + 4 * (id[26] & 0xf)];
  }
  Sqe f{};
  f.opc = kAdminSetFeatures;
  f.cdw10 = kFeatNumQueues;
  f.cdw11 = (o.io_queues - 1) | (o.io_queues - 1) << 16;
  Cqe e{};
  if (Status st = h->admin(f, &e); !st.ok() || status_of_cqe(e.status) != kSuccess)
    return Code::kIoFailed;
  h->io_.resize(o.io_queues);
  for (uint32_t q = 0; q < o.io_queues; ++q) {
    if (Status st =
            h->open_queue(&h->io_[q], static_cast<uint16_t>(q + 1), h->opts_.queue_depth, &status);
        !st.ok())
      return st;
    if (status != kSuccess) return Code::kIoFailed;
  }
  *out = std::move(h);
  return Code::kSuccess;
}

Status NvmeTcpHost::admin(Sqe cmd, Cqe* cqe, uint8_t* data, uint32_t len, bool to_host) {
  cmd.cid = next_admin_cid_++ % 64;
  return sync(admin_, cmd, cqe, data, len, to_host);
}

Status NvmeTcpHost::identify(uint8_t cns, uint32_t nsid, uint8_t* out4k, uint16_t* status) {
  Sqe c{};
  c.opc = kAdminIdentify;
  c.nsid = nsid;
  c.cdw10 = cns;
  Cqe e{};
  if (Status st = admin(c, &e, out4k, kIdentifySize, true); !st.ok()) return st;
  *status = status_of_cqe(e.status);
  return Code::kSuccess;
}

// Property Get/Set: Fabrics commands on the admin queue; attrib 1 = 8 bytes.
Status NvmeTcpHost::property(uint8_t fctype, uint32_t offset, uint32_t size, uint64_t value,
                             Cqe* e) {
  Sqe c{};
  c.opc = kFabricsOpcode;
  auto* raw = reinterpret_cast<uint8_t*>(&c);
  raw[4] = fctype;
  raw[40] = size == 8 ? 1 : 0;
  std::memcpy(raw + 44, &offset, 4);
  if (fctype == kPropertySet) std::memcpy(raw + 48, &value, 8);
  return admin(c, e);
}

Status NvmeTcpHost::property_get(uint32_t offset, uint32_t size, uint64_t* value,
                                 uint16_t* status) {
  Cqe e{};
  if (Status st = property(kPropertyGet, offset, size, 0, &e); !st.ok()) return st;
  *status = status_of_cqe(e.status);
  *value = uint64_t{e.dw0} | uint64_t{e.dw1} << 32;
  return Code::kSuccess;
}

Status NvmeTcpHost::property_set(uint32_t offset, uint32_t size, uint64_t value, uint16_t* status) {
  Cqe e{};
  if (Status st = property(kPropertySet, offset, size, value, &e); !st.ok()) return st;
  *status = status_of_cqe(e.status);
  return Code::kSuccess;
}

Status NvmeTcpHost::submit(uint32_t qi, Sqe cmd, uint8_t* buf, uint32_t len, bool write) {
  Queue& q = queue(qi);
  if (q.broken) return Code::kConnectionReset;
  q.pending[cmd.cid] = Pending{buf, len, write, true};
  cmd.flags = static_cast<uint8_t>((cmd.flags & 0x3f) | 0x40);
  bool icd = write && len > 0 && len <= icd_bytes_;
  if (len > 0) {
    SglDescriptor sgl{0, len, {}, icd ? kSglDataBlockOffset : kSglTransportDataBlock};
    std::memcpy(reinterpret_cast<uint8_t*>(&cmd) + 24, &sgl, sizeof sgl);
  }
  return send_capsule(q, cmd, icd ? buf : nullptr, icd ? len : 0, /*now=*/false);
}

int NvmeTcpHost::reap(uint32_t qi, Cqe* out, int max) {
  Queue& q = queue(qi);
  if (!flush(q).ok()) q.broken = true;
  if (q.ready_head == q.ready.size() && pump(q) < 0 && q.ready_head == q.ready.size()) return -1;
  int n = 0;
  while (n < max && q.ready_head < q.ready.size()) out[n++] = q.ready[q.ready_head++];
  if (q.ready_head == q.ready.size()) {
    q.ready.clear();
    q.ready_head = 0;
  }
  return n;
}

Status NvmeTcpHost::wait_one(uint32_t qi, Cqe* out, int timeout_ms) {
  uint64_t deadline = monotonic_ms() + static_cast<uint64_t>(timeout_ms);
  for (;;) {
    int n = reap(qi, out, 1);
    if (n == 1) return Code::kSuccess;
    if (n < 0) return Code::kConnectionReset;
    if (monotonic_ms() > deadline) return Code::kTimeout;
    pollfd pf{queue(qi).fd, POLLIN, 0};
    ::poll(&pf, 1, 10);
  }
}

Status NvmeTcpHost::send_raw(uint32_t qi, const void* p, size_t n) {
  if (Status st = flush(queue(qi)); !st.ok()) return st;
  return send_all(queue(qi).fd, static_cast<const uint8_t*>(p), n);
}

Status NvmeTcpHost::recv_pdu(uint32_t qi, uint8_t* type, uint16_t* fes, int timeout_ms) {
  Queue& q = queue(qi);
  uint64_t deadline = monotonic_ms() + static_cast<uint64_t>(timeout_ms);
  while (q.rlen < sizeof(CommonHeader) ||
         q.rlen < reinterpret_cast<CommonHeader*>(q.rbuf.data())->plen) {
    pollfd pf{q.fd, POLLIN, 0};
    if (::poll(&pf, 1, 50) == 1) {
      ssize_t n = ::recv(q.fd, q.rbuf.data() + q.rlen, q.rbuf.size() - q.rlen, 0);
      if (n <= 0) return Code::kConnectionReset;
      q.rlen += static_cast<size_t>(n);
    }
    if (monotonic_ms() > deadline) return Code::kTimeout;
  }
  CommonHeader ch;
  std::memcpy(&ch, q.rbuf.data(), sizeof ch);
  *type = ch.type;
  *fes = 0;
  if (ch.type == kC2HTermReq && ch.plen >= sizeof(TermReq)) {
    TermReq t;
    std::memcpy(&t, q.rbuf.data(), sizeof t);
    *fes = t.fes;
  }
  std::memmove(q.rbuf.data(), q.rbuf.data() + ch.plen, q.rlen - ch.plen);
  q.rlen -= ch.plen;
  return Code::kSuccess;
}

}  // namespace dpukv::nvme
