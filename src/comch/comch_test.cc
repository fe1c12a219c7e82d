// Control channel tests with real processes on both sides (tests/comch_peer.cc).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comch/client.h"
#include "comch/server.h"
#include "runtime/buf.h"
#include "runtime/child_process.h"
#include "runtime/log.h"
#include "runtime/mem_region.h"

extern char** environ;

namespace dpukv {
namespace {

int count_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

pid_t spawn_peer(const std::vector<std::string>& args, bool capture_stdout = false,
                 int* out_fd = nullptr) {
  std::vector<char*> argv;
  std::string bin = COMCH_PEER_PATH;
  argv.push_back(bin.data());
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  int p[2] = {-1, -1};
  if (capture_stdout) {
    EXPECT_EQ(pipe2(p, O_CLOEXEC), 0);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  }
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  if (capture_stdout) {
    close(p[1]);
    *out_fd = p[0];
  }
  return pid;
}

std::string unique_path(const char* tag) {
  return "/tmp/dpukv-comch-" + std::string(tag) + "-" + std::to_string(getpid()) + ".sock";
}

struct Events {
  std::vector<ComchConnection*> connected;
  std::vector<std::pair<uint64_t, Status>> disconnected;
  std::vector<std::string> received;
  std::vector<Mmap*> exports;
  std::vector<uint64_t> consumers;
  std::vector<std::pair<std::string, std::string>> fp;
  bool echo = false;
  ComchBase* ch = nullptr;
};

class ComchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_set_level(LogSource::kLib, LogLevel::kError);
    ASSERT_TRUE(ProgressEngine::create(&pe_).ok());
  }
  void TearDown() override {
    for (pid_t p : children_) {
      signal_child(p, SIGKILL);
      reap_child(p, nullptr);
    }
    if (srv_ && srv_->state() != CtxState::kIdle) {
      (void)srv_->stop();
      pump_until([&] { return srv_->state() == CtxState::kIdle; });
    }
    srv_.reset();
  }

  ComchCallbacks callbacks() {
    ComchCallbacks cb;
    cb.on_connect = [](ComchConnection* c, UserData ud) {
      static_cast<Events*>(ud.ptr)->connected.push_back(c);
    };
    cb.on_disconnect = [](ComchConnection* c, Status why, UserData ud) {
      static_cast<Events*>(ud.ptr)->disconnected.emplace_back(c->id(), why);
    };
    cb.on_recv = [](ComchConnection* c, const uint8_t* d, uint32_t n, UserData ud) {
      auto* ev = static_cast<Events*>(ud.ptr);
      ev->received.emplace_back(reinterpret_cast<const char*>(d), n);
      if (!ev->echo) return;
      ComchSendTask* t;
      if (ev->ch->send_alloc_init(c, d, n, UserData{}, &t).ok() && !ev->ch->submit(t).ok())
        (void)ev->ch->free(t);
    };
    cb.on_export = [](ComchConnection*, Mmap* m, uint64_t, UserData ud) {
      static_cast<Events*>(ud.ptr)->exports.push_back(m);
    };
    cb.on_consumer_new = [](ComchConnection*, uint64_t id, UserData ud) {
      static_cast<Events*>(ud.ptr)->consumers.push_back(id);
    };
    cb.on_send_done = [](ComchSendTask* t, UserData, UserData ud) {
      (void)static_cast<Events*>(ud.ptr)->ch->free(t);
    };
    cb.on_send_error = cb.on_send_done;
    cb.on_fp_recv = [](FastPathConsumer* fc, Buf* b, const uint8_t* imm, uint32_t imm_len,
                       Status st, UserData, UserData ud) {
      auto* ev = static_cast<Events*>(ud.ptr);
      if (st.ok())
        ev->fp.emplace_back(std::string(reinterpret_cast<char*>(b->data()), b->data_len()),
                            std::string(reinterpret_cast<const char*>(imm), imm_len));
      b->reset_data();
      if (!st.ok() || !fc->post_recv(b, UserData{}).ok()) (void)b->dec_refcount();
    };
    return cb;
  }

  void start_server(ComchServerOptions o) {
    if (o.path.empty()) o.path = unique_path("srv");
    path_ = o.path;
    ASSERT_TRUE(ComchServer::create(pe_.get(), o, &srv_).ok());
    UserData ud;
    ud.ptr = &ev_;
    ev_.ch = srv_.get();
    ASSERT_TRUE(srv_->set_user_data(ud).ok());
    ASSERT_TRUE(srv_->set_callbacks(callbacks()).ok());
    ASSERT_TRUE(srv_->set_send_conf(512).ok());
    ASSERT_TRUE(srv_->start().ok());
  }

  bool pump_until(const std::function<bool()>& pred, int timeout_ms = 15000) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      if (!pe_->progress()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return pred();
  }

  // Waits for a child while serving; returns its exit status or -1.
  int wait_child(pid_t pid, int timeout_ms = 20000) {
    int status = 0;
    if (pid <= 0) return -1;
    bool done = pump_until([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout_ms);
    if (!done) return -1;
    children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  pid_t peer(const std::vector<std::string>& args) {
    pid_t p = spawn_peer(args);
    EXPECT_GT(p, 0) << "cannot start comch_peer (is it beside the test binary?)";
    if (p > 0) children_.push_back(p);
    return p;
  }

  std::unique_ptr<ProgressEngine> pe_;
  std::unique_ptr<ComchServer> srv_;
  std::string path_;
  Events ev_;
  std::vector<pid_t> children_;
};

TEST(ComchWire, HeaderValidation) {
  uint8_t rec[16 + 100] = {};
  comch::MsgHeader h{comch::kMagic, comch::kVersion, 3, 100, 5};
  std::memcpy(rec, &h, 16);
  comch::MsgHeader out;
  EXPECT_TRUE(comch::parse_header(rec, sizeof(rec), 4080, 5, &out).ok());
  EXPECT_EQ(comch::parse_header(rec, sizeof(rec), 4080, 6, &out), Code::kInvalidValue);  // seq
  EXPECT_EQ(comch::parse_header(rec, sizeof(rec) - 1, 4080, 5, &out),
            Code::kInvalidValue);  // length
  EXPECT_EQ(comch::parse_header(rec, sizeof(rec), 99, 5, &out), Code::kTooBig);
  EXPECT_EQ(comch::parse_header(rec, 15, 4080, 5, &out), Code::kInvalidValue);
  h.type = 99;
  std::memcpy(rec, &h, 16);
  EXPECT_EQ(comch::parse_header(rec, sizeof(rec), 4080, 5, &out), Code::kInvalidValue);
  h.type = 5;  // heartbeat must be empty
  std::memcpy(rec, &h, 16);
  EXPECT_EQ(comch::parse_header(rec, sizeof(rec), 4080, 5, &out), Code::kInvalidValue);
  h.magic = 0;
  std::memcpy(rec, &h, 16);
  EXPECT_EQ(comch::parse_header(rec, sizeof(rec), 4080, 5, &out), Code::kInvalidValue);
}

TEST_F(ComchTest, ClientProcessExchangesMessagesAndPeerCredsAreRecorded) {
  ComchServerOptions o;
  ev_.echo = true;
  start_server(o);
  pid_t pid = peer({"echo", path_, "100"});
  ASSERT_TRUE(pump_until([&] { return !ev_.connected.empty(); }));
  EXPECT_EQ(ev_.connected[0]->peer().pid, pid);
  EXPECT_EQ(ev_.connected[0]->peer().uid, getuid());
  EXPECT_EQ(wait_child(pid), 0);
  EXPECT_EQ(ev_.received.size(), 100u);
  ASSERT_TRUE(pump_until([&] { return ev_.disconnected.size() == 1; }));
  EXPECT_EQ(srv_->num_connections(), 0u);
  EXPECT_EQ(srv_->counters().protocol_errors, 0u);
}

TEST_F(ComchTest, AbstractSocketName) {
  ComchServerOptions o;
  o.path = "@dpukv-test-" + std::to_string(getpid());
  ev_.echo = true;
  start_server(o);
  EXPECT_EQ(wait_child(peer({"echo", o.path, "5"})), 0);
}

TEST_F(ComchTest, MemoryExportCrossesProcesses) {
  start_server(ComchServerOptions{});
  pid_t pid = peer({"export", path_});
  ASSERT_TRUE(pump_until([&] { return !ev_.exports.empty(); }));
  Mmap* m = ev_.exports[0];
  ASSERT_EQ(m->length(), 1u << 20);
  EXPECT_TRUE(m->imported());
  for (size_t i = 0; i < (1 << 20); ++i) ASSERT_EQ(m->addr()[i], static_cast<uint8_t>(i * 3));
  for (size_t i = 0; i < (1 << 20); ++i) m->addr()[i] = static_cast<uint8_t>(i * 7 + 1);
  ComchSendTask* t;
  ASSERT_TRUE(srv_->send_alloc_init(ev_.connected[0], "check", 5, UserData{}, &t).ok());
  ASSERT_TRUE(srv_->submit(t).ok());
  EXPECT_EQ(wait_child(pid), 0);
  ASSERT_TRUE(pump_until([&] { return ev_.disconnected.size() == 1; }));
  EXPECT_EQ(srv_->counters().imports_released, 1u);
}

// Issue 34.7: imports were mapped with MAP_POPULATE, so three peers exporting
// untouched 1 GiB memfds took 3 GiB of the host (and stalled the progress thread);
// the staging cap was per connection only.
TEST_F(ComchTest, SparseExportsAreNotPopulatedAndAreCappedOverAllConnections) {
  auto rss_kib = [] {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
    return 0ull;
  };
  ComchServerOptions o;
  o.max_import_bytes_per_connection = 512ull << 20;
  o.max_import_bytes_total = 768ull << 20;
  start_server(o);
  const unsigned long long before = rss_kib();
  pid_t a = peer({"sparse-export", path_, "512"});
  ASSERT_TRUE(pump_until([&] { return ev_.exports.size() == 1; }));
  EXPECT_EQ(ev_.exports[0]->length(), 512ull << 20);
  std::printf("resident after importing a 512 MiB sparse memfd: +%llu KiB\n", rss_kib() - before);
  EXPECT_LT(rss_kib(), before + (64ull << 10)) << "the import populated the sparse memfd";
  EXPECT_EQ(srv_->import_bytes_all(), 512ull << 20);

  // 512 more would pass the limit for all connections: that peer is closed.
  pid_t b = peer({"sparse-export", path_, "512"});
  EXPECT_EQ(wait_child(b), 0);
  ASSERT_TRUE(pump_until([&] { return ev_.disconnected.size() == 1; }));
  EXPECT_EQ(ev_.disconnected[0].second, Code::kNotPermitted);
  EXPECT_EQ(ev_.exports.size(), 1u);

  // 256 fit: 768 over both.
  pid_t c = peer({"sparse-export", path_, "256"});
  ASSERT_TRUE(pump_until([&] { return ev_.exports.size() == 2; }));
  EXPECT_EQ(srv_->import_bytes_all(), 768ull << 20);
  // Other memory a connection shares counts too (the agent's GPU exports).
  ev_.connected[0]->set_other_import_bytes(1);
  const char* why = nullptr;
  EXPECT_FALSE(srv_->import_fits(ev_.connected[2], 0, &why));
  ASSERT_NE(why, nullptr);
  EXPECT_NE(std::string(why).find("all clients"), std::string::npos);
  ev_.connected[0]->set_other_import_bytes(0);
  EXPECT_TRUE(srv_->import_fits(ev_.connected[2], 0, &why));
  (void)a;
  (void)c;
}

TEST_F(ComchTest, KilledClientReleasesEverything) {
  start_server(ComchServerOptions{});
  const int fds_before = count_fds();
  pid_t pid = peer({"stream", path_});
  ASSERT_TRUE(pump_until([&] { return !ev_.exports.empty() && ev_.received.size() > 100; }));
  EXPECT_GT(count_fds(), fds_before);  // the connection socket
  ASSERT_TRUE(signal_child(pid, SIGKILL));
  ASSERT_TRUE(pump_until([&] { return ev_.disconnected.size() == 1; }));
  EXPECT_EQ(ev_.disconnected[0].second, Code::kConnectionReset);
  EXPECT_EQ(srv_->num_connections(), 0u);
  EXPECT_EQ(srv_->counters().imports, 1u);
  EXPECT_EQ(srv_->counters().imports_released, 1u);
  pe_->progress();
  EXPECT_EQ(count_fds(), fds_before);
  // And the server still serves.
  ev_.echo = true;
  EXPECT_EQ(wait_child(peer({"echo", path_, "10"})), 0);
}

TEST_F(ComchTest, ClientSeesServerDeathAndReconnects) {
  const std::string path = unique_path("restart");
  int out = -1;
  pid_t server = spawn_peer({"server", path}, true, &out);
  children_.push_back(server);
  char line[16] = {};
  ASSERT_GT(read(out, line, sizeof(line)), 0);  // "ready"

  ComchClientOptions o;
  o.path = path;
  o.heartbeat_interval_ms = 100;
  std::unique_ptr<ComchClient> cl;
  ASSERT_TRUE(ComchClient::create(pe_.get(), o, &cl).ok());
  UserData ud;
  ud.ptr = &ev_;
  ev_.ch = cl.get();
  ASSERT_TRUE(cl->set_user_data(ud).ok());
  ASSERT_TRUE(cl->set_callbacks(callbacks()).ok());
  ASSERT_TRUE(cl->set_send_conf(16).ok());
  ASSERT_EQ(cl->start(), Code::kInProgress);
  EXPECT_EQ(cl->state(), CtxState::kStarting);
  ASSERT_TRUE(pump_until([&] { return cl->state() == CtxState::kRunning; }));
  ComchSendTask* t;
  ASSERT_TRUE(cl->send_alloc_init(cl->connection(), "ping", 4, UserData{}, &t).ok());
  ASSERT_TRUE(cl->submit(t).ok());
  ASSERT_TRUE(pump_until([&] { return ev_.received.size() == 1; }));

  ASSERT_TRUE(signal_child(server, SIGKILL));
  reap_child(server, nullptr);
  children_.clear();
  close(out);
  ASSERT_TRUE(pump_until([&] { return cl->state() == CtxState::kIdle; }));
  ASSERT_EQ(ev_.disconnected.size(), 1u);
  EXPECT_EQ(cl->last_error(), Code::kConnectionReset);

  // Start again with no server: stays STARTING, then connects when one appears.
  ASSERT_EQ(cl->start(), Code::kInProgress);
  for (int i = 0; i < 20; ++i) pe_->progress();
  EXPECT_EQ(cl->state(), CtxState::kStarting);
  server = spawn_peer({"server", path}, true, &out);
  children_.push_back(server);
  ASSERT_GT(read(out, line, sizeof(line)), 0);
  close(out);
  ASSERT_TRUE(pump_until([&] { return cl->state() == CtxState::kRunning; }));
  ASSERT_TRUE(cl->send_alloc_init(cl->connection(), "pong", 4, UserData{}, &t).ok());
  ASSERT_TRUE(cl->submit(t).ok());
  ASSERT_TRUE(pump_until([&] { return ev_.received.size() == 2; }));
  EXPECT_EQ(ev_.received[1], "pong");
  ASSERT_TRUE(cl->stop().ok());
}

TEST_F(ComchTest, ConnectTimeoutReturnsToIdle) {
  ComchClientOptions o;
  o.path = unique_path("nobody");
  o.connect_timeout_ms = 100;
  std::unique_ptr<ComchClient> cl;
  ASSERT_TRUE(ComchClient::create(pe_.get(), o, &cl).ok());
  ASSERT_EQ(cl->start(), Code::kInProgress);
  ASSERT_TRUE(pump_until([&] { return cl->state() == CtxState::kIdle; }, 3000));
  EXPECT_EQ(cl->last_error(), Code::kNotFound);
}

TEST_F(ComchTest, SilentPeersTimeOut) {
  ComchServerOptions o;
  o.heartbeat_interval_ms = 50;
  o.heartbeat_misses = 3;
  o.hello_timeout_ms = 200;
  start_server(o);
  pid_t silent = peer({"abuse", path_, "silent"});   // HELLO, then nothing
  pid_t slow = peer({"abuse", path_, "slowloris"});  // never HELLO
  EXPECT_EQ(wait_child(silent), 0);
  EXPECT_EQ(wait_child(slow), 0);
  EXPECT_GE(srv_->counters().heartbeat_timeouts, 2u);
  ASSERT_EQ(ev_.disconnected.size(), 1u);  // only the one that completed HELLO was "connected"
  EXPECT_EQ(ev_.disconnected[0].second, Code::kTimeout);
}

TEST_F(ComchTest, BackpressureIsAgainNotUnboundedBuffering) {
  const std::string path = unique_path("stall");
  int out = -1;
  pid_t server = spawn_peer({"stalled-server", path}, true, &out);
  children_.push_back(server);
  char line[16] = {};
  ASSERT_GT(read(out, line, sizeof(line)), 0);
  close(out);
  ComchClientOptions o;
  o.path = path;
  o.send_queue_depth = 8;
  o.heartbeat_interval_ms = 60000;
  std::unique_ptr<ComchClient> cl;
  ASSERT_TRUE(ComchClient::create(pe_.get(), o, &cl).ok());
  UserData ud;
  ud.ptr = &ev_;
  ev_.ch = cl.get();
  ASSERT_TRUE(cl->set_user_data(ud).ok());
  ASSERT_TRUE(cl->set_callbacks(callbacks()).ok());
  ASSERT_TRUE(cl->set_send_conf(64).ok());
  ASSERT_EQ(cl->start(), Code::kInProgress);
  ASSERT_TRUE(pump_until([&] { return cl->state() == CtxState::kRunning; }));
  std::string big(4000, 'b');
  int sent = 0;
  Status st;
  for (int i = 0; i < 100000; ++i) {
    ComchSendTask* t;
    st = cl->send_alloc_init(cl->connection(), big.data(), 4000, UserData{}, &t);
    if (st == Code::kNoMemory) {
      pe_->progress();
      continue;
    }
    ASSERT_TRUE(st.ok());
    st = cl->submit(t);
    if (st == Code::kAgain) {
      (void)cl->free(t);
      break;
    }
    ASSERT_TRUE(st.ok());
    ++sent;
    pe_->progress();
  }
  EXPECT_EQ(st, Code::kAgain);
  // The socket buffer took some, the queue holds at most 8: bounded.
  EXPECT_GT(sent, 8);
  EXPECT_LT(sent, 2000);
  // Killing the stalled server fails the queued sends with CONNECTION_RESET.
  ASSERT_TRUE(signal_child(server, SIGKILL));
  ASSERT_TRUE(pump_until([&] { return cl->state() == CtxState::kIdle; }));
}

TEST_F(ComchTest, MisbehavingClientsCannotHurtTheServerOrAGoodClient) {
  ComchServerOptions o;
  o.hello_timeout_ms = 300;
  o.max_imports_per_connection = 4;
  ev_.echo = true;
  start_server(o);
  const int fds_before = count_fds();
  pid_t good = peer({"echo", path_, "300"});  // ~0.3 s+ of steady traffic
  std::vector<pid_t> bad;
  for (const char* kind : {"garbage", "short", "lying-length", "oversize", "bad-seq",
                           "data-before-hello", "fd-flood", "bad-export", "slowloris"}) {
    for (int i = 0; i < 3; ++i) bad.push_back(peer({"abuse", path_, kind}));
  }
  for (pid_t p : bad) EXPECT_EQ(wait_child(p), 0) << "an abusive client was not disconnected";
  EXPECT_EQ(wait_child(good), 0) << "the good client was disturbed";
  EXPECT_GE(srv_->counters().protocol_errors, 8u * 3);
  ASSERT_TRUE(pump_until([&] { return srv_->num_connections() == 0; }));
  pe_->progress();
  EXPECT_EQ(count_fds(), fds_before) << "descriptors leaked";
}

TEST_F(ComchTest, FastPathRoundTripsWithImmediateData) {
  start_server(ComchServerOptions{});
  pid_t pid = peer({"fastpath-echo", path_, "200"});
  ASSERT_TRUE(pump_until([&] { return !ev_.consumers.empty(); }));
  ComchConnection* c = ev_.connected[0];
  // The server's own consumer, for the echoes.
  std::unique_ptr<MemRegion> mem;
  std::unique_ptr<Mmap> map;
  std::unique_ptr<BufInventory> inv;
  ASSERT_TRUE(MemRegion::create(4 << 20, MemRegionOptions{}, &mem).ok());
  ASSERT_TRUE(Mmap::create(mem->data(), mem->size(), kAccessLocalReadWrite | kAccessExportReadWrite,
                           mem->fd(), 0, &map)
                  .ok());
  ASSERT_TRUE(map->start().ok());
  ASSERT_TRUE(BufInventory::create(64, &inv).ok());
  FastPathConsumer* fc;
  ASSERT_TRUE(srv_->create_consumer(c, map.get(), 16, &fc).ok());
  for (int i = 0; i < 16; ++i) {
    Buf* b;
    ASSERT_TRUE(inv->get_by_addr(map.get(), map->addr() + i * 65536, 65536, &b).ok());
    ASSERT_TRUE(fc->post_recv(b, UserData{}).ok());
  }
  EXPECT_EQ(fc->post_recv(nullptr, UserData{}), Code::kInvalidValue);
  uint8_t* out = map->addr() + (2 << 20);
  for (int i = 0; i < 200; ++i) {
    size_t len = static_cast<size_t>(i * 311 % 65536);
    for (size_t k = 0; k < len; ++k) out[k] = static_cast<uint8_t>(k + i);
    Buf* b;
    ASSERT_TRUE(inv->get_by_data(map.get(), out, len ? len : 1, &b).ok());
    if (len == 0) {
      ASSERT_TRUE(b->set_data_len(0).ok());
    }
    std::string imm = "seq=" + std::to_string(i);
    Status st;
    while ((st = srv_->producer_send(c, ev_.consumers[0], b, imm.data(),
                                     static_cast<uint32_t>(imm.size()))) == Code::kAgain)
      pe_->progress();
    ASSERT_TRUE(st.ok()) << st.name();
    ASSERT_TRUE(b->dec_refcount().ok());
    ASSERT_TRUE(pump_until([&] { return ev_.fp.size() == static_cast<size_t>(i + 1); }));
    ASSERT_EQ(ev_.fp.back().second, imm);
    ASSERT_EQ(ev_.fp.back().first.size(), len);
    for (size_t k = 0; k < len; ++k)
      ASSERT_EQ(static_cast<uint8_t>(ev_.fp.back().first[k]), static_cast<uint8_t>(k + i));
  }
  // Too much immediate data, or a larger message than the posted buffers.
  Buf* b;
  ASSERT_TRUE(inv->get_by_data(map.get(), out, 65537, &b).ok());
  EXPECT_EQ(srv_->producer_send(c, ev_.consumers[0], b, nullptr, 0), Code::kTooBig);
  EXPECT_EQ(srv_->producer_send(c, ev_.consumers[0], b, out, kMaxImmData + 1), Code::kTooBig);
  EXPECT_EQ(srv_->producer_send(c, 999, b, nullptr, 0), Code::kNotFound);
  ASSERT_TRUE(b->dec_refcount().ok());
  EXPECT_GT(srv_->counters().fp_received, 0u);
  ASSERT_TRUE(srv_->destroy_consumer(fc).ok());  // flushes the 16 posted buffers
  EXPECT_EQ(inv->num_free(), inv->capacity());
  srv_->disconnect(c);
  EXPECT_EQ(wait_child(pid), 0);
  ASSERT_TRUE(map->stop().ok());
}

}  // namespace
}  // namespace dpukv
