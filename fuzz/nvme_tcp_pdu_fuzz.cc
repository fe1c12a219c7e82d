// Fuzzes the NVMe/TCP target's receive path end to end: one in-process target
// (subsystem, malloc namespace, listener on an ephemeral port), a fresh TCP
// connection per input, and the input as the byte stream the host sends. The
// first byte chooses how much valid setup goes first (nothing, ICReq, ICReq +
// admin Connect, or ICReq + I/O-queue Connect after enabling a controller), so
// PDU parsing, Fabrics commands, R2T/H2CData and command execution are all
// reached. The target must never crash, and it must keep serving: every input
// ends with a known-good host doing a write and a read on its own connection.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "nvme/tcp_host.h"
#include "nvme/tcp_wire.h"
#include "nvmf/bdev/bdev_malloc.h"
#include "nvmf/nvmf_target.h"
#include "runtime/log.h"

using namespace dpukv;
using namespace dpukv::nvme;
using namespace dpukv::nvme::tcp;

namespace {

constexpr const char* kNqn = "nqn.2026-11.io.dpukv:fuzz";

struct Harness {
  std::unique_ptr<NvmfTarget> target;
  uint16_t port = 0;
  std::unique_ptr<NvmeTcpHost> good;  // an association that must survive every input
  uint64_t inputs = 0;
};

Harness* harness() {
  static Harness* h = [] {
    log_set_level(LogSource::kLib, LogLevel::kCritical);
    auto* x = new Harness();
    TcpTransportOptions o;
    o.max_queue_depth = 16;
    o.max_io_queues = 2;
    if (!NvmfTarget::create(o, &x->target).ok()) abort();
    SubsystemConfig c;
    c.nqn = kNqn;
    if (!x->target->create_subsystem(c).ok()) abort();
    std::unique_ptr<Bdev> b;
    if (!create_malloc_bdev("fuzz", 256, 4096, &b).ok()) abort();
    uint32_t nsid;
    if (!x->target->add_namespace(kNqn, std::shared_ptr<Bdev>(std::move(b)), 0, &nsid).ok())
      abort();
    if (!x->target->add_listener(kNqn, "127.0.0.1", 0, &x->port).ok()) abort();
    TcpHostOptions ho;
    ho.port = x->port;
    ho.subnqn = kNqn;
    ho.queue_depth = 16;
    if (!NvmeTcpHost::connect(ho, &x->good).ok()) abort();
    return x;
  }();
  return h;
}

void put_capsule(std::vector<uint8_t>* out, const Sqe& sqe, const void* icd, uint32_t len) {
  CapsuleCmd cc{CommonHeader{kCapsuleCmd, 0, 72, static_cast<uint8_t>(len ? 72 : 0), 72 + len},
                sqe};
  const auto* p = reinterpret_cast<const uint8_t*>(&cc);
  out->insert(out->end(), p, p + sizeof cc);
  if (len)
    out->insert(out->end(), static_cast<const uint8_t*>(icd),
                static_cast<const uint8_t*>(icd) + len);
}

Sqe connect_sqe(uint16_t qid, uint16_t cntlid_unused) {
  (void)cntlid_unused;
  ConnectCommand c{};
  c.opcode = kFabricsOpcode;
  c.psdt = 0x40;
  c.cid = 0x7777;
  c.fctype = kConnect;
  c.qid = qid;
  c.sqsize = qid == 0 ? 31 : 15;
  c.sgl1 = SglDescriptor{0, sizeof(ConnectData), {}, kSglDataBlockOffset};
  return to_sqe(c);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness* h = harness();
  if (size == 0) return 0;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(h->port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) abort();
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<uint8_t> stream;
  uint8_t mode = data[0] % 4;
  if (mode >= 1) {
    IcReq ic{};
    ic.ch = CommonHeader{kIcReq, 0, 128, 0, 128};
    const auto* p = reinterpret_cast<const uint8_t*>(&ic);
    stream.insert(stream.end(), p, p + sizeof ic);
  }
  if (mode >= 2) {
    ConnectData cd{};
    cd.cntlid = kCntlidDynamic;
    std::memcpy(cd.subnqn, kNqn, std::strlen(kNqn));
    std::memcpy(cd.hostnqn, "nqn.2026-11.io.dpukv:fuzzhost", 29);
    if (mode == 3) {  // an I/O queue of the good host's controller
      cd.cntlid = h->good->cntlid();
      std::memset(cd.hostnqn, 0, sizeof cd.hostnqn);
      std::string hn = TcpHostOptions{}.hostnqn;
      std::memcpy(cd.hostnqn, hn.data(), hn.size());
    }
    put_capsule(&stream, connect_sqe(mode == 3 ? 2 : 0, 0), &cd, sizeof cd);
  }
  stream.insert(stream.end(), data + 1, data + size);
  (void)send(fd, stream.data(), stream.size(), MSG_NOSIGNAL);
  // Drain whatever the target answers for a moment, then hang up.
  char buf[65536];
  for (int i = 0; i < 4; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2) != 1) break;
    if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0) break;
  }
  close(fd);
  // The good association still works.
  if (++h->inputs % 16 == 0) {
    std::vector<uint8_t> w(4096, static_cast<uint8_t>(h->inputs)), r(4096);
    Sqe c{};
    c.opc = kNvmWrite;
    c.cid = 1;
    c.nsid = 1;
    Cqe e;
    if (!h->good->submit(0, c, w.data(), 4096, true).ok() || !h->good->wait_one(0, &e, 5000).ok() ||
        status_of_cqe(e.status) != kSuccess)
      abort();
    c.opc = kNvmRead;
    if (!h->good->submit(0, c, r.data(), 4096, false).ok() ||
        !h->good->wait_one(0, &e, 5000).ok() || status_of_cqe(e.status) != kSuccess || r != w)
      abort();
    // Keep the association alive for the keep-alive timer's sake.
    Sqe k{};
    k.opc = kAdminKeepAlive;
    if (!h->good->admin(k, &e).ok()) abort();
  }
  return 0;
}
