// A real peer process for the comch tests: well-behaved clients and servers, and
// hostile clients that speak garbage. Exit status 0 means the role's own checks
// passed. Usage: comch_peer ROLE PATH [ARG]
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comch/client.h"
#include "comch/server.h"
#include "runtime/buf.h"
#include "runtime/fd_passing.h"
#include "runtime/log.h"
#include "runtime/mem_region.h"

using namespace dpukv;

namespace {

int die(const char* what) {
  std::fprintf(stderr, "comch_peer: %s\n", what);
  return 3;
}

struct ClientState {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<ComchClient> cl;
  std::vector<std::string> received;
  std::unique_ptr<MemRegion> mem;
  std::unique_ptr<Mmap> map;
  std::unique_ptr<BufInventory> inv;
  FastPathConsumer* consumer = nullptr;
  uint64_t peer_consumer = 0;
  std::vector<std::pair<std::string, std::string>> fp_received;  // data, imm
  bool disconnected = false;
};

ClientState* g = nullptr;

void on_recv(ComchConnection*, const uint8_t* d, uint32_t n, UserData) {
  g->received.emplace_back(reinterpret_cast<const char*>(d), n);
}
void on_disconnect(ComchConnection*, Status, UserData) {
  g->disconnected = true;
}
void on_send_done(ComchSendTask* t, UserData, UserData) {
  (void)g->cl->free(t);
}
void on_consumer_new(ComchConnection*, uint64_t id, UserData) {
  g->peer_consumer = id;
}
void on_fp_recv(FastPathConsumer* fc, Buf* b, const uint8_t* imm, uint32_t imm_len, Status st,
                UserData, UserData) {
  if (st.ok())
    g->fp_received.emplace_back(std::string(reinterpret_cast<char*>(b->data()), b->data_len()),
                                std::string(reinterpret_cast<const char*>(imm), imm_len));
  b->reset_data();
  if (st.ok() && fc->post_recv(b, UserData{}).ok()) return;
  (void)b->dec_refcount();
}

int connect_client(const std::string& path, ClientState* s, uint32_t hb_ms = 200) {
  g = s;
  if (!ProgressEngine::create(&s->pe).ok()) return die("pe");
  ComchClientOptions o;
  o.path = path;
  o.heartbeat_interval_ms = hb_ms;
  o.connect_timeout_ms = 10000;
  if (!ComchClient::create(s->pe.get(), o, &s->cl).ok()) return die("create");
  ComchCallbacks cb;
  cb.on_recv = on_recv;
  cb.on_disconnect = on_disconnect;
  cb.on_send_done = on_send_done;
  cb.on_send_error = on_send_done;
  cb.on_consumer_new = on_consumer_new;
  cb.on_fp_recv = on_fp_recv;
  if (!s->cl->set_callbacks(cb).ok() || !s->cl->set_send_conf(256).ok()) return die("conf");
  if (s->cl->start() != Code::kInProgress) return die("start");
  for (int i = 0; i < 2000000 && s->cl->state() == CtxState::kStarting; ++i) {
    s->pe->progress();
    if (i % 100 == 0) usleep(100);
  }
  if (s->cl->state() != CtxState::kRunning) return die("not connected");
  return 0;
}

Status send(ClientState* s, const std::string& m) {
  ComchSendTask* t;
  Status st = s->cl->send_alloc_init(s->cl->connection(), m.data(), static_cast<uint32_t>(m.size()),
                                     UserData{}, &t);
  if (!st.ok()) return st;
  st = s->cl->submit(t);
  if (!st.ok()) (void)s->cl->free(t);
  return st;
}

// Sends n messages, expects each echoed back.
int role_echo(const std::string& path, int n) {
  ClientState s;
  if (int rc = connect_client(path, &s)) return rc;
  for (int i = 0; i < n; ++i) {
    std::string m = "msg-" + std::to_string(i) + std::string(static_cast<size_t>(i % 300), 'x');
    while (send(&s, m) == Code::kAgain) s.pe->progress();
    while (s.received.size() < static_cast<size_t>(i + 1) && !s.disconnected) s.pe->progress();
    if (s.disconnected) return die("disconnected");
    if (s.received.back() != m) return die("echo mismatch");
    usleep(1000);
  }
  (void)s.cl->stop();
  while (s.cl->state() != CtxState::kIdle) s.pe->progress();
  return 0;
}

int make_memory(ClientState* s, size_t size, bool touch = true) {
  MemRegionOptions mo;
  mo.prefault = touch;
  if (!MemRegion::create(size, mo, &s->mem).ok()) return die("mem");
  if (!Mmap::create(s->mem->data(), s->mem->size(), kAccessLocalReadWrite | kAccessExportReadWrite,
                    s->mem->fd(), 0, &s->map)
           .ok() ||
      !s->map->start().ok())
    return die("map");
  return 0;
}

// Exports 1 MiB holding i*3; waits for "check"; expects the server wrote i*7+1.
int role_export(const std::string& path) {
  ClientState s;
  if (int rc = connect_client(path, &s)) return rc;
  if (int rc = make_memory(&s, 1 << 20)) return rc;
  auto* p = static_cast<uint8_t*>(s.mem->data());
  for (size_t i = 0; i < (1 << 20); ++i) p[i] = static_cast<uint8_t>(i * 3);
  ComchSendTask* t;
  if (!s.cl->export_alloc_init(s.cl->connection(), *s.map, 77, UserData{}, &t).ok() ||
      !s.cl->submit(t).ok())
    return die("export");
  while (s.received.empty() && !s.disconnected) s.pe->progress();
  if (s.disconnected || s.received[0] != "check") return die("no check");
  for (size_t i = 0; i < (1 << 20); ++i)
    if (p[i] != static_cast<uint8_t>(i * 7 + 1)) return die("server did not write");
  (void)s.cl->stop();
  while (s.cl->state() != CtxState::kIdle) s.pe->progress();
  return 0;
}

// Exports `mib` MiB of memory it never touches (a sparse memfd); exits 0 once the
// server closes the connection, else runs until killed.
int role_sparse_export(const std::string& path, size_t mib) {
  ClientState s;
  if (int rc = connect_client(path, &s)) return rc;
  if (int rc = make_memory(&s, mib << 20, false)) return rc;
  ComchSendTask* t;
  if (!s.cl->export_alloc_init(s.cl->connection(), *s.map, 5, UserData{}, &t).ok() ||
      !s.cl->submit(t).ok())
    return die("export");
  while (!s.disconnected) s.pe->wait(100000, 10);
  return 0;
}

// Exports memory, then streams messages until killed.
int role_stream(const std::string& path) {
  ClientState s;
  if (int rc = connect_client(path, &s)) return rc;
  if (int rc = make_memory(&s, 4 << 20)) return rc;
  ComchSendTask* t;
  if (!s.cl->export_alloc_init(s.cl->connection(), *s.map, 1, UserData{}, &t).ok() ||
      !s.cl->submit(t).ok())
    return die("export");
  std::string m(1000, 's');
  for (;;) {
    (void)send(&s, m);
    s.pe->progress();
    if (s.disconnected) return die("disconnected");
  }
}

// Fast path: creates a consumer with 16 buffers of 64 KiB; echoes everything it
// receives back through its producer to the server's consumer.
int role_fastpath_echo(const std::string& path, int n) {
  ClientState s;
  if (int rc = connect_client(path, &s)) return rc;
  if (int rc = make_memory(&s, 4 << 20)) return rc;
  if (!BufInventory::create(64, &s.inv).ok()) return die("inv");
  ComchConnection* c = s.cl->connection();
  if (!s.cl->create_consumer(c, s.map.get(), 16, &s.consumer).ok()) return die("consumer");
  for (int i = 0; i < 16; ++i) {
    Buf* b;
    if (!s.inv->get_by_addr(s.map.get(), s.map->addr() + static_cast<size_t>(i) * 65536, 65536, &b)
             .ok() ||
        !s.consumer->post_recv(b, UserData{}).ok())
      return die("post");
  }
  // Send-side buffers live in the second half of the map.
  uint8_t* out = s.map->addr() + (2 << 20);
  int echoed = 0;
  while (echoed < n) {
    s.pe->progress();
    if (s.disconnected) return die("disconnected");
    if (s.fp_received.empty() || s.peer_consumer == 0) continue;
    auto [data, imm] = s.fp_received.front();
    std::memcpy(out, data.data(), data.size());
    Buf* b;
    if (!s.inv->get_by_data(s.map.get(), out, data.size() ? data.size() : 1, &b).ok())
      return die("buf");
    if (data.empty()) (void)b->set_data_len(0);
    Status st;
    while ((st = s.cl->producer_send(c, s.peer_consumer, b, imm.data(),
                                     static_cast<uint32_t>(imm.size()))) == Code::kAgain)
      s.pe->progress();
    (void)b->dec_refcount();
    if (!st.ok()) return die("producer_send");
    s.fp_received.erase(s.fp_received.begin());
    ++echoed;
  }
  // Wait for the server to hang up.
  while (!s.disconnected) s.pe->progress();
  return 0;
}

// A comch echo server (for the kill-the-server test).
struct ServerState {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<ComchServer> srv;
};
ServerState* gs = nullptr;
void srv_recv(ComchConnection* c, const uint8_t* d, uint32_t n, UserData) {
  ComchSendTask* t;
  if (gs->srv->send_alloc_init(c, d, n, UserData{}, &t).ok() && !gs->srv->submit(t).ok())
    (void)gs->srv->free(t);
}
void srv_done(ComchSendTask* t, UserData, UserData) {
  (void)gs->srv->free(t);
}

int role_server(const std::string& path, bool stall) {
  ServerState s;
  gs = &s;
  if (!ProgressEngine::create(&s.pe).ok()) return die("pe");
  ComchServerOptions o;
  o.path = path;
  o.heartbeat_interval_ms = stall ? 60000 : 200;
  if (!ComchServer::create(s.pe.get(), o, &s.srv).ok()) return die("create");
  ComchCallbacks cb;
  cb.on_recv = srv_recv;
  cb.on_send_done = srv_done;
  cb.on_send_error = srv_done;
  if (!s.srv->set_callbacks(cb).ok() || !s.srv->set_send_conf(256).ok() || !s.srv->start().ok())
    return die("start");
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) {
    s.pe->progress();
    // A stalled server answers the handshake, then stops reading.
    if (stall && s.srv->num_connections() > 0) pause();
    usleep(50);
  }
}

// --- hostile clients speak raw bytes on the socket ---

int raw_connect(const std::string& path) {
  sockaddr_un a;
  socklen_t len;
  if (!make_unix_addr(path, &a, &len).ok()) return -1;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) return -1;
  return fd;
}

void raw_hello(int fd, uint32_t seq = 0) {
  uint8_t b[32];
  comch::MsgHeader h{comch::kMagic, comch::kVersion, 1, 16, seq};
  comch::HelloPayload p{4080, 100, 0};
  std::memcpy(b, &h, 16);
  std::memcpy(b + 16, &p, 16);
  (void)!write(fd, b, 32);
}

// Waits until the server closes the socket; 0 if it did within 10 s.
int expect_closed(int fd) {
  char buf[256];
  for (int i = 0; i < 1000; ++i) {
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return 0;
    if (n < 0 && errno != EAGAIN) return 0;
    usleep(10000);
  }
  return die("server kept a misbehaving connection open");
}

int role_abuse(const std::string& path, const std::string& kind) {
  int fd = raw_connect(path);
  if (fd < 0) return die("connect");
  if (kind == "garbage") {
    char junk[100];
    for (size_t i = 0; i < sizeof(junk); ++i) junk[i] = static_cast<char>(rand());
    (void)!write(fd, junk, sizeof(junk));
  } else if (kind == "short") {  // a record shorter than the header
    (void)!write(fd, "DKCH", 4);
  } else if (kind == "lying-length") {  // header length disagrees with the record
    raw_hello(fd);
    comch::MsgHeader h{comch::kMagic, comch::kVersion, 3, 500, 1};
    (void)!write(fd, &h, sizeof(h));
  } else if (kind == "oversize") {
    raw_hello(fd);
    std::vector<uint8_t> big(16 + 60000, 'o');
    comch::MsgHeader h{comch::kMagic, comch::kVersion, 3, 60000, 1};
    std::memcpy(big.data(), &h, 16);
    (void)!write(fd, big.data(), big.size());
  } else if (kind == "bad-seq") {
    raw_hello(fd);
    comch::MsgHeader h{comch::kMagic, comch::kVersion, 5, 0, 7};
    (void)!write(fd, &h, sizeof(h));
  } else if (kind == "data-before-hello") {
    comch::MsgHeader h{comch::kMagic, comch::kVersion, 3, 0, 0};
    (void)!write(fd, &h, sizeof(h));
  } else if (kind == "fd-flood") {  // descriptors on a message that carries none
    raw_hello(fd);
    int fds[4];
    for (int& f : fds) f = dup(0);
    comch::MsgHeader h{comch::kMagic, comch::kVersion, 3, 0, 1};
    (void)send_with_fds(fd, &h, sizeof(h), fds, 4);
  } else if (kind == "bad-export") {  // EXPORT whose fd is a pipe
    raw_hello(fd);
    int p[2];
    (void)!pipe(p);
    uint8_t b[16 + 48] = {};
    comch::MsgHeader h{comch::kMagic, comch::kVersion, 4, 48, 1};
    std::memcpy(b, &h, 16);
    (void)send_with_fds(fd, b, sizeof(b), p, 1);
  } else if (kind == "slowloris") {  // connects and never says HELLO
  } else if (kind == "silent") {     // HELLO, then no heartbeats
    raw_hello(fd);
  } else {
    return die("unknown abuse kind");
  }
  return expect_closed(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return die("usage: comch_peer ROLE PATH [ARG]");
  signal(SIGPIPE, SIG_IGN);
  log_set_level(LogSource::kLib, LogLevel::kError);
  std::string role = argv[1], path = argv[2];
  std::string arg = argc > 3 ? argv[3] : "";
  if (role == "echo") return role_echo(path, arg.empty() ? 50 : std::atoi(arg.c_str()));
  if (role == "export") return role_export(path);
  if (role == "stream") return role_stream(path);
  if (role == "sparse-export")
    return role_sparse_export(path, std::strtoull(arg.c_str(), nullptr, 10));
  if (role == "fastpath-echo") return role_fastpath_echo(path, std::atoi(arg.c_str()));
  if (role == "server") return role_server(path, false);
  if (role == "stalled-server") return role_server(path, true);
  if (role == "abuse") return role_abuse(path, arg);
  return die("unknown role");
}
