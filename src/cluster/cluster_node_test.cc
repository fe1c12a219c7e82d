// Agents sharing chunks: two caches, each with its ClusterNode, and a real
// redis-server the test starts. A chunk stored on one is found through the
// directory by the other, read one-sided into its arena, checked and served;
// a stale directory entry, a corrupted holder copy, a holder killed with -9 (a
// child process), Redis killed, and a peer sending garbage are all misses or
// counted refusals, never wrong bytes, and the node goes on serving.
#include "cluster/cluster_node.h"
#include "cluster/lent_pins.h"

#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "testing/cache_test_harness.h"
#include "testing/redis_test_server.h"

namespace dpukv {
namespace {

using cache_test::CacheHarness;
using cache_test::key;
using cache_test::small_memory;

constexpr size_t kChunk = 256 << 10;

// Taken once, before any fork: a holder in a child process shares the prefix.
const std::string& test_prefix() {
  static const std::string p = "dpukv-cluster-test-" + std::to_string(getpid());
  return p;
}

struct Agent {
  CacheHarness h{small_memory(16, 1 << 20)};
  std::unique_ptr<ClusterNode> node;
  explicit Agent(uint16_t redis_port, uint32_t timeout_ms = 2000, bool remote_tier = false) {
    ClusterOptions o;
    o.remote_tier = remote_tier;
    o.redis_port = redis_port;
    o.prefix = test_prefix();
    o.live_refresh_ms = 20;
    o.retry_ms = 50;
    o.request_timeout_ms = timeout_ms;
    o.lend_timeout_ms = 300;
    o.forget_peer_ms = 200;
    EXPECT_TRUE(ClusterNode::create(h.pe_.get(), h.cache_.get(), o, &node).ok());
    EXPECT_TRUE(node->start().ok());
  }
  ~Agent() {
    (void)node->stop();
    while (node->state() != CtxState::kIdle) h.pe_->progress();
  }
};

// Progresses every engine until done() or 10 s.
bool until(const std::vector<ProgressEngine*>& pes, const std::function<bool()>& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    bool any = false;
    for (ProgressEngine* pe : pes) any |= pe->progress() != 0;
    if (!any) usleep(100);
  }
  return done();
}

// A directory client of the test's own (another writer in the cluster's Redis) on
// an engine of its own; stopped when it goes.
struct RawDirectory {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<Directory> dir;
  explicit RawDirectory(uint16_t port) : port_(port) {
    EXPECT_TRUE(ProgressEngine::create(&pe).ok());
  }
  // Joins as node_id with this description; true once connected.
  bool join(uint64_t node_id, std::string description) {
    DirectoryOptions o;
    o.port = port_;
    o.prefix = test_prefix();
    o.node_id = node_id;
    o.description = std::move(description);
    return Directory::create(pe.get(), o, &dir).ok() && dir->start().ok() &&
           until({pe.get()}, [&] { return dir->connected(); });
  }
  void serve(int ms) {
    for (int i = 0; i < ms; ++i) pe->progress(), usleep(1000);
  }
  ~RawDirectory() {
    if (!dir) return;
    (void)dir->stop();
    while (dir->state() != CtxState::kIdle) pe->progress();
  }

 private:
  uint16_t port_;
};

// A UCX node of the test's own that joins the cluster and connects to another node
// (found through the directory), to send control messages by hand; counts the
// messages it receives.
struct HandPeer {
  RawDirectory rd;
  std::vector<uint8_t> region = std::vector<uint8_t>(4096);
  std::unique_ptr<UcxNode> node;
  uint32_t peer = UcxNode::kUnknownPeer;
  int received = 0;
  explicit HandPeer(uint16_t port) : rd(port) {}
  // True once connected to node `to`; progresses `others` meanwhile.
  bool connect_to(uint64_t to, std::vector<ProgressEngine*> others) {
    std::string blob;
    if (!UcxNode::create(rd.pe.get(), UcxNodeOptions{}, &node).ok() ||
        !node->expose(region.data(), region.size()).ok())
      return false;
    node->set_control_handler(
        [](void* arg, uint64_t, uint32_t, const uint8_t*, size_t) { ++*static_cast<int*>(arg); },
        &received);
    if (!node->start().ok() || !node->description(&blob).ok() || !rd.join(node->node_id(), blob))
      return false;
    std::pair<bool, std::string> found;
    if (!rd.dir
             ->find_node(
                 to,
                 [](void* arg, Status st, const std::string& d) {
                   auto* f = static_cast<std::pair<bool, std::string>*>(arg);
                   f->first = st.ok();
                   f->second = d;
                 },
                 &found)
             .ok())
      return false;
    others.push_back(rd.pe.get());
    return until(others, [&] { return found.first; }) &&
           node->connect(reinterpret_cast<const uint8_t*>(found.second.data()), found.second.size(),
                         &peer)
               .ok();
  }
  ~HandPeer() {
    if (!node) return;
    (void)node->stop();
    while (node->state() != CtxState::kIdle) rd.pe->progress();
  }
};

// Flips a bit of h's copy of k in its arena (after its own checksum was taken).
void corrupt_copy(CacheHarness& h, const ChunkKey& k) {
  ChunkPlacement p;
  ASSERT_TRUE(h.cache_->locate(k, &p).ok());
  h.cache_->unpin(&k, 1);
  void* base;
  uint64_t len;
  h.cache_->arena(&base, &len);
  static_cast<uint8_t*>(base)[p.offset + 1000] ^= 0x40;
}

struct FetchResult {
  bool done = false;
  uint32_t fetched = 0;
  static void cb(void* arg, uint32_t n) {
    auto* r = static_cast<FetchResult*>(arg);
    r->done = true;
    r->fetched = n;
  }
};

// Fetches keys first..first+n-1 into b, progressing a too; the leading count.
uint32_t fetch(Agent& b, const std::vector<ProgressEngine*>& pes, uint64_t first, uint32_t n) {
  std::vector<ChunkKey> ks;
  for (uint32_t i = 0; i < n; ++i) ks.push_back(key(first + i));
  FetchResult r;
  const Status st = b.node->fetch(ks.data(), n, &FetchResult::cb, &r);
  if (!st.ok()) {
    ADD_FAILURE() << "fetch: " << st.name();
    return 0;
  }
  EXPECT_TRUE(until(pes, [&] { return r.done; }));
  return r.fetched;
}

// The holder's directory entries are published within a progress round or two and
// the reader sees the holder live after live_refresh_ms: wait for a first hit from
// the holder. With the remote tier on, a fetch made before b sees the holder is
// served by the tier: that copy is dropped and the wait goes on, so that b has
// read from (and holds a link to) the holder when this returns true.
bool wait_published(Agent& b, const std::vector<ProgressEngine*>& pes, uint64_t k) {
  const ChunkKey ck = key(k);
  return until(pes, [&] {
    const uint64_t tier_hits = b.node->counters().tier_hits;
    FetchResult r;
    if (!b.node->fetch(&ck, 1, &FetchResult::cb, &r).ok()) return false;
    (void)until(pes, [&] { return r.done; });
    if (r.fetched == 1 && b.node->counters().tier_hits != tier_hits) {
      EXPECT_TRUE(b.h.cache_->remove(ck).ok());
      return false;
    }
    return r.fetched == 1;
  });
}

TEST(ClusterNode, RemoteChunksAreReadIntoTheLocalCacheCheckedAndServed) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent a(redis.port()), b(redis.port());
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
  for (uint64_t k = 1; k <= 6; ++k) ASSERT_TRUE(a.h.store(key(k), kChunk).ok());
  ASSERT_TRUE(wait_published(b, pes, 1));
  // Keys 2..6 are on a, 7 nowhere: five leading keys come over.
  EXPECT_EQ(fetch(b, pes, 2, 6), 5u);
  for (uint64_t k = 1; k <= 6; ++k) EXPECT_TRUE(b.h.retrieve(key(k), kChunk).ok()) << k;
  const ClusterNode::Counters cb = b.node->counters();
  EXPECT_EQ(cb.remote_hits, 6u);
  EXPECT_EQ(cb.remote_bytes, 6 * kChunk);
  EXPECT_EQ(a.node->counters().served_chunks, 6u);
  EXPECT_EQ(b.h.cache_->stats().ingests, 6u);
  // Per peer: b fetched from a, a served b.
  const auto pb = b.node->peer_stats();
  ASSERT_EQ(pb.size(), 1u);
  EXPECT_EQ(pb[0].node, a.node->node_id());
  EXPECT_EQ(pb[0].fetched, 6u);
  // a's pins were released by b's UNPIN: its chunks can be removed.
  EXPECT_TRUE(until(pes, [&] { return a.h.cache_->remove(key(6)).ok(); }));
  // Present on b already: counted as fetched, nothing asked or read again.
  EXPECT_EQ(fetch(b, pes, 1, 5), 5u);
  EXPECT_EQ(b.node->counters().remote_hits, 6u);
  EXPECT_EQ(a.node->counters().served_requests, 2u);
}

struct PushResult {
  bool done = false;
  Status st;
  std::vector<uint8_t> taken;
  static void cb(void* arg, Status st, const uint8_t* taken, uint32_t n) {
    auto* r = static_cast<PushResult*>(arg);
    r->done = true;
    r->st = st;
    r->taken.assign(taken, taken + n);
  }
};

TEST(ClusterNode, PushedChunksAreInTheDestinationBeforeItAsks) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent a(redis.port()), b(redis.port(), 500);
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(a.h.store(key(k), kChunk).ok());
  ASSERT_TRUE(wait_published(b, pes, 1));  // both in the directory (b read key 1 from a)
  const ChunkKey k1 = key(1);
  ASSERT_TRUE(b.h.cache_->remove(k1).ok());
  // Keys 1..4 are on a, 9 is not: four taken, one not found.
  std::vector<ChunkKey> ks = {key(1), key(2), key(3), key(4), key(9)};
  const uint64_t fetches = b.node->counters().fetches;
  PushResult r;
  ASSERT_TRUE(a.node->push(b.node->node_id(), ks.data(), 5, &PushResult::cb, &r).ok());
  ASSERT_TRUE(until(pes, [&] { return r.done; }));
  EXPECT_TRUE(r.st.ok()) << r.st.name();
  EXPECT_EQ(r.taken, (std::vector<uint8_t>{0, 0, 0, 0, static_cast<uint8_t>(Code::kNotFound)}));
  // b holds them without having looked anything up.
  EXPECT_EQ(b.node->counters().fetches, fetches);
  for (uint64_t k = 1; k <= 4; ++k) EXPECT_TRUE(b.h.retrieve(key(k), kChunk).ok()) << k;
  EXPECT_EQ(a.node->counters().pushed_chunks, 4u);
  EXPECT_EQ(b.node->counters().offered_chunks, 4u);
  // To itself, to too many keys: refused at once. To a node nobody knows: a
  // CONNECTION_RESET answer, not a hang.
  EXPECT_EQ(a.node->push(a.node->node_id(), ks.data(), 1, &PushResult::cb, &r),
            Code::kInvalidValue);
  std::vector<ChunkKey> many(peer::kMaxKeys + 1, key(1));
  EXPECT_EQ(a.node->push(b.node->node_id(), many.data(), static_cast<uint32_t>(many.size()),
                         &PushResult::cb, &r),
            Code::kInvalidValue);
  PushResult nowhere;
  ASSERT_TRUE(a.node->push(0x1234, ks.data(), 1, &PushResult::cb, &nowhere).ok());
  ASSERT_TRUE(until(pes, [&] { return nowhere.done; }));
  EXPECT_EQ(nowhere.st, Code::kConnectionReset);
}

TEST(ClusterNode, TheRemoteTierServesChunksNoLiveAgentHolds) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent b(redis.port(), 2000, true);
  {
    Agent a(redis.port(), 2000, true);
    const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
    ASSERT_TRUE(until(pes, [&] { return a.node->directory_connected(); }));
    for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(a.h.store(key(k), kChunk).ok());
    // values_put counts the SETs Redis accepted: the values are there.
    ASSERT_TRUE(until(pes, [&] { return a.node->directory_counters().values_put == 3; }));
  }  // a leaves the cluster: no live agent holds keys 1..3
  const std::vector<ProgressEngine*> pes = {b.h.pe_.get()};
  ASSERT_TRUE(until(pes, [&] { return b.node->directory_live_nodes() == 1; }));  // a is gone
  EXPECT_EQ(fetch(b, pes, 1, 4), 3u);                                            // key 4 is nowhere
  for (uint64_t k = 1; k <= 3; ++k) EXPECT_TRUE(b.h.retrieve(key(k), kChunk).ok()) << k;
  EXPECT_EQ(b.node->counters().tier_hits, 3u);
  EXPECT_EQ(b.node->counters().tier_bytes, 3 * kChunk);
  for (int i = 0; i < 20; ++i) b.h.pe_->progress();
  EXPECT_EQ(b.node->counters().tier_puts, 0u);  // copies are not written back
  // A value that is not the chunk (a checksum of other bytes): refused, nothing kept.
  RawDirectory w(redis.port());
  ASSERT_TRUE(w.join(0x77, "x"));
  const TierValue forged{kTierMagic, 0, {}, 4096, 4096, 12345, key(9)};
  std::string v(reinterpret_cast<const char*>(&forged), sizeof(forged));
  v.append(4096, '\x5a');
  w.dir->put_value(key(9), v);
  // Key 1's value, bytes and checksum intact, copied onto key 5 (anyone who can
  // write to the Redis can): refused as not key 5's, never served as key 5.
  struct Got {
    bool done = false;
    std::string value;
    static void cb(void* arg, Status st, const std::vector<std::string>& values) {
      auto* g = static_cast<Got*>(arg);
      if (st.ok() && values.size() == 1) g->value = values[0];
      g->done = true;
    }
  } got;
  const ChunkKey k1 = key(1);
  ASSERT_TRUE(w.dir->get_values(&k1, 1, &Got::cb, &got).ok());
  ASSERT_TRUE(until({w.pe.get()}, [&] { return got.done; }));
  ASSERT_EQ(got.value.size(), sizeof(TierValue) + kChunk);
  w.dir->put_value(key(5), got.value);
  ASSERT_TRUE(until({w.pe.get()}, [&] { return w.dir->counters().values_put == 2; }));
  w.serve(50);
  EXPECT_TRUE(b.h.cache_->remove(key(1)).ok());
  EXPECT_EQ(fetch(b, pes, 9, 1), 0u);
  EXPECT_EQ(b.node->counters().tier_rejects, 1u);
  EXPECT_FALSE(b.h.cache_->contains(key(9)));
  EXPECT_EQ(fetch(b, pes, 5, 1), 0u);
  EXPECT_EQ(b.node->counters().tier_rejects, 2u);
  EXPECT_FALSE(b.h.cache_->contains(key(5)));
  EXPECT_EQ(fetch(b, pes, 1, 1), 1u);  // the original is still good
  EXPECT_TRUE(b.h.retrieve(key(1), kChunk).ok());
}

// With the remote tier on, a key whose listed holder fails it (a stale entry, a
// copy that fails its checksum) is looked for in the tier before it is a miss.
TEST(ClusterNode, AKeyWhoseListedHolderFailsComesFromTheRemoteTier) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent a(redis.port(), 2000, true), b(redis.port(), 2000, true);
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
  ASSERT_TRUE(until(pes, [&] { return a.node->directory_connected(); }));
  for (uint64_t k : {1, 2, 60}) ASSERT_TRUE(a.h.store(key(k), kChunk).ok());
  ASSERT_TRUE(until(pes, [&] { return a.node->directory_counters().values_put == 3; }));
  ASSERT_TRUE(wait_published(b, pes, 1));
  const uint64_t hits = b.node->counters().tier_hits;  // tier copies wait_published dropped
  // Key 60 leaves a (its tier value stays); a liar lists a as its holder again.
  // Joining as a replaces a's description in the directory: b asks a over the link
  // wait_published made, not over one resolved from the liar's entry.
  const ChunkKey k60 = key(60);
  ASSERT_TRUE(a.h.cache_->remove(k60).ok());
  ASSERT_TRUE(until(pes, [&] { return a.node->directory_counters().unpublished >= 1; }));
  for (int i = 0; i < 20; ++i) a.h.pe_->progress(), usleep(1000);
  RawDirectory liar(redis.port());
  ASSERT_TRUE(liar.join(a.node->node_id(), "unused"));
  liar.dir->add(k60);
  liar.serve(50);
  EXPECT_EQ(fetch(b, pes, 60, 1), 1u);
  const ClusterNode::Counters bc = b.node->counters();
  EXPECT_EQ(bc.stale, 1u) << "timeouts " << bc.timeouts << ", read errors " << bc.read_errors
                          << ", peers failed " << bc.peers_failed << ", tier hits " << bc.tier_hits
                          << ", remote hits " << bc.remote_hits;
  EXPECT_EQ(b.node->counters().tier_fallbacks, 1u);
  EXPECT_EQ(b.node->counters().tier_hits - hits, 1u);
  EXPECT_TRUE(b.h.retrieve(k60, kChunk).ok());
  // a's copy of key 2 goes bad in its arena: b refuses it and takes the tier's.
  const ChunkKey k2 = key(2);
  corrupt_copy(a.h, k2);
  EXPECT_EQ(fetch(b, pes, 2, 1), 1u);
  EXPECT_EQ(b.node->counters().checksum_failures, 1u);
  EXPECT_EQ(b.node->counters().tier_fallbacks, 2u);
  EXPECT_EQ(b.node->counters().tier_hits - hits, 2u);
  EXPECT_TRUE(b.h.retrieve(k2, kChunk).ok());  // checks every byte
  // A key nobody holds and the tier lacks: asked of the tier once, no fallback.
  EXPECT_EQ(fetch(b, pes, 70, 1), 0u);
  EXPECT_EQ(b.node->counters().tier_fallbacks, 2u);
}

TEST(ClusterNode, StaleEntriesAndCorruptCopiesAreMissesNeverWrongBytes) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent a(redis.port()), b(redis.port());
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
  ASSERT_TRUE(a.h.store(key(1), kChunk).ok());
  ASSERT_TRUE(a.h.store(key(2), kChunk).ok());
  ASSERT_TRUE(wait_published(b, pes, 1));
  // A stale entry: the directory says a holds key 50, a does not. (The liar is not
  // stopped until the end: stopping takes a's node out of the live set.)
  RawDirectory liar(redis.port());
  ASSERT_TRUE(liar.join(a.node->node_id(), "unused"));
  liar.dir->add(key(50));
  liar.serve(50);
  EXPECT_EQ(fetch(b, pes, 50, 1), 0u);
  EXPECT_EQ(b.node->counters().stale, 1u);
  EXPECT_FALSE(b.h.cache_->contains(key(50)));
  // a's copy of key 2 goes bad in its arena (after its own checksum was taken).
  corrupt_copy(a.h, key(2));
  EXPECT_EQ(fetch(b, pes, 2, 1), 0u);
  EXPECT_EQ(b.node->counters().checksum_failures, 1u);
  EXPECT_FALSE(b.h.cache_->contains(key(2)));
  EXPECT_EQ(b.h.cache_->stats().chunks, 1u);  // key 1 only: the bad copy left nothing
}

TEST(ClusterNode, RedisAwayFetchFailsAtOnceAndComesBackWithIt) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent a(redis.port()), b(redis.port());
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
  ASSERT_TRUE(a.h.store(key(1), kChunk).ok());
  ASSERT_TRUE(wait_published(b, pes, 1));
  redis.stop();
  const ChunkKey k = key(2);
  FetchResult r;
  ASSERT_TRUE(until(pes, [&] { return !b.node->directory_connected(); }));
  EXPECT_EQ(b.node->fetch(&k, 1, &FetchResult::cb, &r), Code::kConnectionReset);
  EXPECT_GE(b.node->counters().directory_unreachable, 1u);
  ASSERT_TRUE(a.h.store(key(2), kChunk).ok());  // a goes on; published when Redis is back
  ASSERT_TRUE(redis.start());
  const bool published = wait_published(b, pes, 2);
  const Directory::Counters da = a.node->directory_counters();
  const Directory::Counters db = b.node->directory_counters();
  ASSERT_TRUE(published) << "a: connects " << da.connects << " published " << da.published
                         << " errors " << da.errors << "; b: connects " << db.connects
                         << " lookups " << db.lookups << " hits " << db.lookup_hits << " errors "
                         << db.errors << " stale " << b.node->counters().stale << " read errors "
                         << b.node->counters().read_errors << " timeouts "
                         << b.node->counters().timeouts;
  EXPECT_TRUE(b.h.retrieve(key(2), kChunk).ok());
}

TEST(ClusterNode, AHolderKilledMidWayIsAMissAndOthersAreStillServed) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  (void)test_prefix();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {                    // the holder: stores 8 chunks and serves until killed
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a failed test
    close(ready[0]);
    Agent c(redis.port());
    for (uint64_t k = 100; k < 108; ++k)
      if (!c.h.store(key(k), kChunk).ok()) _exit(1);
    for (int i = 0; i < 100; ++i) c.h.pe_->progress(), usleep(1000);
    (void)!write(ready[1], "r", 1);
    for (;;)
      if (!c.h.pe_->progress()) usleep(100);
  }
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      (void)signal_child(pid, SIGKILL);
      (void)reap_child(pid, nullptr);
    }
  } reaper{child};
  close(ready[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  Agent a(redis.port()), b(redis.port(), 500);
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
  ASSERT_TRUE(a.h.store(key(1), kChunk).ok());
  ASSERT_TRUE(wait_published(b, pes, 100))  // read from the child
      << "lookups " << b.node->directory_counters().lookups << " hits "
      << b.node->directory_counters().lookup_hits << " stale " << b.node->counters().stale
      << " timeouts " << b.node->counters().timeouts << " read errors "
      << b.node->counters().read_errors << " peers failed " << b.node->counters().peers_failed;
  EXPECT_TRUE(b.h.retrieve(key(100), kChunk).ok());
  (void)signal_child(child, SIGKILL);
  // Its chunks are still listed (its lease has not run out): misses, quickly.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(fetch(b, pes, 101, 3), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  const ClusterNode::Counters cb = b.node->counters();
  EXPECT_GE(cb.read_errors + cb.timeouts, 1u);
  EXPECT_FALSE(b.h.cache_->contains(key(101)));
  // a is served as before (once a's answer is in b's 500 ms: on a busy machine a
  // first ask can time out and a is then skipped for retry_ms).
  EXPECT_TRUE(until(pes, [&] { return fetch(b, pes, 1, 1) == 1; }));
  EXPECT_TRUE(b.h.retrieve(key(1), kChunk).ok());
}

// The lend ledger alone: pins go back to their reader's UNPIN of their request
// (not another reader's, not another request's), when the same request is lent
// again, when the lend times out, or all at once at the end.
TEST(LentPins, PinsGoBackOnlyToTheirReaderAndRequestOrTheirDeadline) {
  CacheHarness h{small_memory(16, 1 << 20)};
  const ChunkKey k1 = key(1), k2 = key(2), k3 = key(3);
  for (const ChunkKey& k : {k1, k2, k3}) ASSERT_TRUE(h.store(k, kChunk).ok());
  auto pin = [&](const ChunkKey& k) {
    ChunkPlacement p;
    return h.cache_->locate(k, &p).ok();  // a located chunk stays pinned
  };
  auto pinned = [&](const ChunkKey& k) {  // a pinned chunk cannot be removed
    return h.cache_->remove(k) == Code::kBadState;
  };
  {
    LentPins lent(h.cache_.get(), 300);
    ASSERT_TRUE(pin(k1) && pin(k2));
    lent.lend(7, 9, {k1, k2}, 1000);
    EXPECT_TRUE(lent.lends_to(7));
    EXPECT_FALSE(lent.lends_to(8));
    EXPECT_FALSE(lent.give_back(8, 9));   // another reader
    EXPECT_FALSE(lent.give_back(7, 10));  // another request
    EXPECT_TRUE(pinned(k1) && pinned(k2));
    ASSERT_TRUE(pin(k3));
    lent.lend(7, 9, {k3}, 1000);  // the same request again: k1 and k2 go back
    EXPECT_TRUE(h.cache_->remove(k1).ok());
    EXPECT_TRUE(h.cache_->remove(k2).ok());
    EXPECT_TRUE(pinned(k3));
    EXPECT_EQ(lent.expire(1299), 0u);  // not yet
    EXPECT_EQ(lent.expire(1300), 1u);  // k3's lend timed out
    EXPECT_TRUE(lent.empty());
    EXPECT_FALSE(lent.give_back(7, 9));  // each pin goes back once
    ASSERT_TRUE(h.store(k1, kChunk).ok());
    ASSERT_TRUE(pin(k1));
    lent.lend(5, 1, {k1}, 2000);
    EXPECT_TRUE(pinned(k1));
  }  // the ledger goes: what it lent goes back
  EXPECT_TRUE(h.cache_->remove(k1).ok());
}

// Pins a holder takes for a reader's PIN are released only by that reader's UNPIN
// of that request, or when the lend times out (a reader that died or never read):
// an UNPIN for another request releases nothing, so no peer can unpin chunks that
// another reader is reading.
TEST(ClusterNode, LentPinsGoBackOnlyToTheirReaderOrAfterTheLendTimeout) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent a(redis.port()), b(redis.port());
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
  ASSERT_TRUE(a.h.store(key(1), kChunk).ok());
  ASSERT_TRUE(a.h.store(key(2), kChunk).ok());
  ASSERT_TRUE(a.h.store(key(3), kChunk).ok());
  ASSERT_TRUE(wait_published(b, pes, 1));  // b read key 1 and unpinned it
  EXPECT_TRUE(until(pes, [&] { return a.h.cache_->remove(key(1)).ok(); }));
  // A reader of the test's own asks for keys 2 and 3 and never unpins them.
  HandPeer r(redis.port());
  ASSERT_TRUE(r.connect_to(a.node->node_id(), pes));
  const std::vector<ProgressEngine*> all = {a.h.pe_.get(), b.h.pe_.get(), r.rd.pe.get()};
  const ChunkKey k2 = key(2), k3 = key(3);
  std::vector<uint8_t> pin(peer::message_bytes(peer::Type::kPin, 2));
  peer::write_header(peer::Type::kPin, 9, 2, pin.data());
  std::memcpy(pin.data() + sizeof(peer::Header), &k2, sizeof(k2));
  std::memcpy(pin.data() + sizeof(peer::Header) + sizeof(k2), &k3, sizeof(k3));
  ASSERT_TRUE(r.node->send_control(r.peer, pin.data(), pin.size()).ok());
  ASSERT_TRUE(until(all, [&] { return r.received == 1; }));  // PLACED: both pinned for r
  EXPECT_EQ(a.h.cache_->remove(k2), Code::kBadState);
  // An UNPIN naming the keys but another request: nothing released, counted.
  std::vector<uint8_t> unpin(peer::message_bytes(peer::Type::kUnpin, 2));
  peer::write_header(peer::Type::kUnpin, 10, 2, unpin.data());
  std::memcpy(unpin.data() + sizeof(peer::Header), pin.data() + sizeof(peer::Header),
              2 * sizeof(ChunkKey));
  const uint64_t bad = a.node->counters().bad_messages;
  ASSERT_TRUE(r.node->send_control(r.peer, unpin.data(), unpin.size()).ok());
  ASSERT_TRUE(until(all, [&] { return a.node->counters().bad_messages == bad + 1; }));
  EXPECT_EQ(a.h.cache_->remove(k2), Code::kBadState);
  EXPECT_EQ(a.h.cache_->remove(k3), Code::kBadState);
  // The lend times out (the agent's default is 16 s; 300 ms here): both go back.
  EXPECT_EQ(a.node->counters().pins_expired, 0u);
  ASSERT_TRUE(until(all, [&] { return a.node->counters().pins_expired == 2; }));
  EXPECT_TRUE(a.h.cache_->remove(k2).ok());
  EXPECT_TRUE(a.h.cache_->remove(k3).ok());
}

TEST(ClusterNode, APeerSendingGarbageIsCountedAndOthersAreServed) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent a(redis.port()), b(redis.port());
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
  ASSERT_TRUE(a.h.store(key(1), kChunk).ok());
  ASSERT_TRUE(a.h.store(key(2), kChunk).ok());
  ASSERT_TRUE(wait_published(b, pes, 1));
  // A rogue UCX node that learns a's address from the directory.
  HandPeer rogue(redis.port());
  ASSERT_TRUE(rogue.connect_to(a.node->node_id(), pes));
  const std::vector<ProgressEngine*> all = {a.h.pe_.get(), b.h.pe_.get(), rogue.rd.pe.get()};
  // Garbage, a truncated PIN, a PIN claiming 1000 keys, a PLACED nobody asked for.
  std::vector<uint8_t> pin(peer::message_bytes(peer::Type::kPin, 1));
  peer::write_header(peer::Type::kPin, 7, 1, pin.data());
  std::vector<uint8_t> huge = pin;
  peer::write_header(peer::Type::kPin, 7, 1000, huge.data());
  std::vector<uint8_t> placed(peer::message_bytes(peer::Type::kPlaced, 1));
  peer::write_header(peer::Type::kPlaced, 7, 1, placed.data());
  ASSERT_TRUE(rogue.node->send_control(rogue.peer, "garbage!", 8).ok());
  ASSERT_TRUE(rogue.node->send_control(rogue.peer, pin.data(), pin.size() - 1).ok());
  ASSERT_TRUE(rogue.node->send_control(rogue.peer, huge.data(), huge.size()).ok());
  ASSERT_TRUE(rogue.node->send_control(rogue.peer, placed.data(), placed.size()).ok());
  ASSERT_TRUE(until(all, [&] { return a.node->counters().bad_messages >= 4; }));
  EXPECT_EQ(a.node->counters().bad_messages, 4u);
  // a serves b as before.
  EXPECT_EQ(fetch(b, pes, 2, 1), 1u);
  EXPECT_TRUE(b.h.retrieve(key(2), kChunk).ok());
}

// Redis refusing writes (maxmemory with noeviction): a remote-tier value is counted
// as put only when Redis accepted it; the others are counted as failures (they were
// once all counted as written, with nothing in Redis and nothing said).
TEST(ClusterNode, RemoteTierWritesRedisRefusesAreCountedAsFailures) {
  Redis redis(Redis::kAnyPort, {"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"});
  ASSERT_TRUE(redis.running());
  Agent a(redis.port(), 2000, true);
  const std::vector<ProgressEngine*> pes = {a.h.pe_.get()};
  ASSERT_TRUE(until(pes, [&] { return a.node->directory_connected(); }));
  for (uint64_t k = 1; k <= 16; ++k) ASSERT_TRUE(a.h.store(key(k), kChunk).ok());
  Directory::Counters d;  // a snapshot: read again on each try
  ASSERT_TRUE(until(pes,
                    [&] {
                      d = a.node->directory_counters();
                      return d.values_put + d.value_put_failures == 16;
                    }))
      << d.values_put << " put, " << d.value_put_failures << " failed";
  EXPECT_GE(d.value_put_failures, 1u);  // 16 x 256 KiB do not fit in 3 MB
  EXPECT_LT(d.values_put, 16u);
  EXPECT_EQ(d.value_bytes_put, d.values_put * (kChunk + 64));
}

// A peer that leaves the cluster (a restart takes a new node id) is forgotten
// once its lease is gone and nothing is in flight to it: peer_stats() and the
// per-peer metrics do not grow with every restart.
TEST(ClusterNode, PeersThatLeftTheClusterAreForgotten) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Agent b(redis.port());
  for (int round = 0; round < 3; ++round) {
    Agent a(redis.port());
    const std::vector<ProgressEngine*> pes = {a.h.pe_.get(), b.h.pe_.get()};
    ASSERT_TRUE(a.h.store(key(100 + round), kChunk).ok());
    ASSERT_TRUE(wait_published(b, pes, 100 + round));
    const auto peers = b.node->peer_stats();
    EXPECT_TRUE(std::any_of(peers.begin(), peers.end(),
                            [&](const auto& p) { return p.node == a.node->node_id(); }));
  }  // a leaves: its node id goes from the live set at once
  const std::vector<ProgressEngine*> pes = {b.h.pe_.get()};
  ASSERT_TRUE(until(pes, [&] { return b.node->peer_stats().empty(); }));
  EXPECT_EQ(b.node->counters().peers_forgotten, 3u);
}

}  // namespace
}  // namespace dpukv
