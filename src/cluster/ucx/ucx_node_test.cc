// Two cluster nodes over UCX in one process (each on its own progress engine, as
// two agents would be): one-sided reads of the other's exposed region, byte for
// byte; ranges outside the region refused; control messages with the sender
// known; malformed descriptions refused; a peer killed (a child process) fails
// reads with CONNECTION_RESET, and the survivor keeps serving others.
#include "cluster/ucx/ucx_node.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/child_process.h"
#include "runtime/log.h"

namespace dpukv {
namespace {

struct Node {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<UcxNode> ucx;
  std::vector<uint8_t> region;
  std::string blob;
  explicit Node(size_t bytes, uint8_t seed) : region(bytes) {
    for (size_t i = 0; i < bytes; ++i) region[i] = static_cast<uint8_t>(i * 131 + seed + (i >> 12));
    EXPECT_TRUE(ProgressEngine::create(&pe).ok());
    EXPECT_TRUE(UcxNode::create(pe.get(), UcxNodeOptions{}, &ucx).ok());
    EXPECT_TRUE(ucx->expose(region.data(), region.size()).ok());
    EXPECT_TRUE(ucx->start().ok());
    EXPECT_TRUE(ucx->description(&blob).ok());
  }
  ~Node() {
    (void)ucx->stop();
    for (int i = 0; i < 100000 && ucx->state() != CtxState::kIdle; ++i) pe->progress();
  }
};

// Progresses both engines until done() or 10 s.
template <typename F>
bool until(Node& a, Node& b, F done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < end) {
    a.pe->progress();
    b.pe->progress();
  }
  return done();
}

struct ReadResult {
  bool done = false;
  Status st;
  static void cb(void* arg, Status st) {
    auto* r = static_cast<ReadResult*>(arg);
    r->done = true;
    r->st = st;
  }
};

TEST(UcxNode, ReadsThePeersRegionByteForByte) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  Node a(1 << 20, 1), b(48 << 20, 2);
  uint32_t pb;
  ASSERT_TRUE(
      a.ucx->connect(reinterpret_cast<const uint8_t*>(b.blob.data()), b.blob.size(), &pb).ok());
  struct Case {
    uint64_t off, len;
  };
  std::vector<uint8_t> dst(33 << 20);
  for (Case c :
       {Case{0, 1}, Case{4095, 4097}, Case{(48 << 20) - 4096, 4096}, Case{12345, 32 << 20}}) {
    std::memset(dst.data(), 0, c.len);
    ReadResult r;
    ASSERT_TRUE(a.ucx->read(pb, c.off, dst.data(), c.len, &ReadResult::cb, &r).ok());
    ASSERT_TRUE(until(a, b, [&] { return r.done; })) << c.off;
    ASSERT_TRUE(r.st.ok()) << r.st.name();
    EXPECT_EQ(std::memcmp(dst.data(), b.region.data() + c.off, c.len), 0) << c.off << " " << c.len;
  }
  EXPECT_EQ(a.ucx->counters().reads, 4u);
  // Outside the region the peer described: refused before anything moves.
  ReadResult r;
  EXPECT_EQ(a.ucx->read(pb, (48 << 20) - 10, dst.data(), 11, &ReadResult::cb, &r).code(),
            Code::kInvalidValue);
  EXPECT_EQ(a.ucx->read(pb, UINT64_MAX, dst.data(), 2, &ReadResult::cb, &r).code(),
            Code::kInvalidValue);
  EXPECT_EQ(a.ucx->read(pb + 7, 0, dst.data(), 1, &ReadResult::cb, &r).code(), Code::kNotFound);
  EXPECT_FALSE(r.done);
}

TEST(UcxNode, ControlMessagesNameTheirSender) {
  Node a(1 << 16, 1), b(1 << 16, 2);
  uint32_t pb, pa;
  ASSERT_TRUE(
      a.ucx->connect(reinterpret_cast<const uint8_t*>(b.blob.data()), b.blob.size(), &pb).ok());
  ASSERT_TRUE(
      b.ucx->connect(reinterpret_cast<const uint8_t*>(a.blob.data()), a.blob.size(), &pa).ok());
  struct Got {
    uint32_t peer = 99;
    uint64_t sender = 0;
    std::string msg;
  } got;
  b.ucx->set_control_handler(
      [](void* arg, uint64_t sender, uint32_t peer, const uint8_t* m, size_t n) {
        auto* g = static_cast<Got*>(arg);
        g->peer = peer;
        g->sender = sender;
        g->msg.assign(reinterpret_cast<const char*>(m), n);
      },
      &got);
  ASSERT_TRUE(a.ucx->send_control(pb, "pin 42", 6).ok());
  ASSERT_TRUE(until(a, b, [&] { return !got.msg.empty(); }));
  EXPECT_EQ(got.msg, "pin 42");
  EXPECT_EQ(got.peer, pa);
  EXPECT_EQ(got.sender, a.ucx->node_id());
  std::string big(UcxNode::kMaxControl + 1, 'x');
  EXPECT_EQ(a.ucx->send_control(pb, big.data(), big.size()).code(), Code::kInvalidValue);
}

// Once reads and messages are done, both engines go quiet: a progress pass finds no
// work, which is what lets an agent sleep in epoll. UCX's event fd used to read as
// ready on every pass until the worker was armed (only before a sleep), so an agent
// with a live peer never slept and spun a core.
TEST(UcxNode, NodesWithLivePeersGoQuietWhenIdle) {
  Node a(1 << 20, 1), b(1 << 20, 2);
  uint32_t pb, pa;
  ASSERT_TRUE(
      a.ucx->connect(reinterpret_cast<const uint8_t*>(b.blob.data()), b.blob.size(), &pb).ok());
  ASSERT_TRUE(
      b.ucx->connect(reinterpret_cast<const uint8_t*>(a.blob.data()), a.blob.size(), &pa).ok());
  int got = 0;
  b.ucx->set_control_handler(
      [](void* arg, uint64_t, uint32_t, const uint8_t*, size_t) { ++*static_cast<int*>(arg); },
      &got);
  std::vector<uint8_t> dst(1 << 20);
  for (int round = 0; round < 3; ++round) {
    ReadResult r;
    ASSERT_TRUE(a.ucx->read(pb, 0, dst.data(), dst.size(), &ReadResult::cb, &r).ok());
    ASSERT_TRUE(a.ucx->send_control(pb, "x", 1).ok());
    ASSERT_TRUE(until(a, b, [&] { return r.done && got == round + 1; }));
    ASSERT_TRUE(r.st.ok());
  }
  // A run of 1000 passes on both engines with no work, within 10 s (UCX's own
  // timers may wake it now and then, but not on every pass).
  int quiet = 0;
  ASSERT_TRUE(until(a, b, [&] {
    const bool busy = a.pe->progress() | b.pe->progress();
    quiet = busy ? 0 : quiet + 1;
    return quiet >= 1000;
  })) << "the engines found work on every pass: an idle agent would spin";
  // And a wait sleeps until its timeout rather than returning with work: one of a
  // few does (a UCX timer may wake one now and then; a spinning engine wakes them all).
  auto sleeps = [](ProgressEngine* pe) {
    for (int i = 0; i < 5; ++i)
      if (!pe->wait(0, 20)) return true;
    return false;
  };
  EXPECT_TRUE(sleeps(a.pe.get()));
  EXPECT_TRUE(sleeps(b.pe.get()));
}

TEST(UcxNode, MalformedDescriptionsAreRefused) {
  Node a(1 << 16, 1), b(1 << 16, 2);
  uint32_t p;
  std::string blob = b.blob;
  const auto* d = reinterpret_cast<const uint8_t*>(blob.data());
  EXPECT_EQ(a.ucx->connect(d, blob.size() - 1, &p).code(), Code::kInvalidValue);  // truncated
  EXPECT_EQ(a.ucx->connect(d, 10, &p).code(), Code::kInvalidValue);
  std::string bad = blob;
  bad[0] ^= 1;  // magic
  EXPECT_EQ(a.ucx->connect(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), &p).code(),
            Code::kInvalidValue);
  bad = blob;
  std::memset(&bad[24], 0, 8);  // an empty region
  EXPECT_EQ(a.ucx->connect(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), &p).code(),
            Code::kInvalidValue);
  // Its own description: refused.
  EXPECT_EQ(
      a.ucx->connect(reinterpret_cast<const uint8_t*>(a.blob.data()), a.blob.size(), &p).code(),
      Code::kInvalidValue);
  EXPECT_TRUE(a.ucx->connect(d, blob.size(), &p).ok());
}

// A peer in a child process dies (kill -9): reads from it fail, reads from a live
// peer go on. TCP is chosen for the child's link so that the death is seen at once
// (shared-memory transports notice only by keepalive).
TEST(UcxNode, AKilledPeerFailsItsReadsAndOthersAreServed) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("UCX_TLS", "tcp", 1);
    Node c(8 << 20, 3);
    uint32_t n = static_cast<uint32_t>(c.blob.size());
    (void)!write(pipefd[1], &n, 4);
    (void)!write(pipefd[1], c.blob.data(), n);
    for (;;) c.pe->progress();
  }
  close(pipefd[1]);
  uint32_t n = 0;
  ASSERT_EQ(read(pipefd[0], &n, 4), 4);
  std::string cblob(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(pipefd[0], &cblob[got], n - got);
    ASSERT_GT(k, 0);
    got += static_cast<size_t>(k);
  }
  close(pipefd[0]);
  setenv("UCX_TLS", "tcp", 1);
  {
    Node a(1 << 16, 1), b(1 << 20, 2);
    uint32_t pc, pb;
    ASSERT_TRUE(
        a.ucx->connect(reinterpret_cast<const uint8_t*>(cblob.data()), cblob.size(), &pc).ok());
    ASSERT_TRUE(
        a.ucx->connect(reinterpret_cast<const uint8_t*>(b.blob.data()), b.blob.size(), &pb).ok());
    std::vector<uint8_t> dst(8 << 20);
    ReadResult r;
    ASSERT_TRUE(a.ucx->read(pc, 0, dst.data(), 4096, &ReadResult::cb, &r).ok());
    ASSERT_TRUE(until(a, b, [&] { return r.done; }));
    ASSERT_TRUE(r.st.ok());
    ASSERT_TRUE(signal_child(child, SIGKILL));
    ASSERT_TRUE(reap_child(child, nullptr));
    // Reads until the failure is seen: then CONNECTION_RESET, at once or completed.
    Status last;
    for (int i = 0; i < 100 && a.ucx->peer_ok(pc); ++i) {
      ReadResult k;
      Status st = a.ucx->read(pc, 0, dst.data(), 8 << 20, &ReadResult::cb, &k);
      if (!st.ok()) {
        last = st;
        break;
      }
      until(a, b, [&] { return k.done; });
      last = k.st;
      if (!last.ok()) break;
    }
    EXPECT_EQ(last.code(), Code::kConnectionReset);
    EXPECT_FALSE(a.ucx->peer_ok(pc));
    EXPECT_GE(a.ucx->counters().peers_failed, 1u);
    // The other peer is still served.
    ReadResult ok;
    ASSERT_TRUE(a.ucx->read(pb, 100, dst.data(), 4096, &ReadResult::cb, &ok).ok());
    ASSERT_TRUE(until(a, b, [&] { return ok.done; }));
    EXPECT_TRUE(ok.st.ok());
    EXPECT_EQ(std::memcmp(dst.data(), b.region.data() + 100, 4096), 0);
  }
  unsetenv("UCX_TLS");
}

}  // namespace
}  // namespace dpukv
