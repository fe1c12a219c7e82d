// Fuzzes the control channel's receive path end to end: a real ComchServer, a raw
// client socket, and the input cut into records (2-byte little-endian length
// prefixes). The first byte chooses whether a valid HELLO goes first, so both the
// handshake and the post-handshake dispatch are reached. The server must never
// crash, and it must not leak descriptors or connections.
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "comch/server.h"
#include "runtime/clock.h"
#include "runtime/log.h"

using namespace dpukv;

namespace {

struct Harness {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<ComchServer> srv;
  std::string path;
};

int count_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

Harness* harness() {
  static Harness* h = [] {
    log_set_level(LogSource::kLib, LogLevel::kDisable);
    auto* x = new Harness();
    x->path = "@dpukv-fuzz-" + std::to_string(getpid());
    ComchServerOptions o;
    o.path = x->path;
    o.max_imports_per_connection = 2;
    if (!ProgressEngine::create(&x->pe).ok() ||
        !ComchServer::create(x->pe.get(), o, &x->srv).ok() || !x->srv->set_send_conf(4).ok() ||
        !x->srv->start().ok())
      abort();
    return x;
  }();
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness* h = harness();
  const int fds_before = count_fds();
  sockaddr_un a;
  socklen_t alen;
  if (!make_unix_addr(h->path, &a, &alen).ok()) abort();
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), alen) != 0) abort();
  const uint64_t seen = h->srv->accepted() + h->srv->refused();
  uint32_t seq = 0;
  if (size > 0 && (data[0] & 1)) {
    uint8_t hello[32];
    comch::MsgHeader hd{comch::kMagic, comch::kVersion, 1, 16, seq++};
    comch::HelloPayload p{4080, 1000, 0};
    std::memcpy(hello, &hd, 16);
    std::memcpy(hello + 16, &p, 16);
    (void)!send(fd, hello, sizeof(hello), MSG_NOSIGNAL);
  }
  size_t off = size > 0 ? 1 : 0;
  while (off + 2 <= size) {
    size_t len = data[off] | (static_cast<size_t>(data[off + 1]) << 8);
    off += 2;
    if (len > size - off) len = size - off;
    // Passing an fd with odd-length records exercises the descriptor checks.
    int pass = (len & 1) ? dup(fd) : -1;
    if (pass >= 0) {
      msghdr m{};
      iovec iov{const_cast<uint8_t*>(data + off), len};
      alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = ctrl;
      m.msg_controllen = sizeof(ctrl);
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass, sizeof(int));
      (void)!sendmsg(fd, &m, MSG_NOSIGNAL);
      close(pass);
    } else {
      (void)!send(fd, data + off, len, MSG_NOSIGNAL);
    }
    off += len;
  }
  for (int i = 0; i < 8; ++i) h->pe->progress();
  close(fd);
  // Serve until the server has taken this connection, let it go and closed its
  // descriptors (a closed connection's socket is released once its sends have
  // completed). Before, only "no connection open" was checked, after a fixed 1,000
  // rounds: a connection not accepted yet passed, was served during the next run
  // and failed that one (seen once in ~700,000 runs on a loaded machine). Bounded
  // by time, not rounds; descriptors are counted against the start of the run, not
  // of the process (libFuzzer's symbolizer keeps pipes open once started).
  auto taken = [&] { return h->srv->accepted() + h->srv->refused() != seen; };
  auto done = [&] {
    return taken() && h->srv->num_connections() == 0 && count_fds() <= fds_before;
  };
  const uint64_t deadline = monotonic_ms() + 5000;
  while (!done() && monotonic_ms() < deadline) h->pe->progress();
  if (!taken() || h->srv->num_connections() != 0) abort();
  if (count_fds() > fds_before) abort();  // descriptors leaked
  return 0;
}
