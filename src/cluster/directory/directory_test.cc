// The Redis directory against a real redis-server that the test starts (Debian's
// redis-server): publish, look up (one round trip, live holders only), remove; a
// dead node's entries age out with its lease; Redis stopped: lookups fail at once
// and the agent goes on; Redis back: the node reconnects and publishes again
// everything it holds.
#include "cluster/directory/directory.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

#include "cluster/directory/directory_replica.h"
#include "runtime/log.h"
#include "testing/redis_test_server.h"

namespace dpukv {
namespace {

struct Node {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<Directory> dir;
  Node(uint16_t port, uint64_t id, uint32_t lease_ms = 5000, bool replicate = true,
       std::string user = "", std::string password = "") {
    DirectoryOptions o;
    o.user = std::move(user);
    o.password = std::move(password);
    o.replicate = replicate;
    o.port = port;
    o.node_id = id;
    o.description = "desc-of-" + std::to_string(id);
    o.lease_ms = lease_ms;
    o.retry_ms = 50;
    o.live_refresh_ms = 20;
    o.prefix = "dpukv-test-" + std::to_string(getpid());
    EXPECT_TRUE(ProgressEngine::create(&pe).ok());
    EXPECT_TRUE(Directory::create(pe.get(), o, &dir).ok());
    EXPECT_TRUE(dir->start().ok());
  }
  ~Node() {
    (void)dir->stop();
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (dir->state() != CtxState::kIdle && std::chrono::steady_clock::now() < end)
      if (!pe->progress()) usleep(100);
  }
};

template <typename F>
bool serve(std::vector<Node*> nodes, F done, int ms = 5000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!done() && std::chrono::steady_clock::now() < end)
    for (Node* n : nodes)
      if (!n->pe->progress()) usleep(100);
  return done();
}

ChunkKey key(uint64_t i) {
  return key_from_block_id(KeyContext{7, 1, 0, 3}, i);
}

struct Answer {
  bool done = false;
  Status st;
  std::vector<std::vector<uint64_t>> holders;
  static void cb(void* arg, Status st, const std::vector<std::vector<uint64_t>>& h) {
    auto* a = static_cast<Answer*>(arg);
    a->done = true;
    a->st = st;
    a->holders = h;
  }
};

// Looks up keys from node n, serving every node until the answer comes.
Answer ask(std::vector<Node*> all, Node& n, std::vector<ChunkKey> keys) {
  Answer a;
  Status st = n.dir->lookup(keys.data(), static_cast<uint32_t>(keys.size()), &Answer::cb, &a);
  if (!st.ok()) {
    a.st = st;
    return a;
  }
  EXPECT_TRUE(serve(all, [&] { return a.done; }));
  return a;
}

// The same answers whether b asks Redis (one MGET) or its replica.
void publish_lookup_remove_and_age_out(bool replicate) {
  log_set_level(LogSource::kLib, LogLevel::kDisable);
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  const uint16_t port = redis.port();
  ASSERT_TRUE(redis.running()) << "redis-server could not be started";
  Node a(port, 0xa1, 300, replicate), b(port, 0xb2, 5000, replicate);
  ASSERT_TRUE(serve({&a, &b}, [&] {
    return a.dir->connected() && b.dir->connected() && b.dir->replica_ready() == replicate;
  }));
  a.dir->add(key(1));
  a.dir->add(key(2));
  b.dir->add(key(2));
  // Published on a following round: ask until a lookup sees them.
  Answer r;
  ASSERT_TRUE(serve(
      {&a, &b},
      [&] {
        r = ask({&a, &b}, b, {key(1), key(2), key(3)});
        return r.st.ok() && r.holders.size() == 3 && r.holders[0].size() == 1 &&
               r.holders[1].size() == 2;
      },
      60000))
      << r.st.name();
  EXPECT_EQ(r.holders[0], std::vector<uint64_t>{0xa1});
  std::sort(r.holders[1].begin(), r.holders[1].end());
  EXPECT_EQ(r.holders[1], (std::vector<uint64_t>{0xa1, 0xb2}));
  EXPECT_TRUE(r.holders[2].empty());
  // A node's description, for connecting to it.
  struct NodeAnswer {
    bool done = false;
    Status st;
    std::string desc;
  } na;
  ASSERT_TRUE(b.dir
                  ->find_node(
                      0xa1,
                      [](void* arg, Status st, const std::string& d) {
                        auto* x = static_cast<NodeAnswer*>(arg);
                        x->done = true;
                        x->st = st;
                        x->desc = d;
                      },
                      &na)
                  .ok());
  ASSERT_TRUE(serve({&a, &b}, [&] { return na.done; }));
  EXPECT_TRUE(na.st.ok());
  EXPECT_EQ(na.desc, "desc-of-161");
  // Removal.
  a.dir->remove(key(1));
  ASSERT_TRUE(serve(
      {&a, &b},
      [&] {
        r = ask({&a, &b}, b, {key(1)});
        return r.st.ok() && r.holders[0].empty();
      },
      60000));
  // a stops renewing its lease (its engine is no longer served: as if it hung or
  // died); after the lease its entries are not answered, and are deleted.
  ASSERT_TRUE(serve(
      {&b},
      [&] {
        r = ask({&b}, b, {key(2)});
        return r.st.ok() && r.holders[0] == std::vector<uint64_t>{0xb2};
      },
      60000));
  EXPECT_GE(b.dir->counters().stale_dropped, 1u);
  // a comes back: its renewed lease finds it out of the live set, so it publishes
  // again what it holds (others dropped it), and b sees it after a live refresh.
  ASSERT_TRUE(serve({&a, &b}, [&] { return a.dir->counters().rejoined == 1; }));
  ASSERT_TRUE(serve({&a, &b}, [&] {
    r = ask({&a, &b}, b, {key(2)});
    return r.st.ok() && r.holders[0].size() == 2;
  }));
  if (replicate)
    EXPECT_EQ(b.dir->counters().lookups_local, b.dir->counters().lookups);
  else
    EXPECT_EQ(b.dir->counters().lookups_local, 0u);
}

TEST(Directory, PublishLookupRemoveAndDeadNodesAgeOut) {
  publish_lookup_remove_and_age_out(true);
}

TEST(Directory, PublishLookupRemoveAndDeadNodesAgeOutWithoutReplica) {
  publish_lookup_remove_and_age_out(false);
}

// A plain Redis client of the test's own.
struct RawRedis {
  redisContext* c = nullptr;
  explicit RawRedis(uint16_t port) : c(redisConnect("127.0.0.1", port)) {}
  ~RawRedis() {
    if (c != nullptr) redisFree(c);
  }
  long long integer(const std::vector<std::string>& argv) {
    std::vector<const char*> a;
    std::vector<size_t> l;
    for (const std::string& x : argv) {
      a.push_back(x.data());
      l.push_back(x.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(a.size()), a.data(), l.data()));
    const long long v = r != nullptr && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r != nullptr) freeReplyObject(r);
    return v;
  }
  // A string value, or "(none)".
  std::string get(const std::string& key) {
    auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", key.data(), key.size()));
    std::string v = r != nullptr && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len)
                                                                  : std::string("(none)");
    if (r != nullptr) freeReplyObject(r);
    return v;
  }
  bool set(const std::string& key, const std::string& value) {
    auto* r = static_cast<redisReply*>(
        redisCommand(c, "SET %b %b", key.data(), key.size(), value.data(), value.size()));
    const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (r != nullptr) freeReplyObject(r);
    return ok;
  }
};

// The Redis key of a chunk's holder list (docs/protocols.md).
std::string holders_key(const ChunkKey& k) {
  const uint64_t w[4] = {k.model, k.prefix_hash, (uint64_t{k.world_size} << 32) | k.rank, k.layout};
  return "dpukv-test-" + std::to_string(getpid()) +
         ":c:" + std::string(reinterpret_cast<const char*>(w), sizeof(w));
}

std::string hex16(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// b answers lookups from its replica once it has scanned the entries a published
// before b came; events keep it current; when its subscription is cut it asks
// Redis until it has scanned again (and the scan brings what it missed); a
// malformed event is counted and changes nothing.
TEST(Directory, TheReplicaAnswersWithoutARoundTripAndResyncsAfterItsFeedIsCut) {
  log_set_level(LogSource::kLib, LogLevel::kDisable);
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  const uint16_t port = redis.port();
  ASSERT_TRUE(redis.running());
  Node a(port, 0xa1);
  ASSERT_TRUE(serve({&a}, [&] { return a.dir->connected(); }));
  a.dir->add(key(1));
  serve(
      {&a}, [] { return false; }, 100);
  Node b(port, 0xb2);
  ASSERT_TRUE(serve({&a, &b}, [&] { return b.dir->replica_ready(); }));  // the scan found key 1
  a.dir->add(key(2));                                                    // an event
  ASSERT_TRUE(serve({&a, &b}, [&] { return b.dir->replica_keys() == 2; }));
  Answer r = ask({&a, &b}, b, {key(1), key(2), key(3)});
  ASSERT_TRUE(r.st.ok());
  EXPECT_EQ(r.holders[0], std::vector<uint64_t>{0xa1});
  EXPECT_EQ(r.holders[1], std::vector<uint64_t>{0xa1});
  EXPECT_TRUE(r.holders[2].empty());
  EXPECT_EQ(b.dir->counters().lookups_local, 1u);
  // Cut every subscription; key 3 is published while no one listens.
  RawRedis raw(port);
  ASSERT_GE(raw.integer({"CLIENT", "KILL", "TYPE", "pubsub"}), 1);
  a.dir->add(key(3));
  for (int i = 0; i < 50 && b.dir->replica_ready(); ++i)
    serve(
        {&a, &b}, [] { return false; }, 1);
  r = ask({&a, &b}, b, {key(3)});  // the replica is not ready yet: asked of Redis
  ASSERT_TRUE(r.st.ok());
  EXPECT_EQ(r.holders[0], std::vector<uint64_t>{0xa1});
  const uint64_t syncs = b.dir->counters().syncs;
  ASSERT_TRUE(serve({&a, &b}, [&] { return b.dir->counters().syncs > syncs; }));
  EXPECT_TRUE(b.dir->replica_ready());
  EXPECT_EQ(b.dir->replica_keys(), 3u);
  const uint64_t local = b.dir->counters().lookups_local;
  r = ask({&a, &b}, b, {key(3)});
  EXPECT_EQ(r.holders[0], std::vector<uint64_t>{0xa1});
  EXPECT_EQ(b.dir->counters().lookups_local, local + 1);
  // Garbage on the channel.
  ASSERT_GE(raw.integer({"PUBLISH", "dpukv-test-" + std::to_string(getpid()) + ":events",
                         std::string(56, '\x01')}),
            1);
  ASSERT_TRUE(serve({&a, &b}, [&] { return b.dir->counters().bad_events >= 1; }));
  EXPECT_EQ(b.dir->replica_keys(), 3u);
  EXPECT_TRUE(b.dir->replica_ready());
}

TEST(DirectoryReplica, HoldersAddDropBoundsAndOverflow) {
  DirectoryReplica rep(2);
  rep.add(key(1), 7);
  rep.add(key(1), 7);  // once
  rep.add(key(1), 8);
  std::vector<uint64_t> h;
  rep.find(key(1), &h);
  std::sort(h.begin(), h.end());
  EXPECT_EQ(h, (std::vector<uint64_t>{7, 8}));
  for (uint64_t n = 9; n < 20; ++n) rep.add(key(1), n);  // at most kMaxHolders kept
  h.clear();
  rep.find(key(1), &h);
  EXPECT_EQ(h.size(), DirectoryReplica::kMaxHolders);
  rep.drop(key(1), 7);
  rep.drop(key(1), 99);  // not a holder: nothing
  h.clear();
  rep.find(key(1), &h);
  EXPECT_EQ(h.size(), DirectoryReplica::kMaxHolders - 1);
  rep.add(key(2), 1);
  EXPECT_FALSE(rep.overflow());
  rep.add(key(3), 1);  // a third chunk in a replica of two
  EXPECT_TRUE(rep.overflow());
  EXPECT_EQ(rep.size(), 2u);
  rep.clear();
  EXPECT_EQ(rep.size(), 0u);
  EXPECT_FALSE(rep.overflow());
}

TEST(Directory, RedisAwayThenBackTheNodePublishesAgain) {
  log_set_level(LogSource::kLib, LogLevel::kDisable);
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  const uint16_t port = redis.port();
  ASSERT_TRUE(redis.running());
  Node a(port, 0xa1), b(port, 0xb2);
  ASSERT_TRUE(serve({&a, &b}, [&] { return a.dir->connected() && b.dir->connected(); }));
  a.dir->add(key(5));
  serve(
      {&a, &b}, [] { return false; }, 300);
  redis.stop();  // kill -9: every key is gone with it (no persistence)
  ASSERT_TRUE(serve({&a, &b}, [&] { return !a.dir->connected() && !b.dir->connected(); }));
  Answer r = ask({&a, &b}, b, {key(5)});
  EXPECT_EQ(r.st.code(), Code::kConnectionReset);  // at once: the agent serves locally
  EXPECT_GE(b.dir->counters().unreachable, 1u);
  a.dir->add(key(6));  // held while Redis is away
  ASSERT_TRUE(redis.start());
  ASSERT_TRUE(serve({&a, &b}, [&] { return a.dir->connected() && b.dir->connected(); }));
  serve(
      {&a, &b}, [] { return false; }, 300);
  r = ask({&a, &b}, b, {key(5), key(6)});
  ASSERT_TRUE(r.st.ok()) << r.st.name();
  EXPECT_EQ(r.holders[0], std::vector<uint64_t>{0xa1});
  EXPECT_EQ(r.holders[1], std::vector<uint64_t>{0xa1});
  EXPECT_GE(a.dir->counters().connects, 2u);
}

TEST(Directory, UnreachableAtStartIsRetriedNotFatal) {
  log_set_level(LogSource::kLib, LogLevel::kDisable);
  const uint16_t port = free_port();
  Node a(port, 0xa1);  // nothing listens yet
  serve(
      {&a}, [] { return false; }, 200);
  EXPECT_FALSE(a.dir->connected());
  EXPECT_GE(a.dir->counters().unreachable, 1u);
  Redis redis(port);
  ASSERT_TRUE(redis.running());
  EXPECT_TRUE(serve({&a}, [&] { return a.dir->connected(); }));
}

// A Redis that wants a password (requirepass, and an ACL user): nodes that give
// the right one work as ever; one with none or a wrong one never comes up, and is
// counted as unable to reach Redis (its log says Redis' words: NOAUTH, WRONGPASS).
TEST(Directory, UsesARedisWithAPasswordAndAnAclUser) {
  Redis redis(Redis::kAnyPort,
              {"--requirepass", "s3cret", "--user", "agent", "on", ">pw2", "~*", "&*", "+@all"});
  ASSERT_TRUE(redis.running());
  Node a(redis.port(), 1, 5000, true, "", "s3cret");  // the default user
  Node b(redis.port(), 2, 5000, true, "agent", "pw2");
  ASSERT_TRUE(serve(
      {&a, &b}, [&] { return a.dir->connected() && b.dir->connected(); }, 60000));
  a.dir->add(key(1));
  const ChunkKey k = key(1);
  ASSERT_TRUE(serve(
      {&a, &b},
      [&] {
        Answer ans;
        if (!b.dir->lookup(&k, 1, &Answer::cb, &ans).ok()) return false;
        (void)serve({&a, &b}, [&] { return ans.done; });
        return ans.st.ok() && ans.holders.size() == 1 && ans.holders[0].size() == 1;
      },
      60000));
  Node none(redis.port(), 3);
  Node wrong(redis.port(), 4, 5000, true, "agent", "nope");
  ASSERT_TRUE(serve(
      {&none, &wrong},
      [&] {
        return none.dir->counters().unreachable >= 2 && wrong.dir->counters().unreachable >= 2;
      },
      60000));
  EXPECT_FALSE(none.dir->connected());
  EXPECT_FALSE(wrong.dir->connected());
  EXPECT_EQ(none.dir->counters().connects, 0u);
  EXPECT_EQ(wrong.dir->counters().connects, 0u);
  // Issue 34.12: said in Redis' words (`dpukv stat` shows them), not only as away.
  EXPECT_NE(wrong.dir->down_reason().find("WRONGPASS"), std::string::npos)
      << wrong.dir->down_reason();
  EXPECT_NE(none.dir->down_reason().find("NOAUTH"), std::string::npos) << none.dir->down_reason();
  EXPECT_EQ(a.dir->down_reason(), "");
}

// Issue 34.11: `directory_published` counted edits sent, so with an ACL user that
// may not EVAL, `dpukv stat` said 3 published while Redis held none. Now it counts
// what Redis took, and a refused edit is counted as a failure.
TEST(Directory, EditsRedisRefusesAreCountedAsFailuresNotAsPublished) {
  log_set_level(LogSource::kLib, LogLevel::kDisable);
  Redis redis(Redis::kAnyPort,
              {"--user", "noeval", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha"});
  ASSERT_TRUE(redis.running());
  Node a(redis.port(), 1, 5000, false, "noeval", "pw");
  ASSERT_TRUE(serve(
      {&a}, [&] { return a.dir->connected(); }, 60000));
  for (uint64_t i = 1; i <= 3; ++i) a.dir->add(key(i));
  ASSERT_TRUE(serve(
      {&a}, [&] { return a.dir->counters().publish_failures >= 3; }, 60000));
  EXPECT_EQ(a.dir->counters().published, 0u);
  RawRedis raw(redis.port());
  for (uint64_t i = 1; i <= 3; ++i)
    EXPECT_EQ(raw.integer({"EXISTS", holders_key(key(i))}), 0) << "Redis holds entry " << i;
}

// Anyone who can write to the Redis can put anything under a chunk's key: a
// holder list of 50,000 entries (850 KB) once made an agent run one clean-up script
// per entry (30 s a lookup, and no stop). Now a list that is too long or malformed
// gives no holders, is counted and deleted in one script; a list with many dead
// and repeated holders costs one clean-up for the key and keeps the live ones.
void poisoned_values(bool replicate) {
  log_set_level(LogSource::kLib, LogLevel::kDisable);
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  const uint16_t port = redis.port();
  ASSERT_TRUE(redis.running());
  RawRedis raw(port);
  std::string huge = ",";
  for (uint64_t i = 0; i < 50000; ++i) huge += hex16(0x5000000 + i) + ",";
  ASSERT_EQ(huge.size(), 850001u);
  ASSERT_TRUE(raw.set(holders_key(key(1)), huge));
  ASSERT_TRUE(raw.set(holders_key(key(2)), ",zzzz,not a list"));
  Node a(port, 0xa1, 5000, replicate);
  ASSERT_TRUE(
      serve({&a}, [&] { return a.dir->connected() && a.dir->replica_ready() == replicate; }));
  a.dir->add(key(3));
  ASSERT_TRUE(serve({&a}, [&] { return raw.get(holders_key(key(3))) == "," + hex16(0xa1) + ","; }));
  // Key 3: a's entry among 200 entries of dead nodes, each listed twice.
  std::string many = ",";
  for (uint64_t i = 0; i < 100; ++i) many += hex16(0x7000 + i) + "," + hex16(0x7000 + i) + ",";
  many += hex16(0xa1) + ",";
  ASSERT_TRUE(raw.set(holders_key(key(3)), many));
  Node b(port, 0xb2, 5000, false);  // asks Redis
  ASSERT_TRUE(serve({&a, &b}, [&] { return b.dir->connected(); }));
  const auto t0 = std::chrono::steady_clock::now();
  Answer r = ask({&a, &b}, b, {key(1), key(2), key(3)});
  ASSERT_TRUE(r.st.ok()) << r.st.name();
  EXPECT_TRUE(r.holders[0].empty());
  EXPECT_TRUE(r.holders[1].empty());
  EXPECT_EQ(r.holders[2], std::vector<uint64_t>{0xa1});
  EXPECT_EQ(b.dir->counters().bad_entries, 2u);
  // Cleaned up once per key: the poisoned values deleted, key 3 down to its live holder.
  ASSERT_TRUE(serve({&a, &b}, [&] {
    return raw.get(holders_key(key(1))) == "(none)" && raw.get(holders_key(key(2))) == "(none)" &&
           raw.get(holders_key(key(3))) == "," + hex16(0xa1) + ",";
  }));
  // One lookup and its clean-up: well inside one lease, not one script per entry.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  r = ask({&a, &b}, b, {key(1), key(3)});
  ASSERT_TRUE(r.st.ok());
  EXPECT_EQ(r.holders[1], std::vector<uint64_t>{0xa1});
  if (replicate) {
    EXPECT_GE(a.dir->counters().bad_entries, 2u);  // its scan met them too
  }
}

TEST(Directory, APoisonedHolderListIsCountedAndDeletedInOneStep) {
  poisoned_values(true);
}

TEST(Directory, APoisonedHolderListIsCountedAndDeletedInOneStepWithoutReplica) {
  poisoned_values(false);
}

// Redis hangs (SIGSTOP: its connections stay open, nothing answers): a lookup is a
// miss after lookup_timeout_ms, not a wait as long as Redis hangs; later lookups
// fail at once while the node reconnects; stop() ends within stop_timeout_ms;
// and when Redis is back the node works again.
TEST(Directory, AHungRedisMakesLookupsMissSoonAndDoesNotHoldTheStop) {
  log_set_level(LogSource::kLib, LogLevel::kDisable);
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  const uint16_t port = redis.port();
  ASSERT_TRUE(redis.running());
  auto a = std::make_unique<Node>(port, 0xa1, 5000, false);
  ASSERT_TRUE(serve(
      {a.get()}, [&] { return a->dir->connected(); }, 60000));
  a->dir->add(key(1));
  ASSERT_TRUE(serve(
      {a.get()},
      [&] {
        Answer r = ask({a.get()}, *a, {key(1)});
        return r.st.ok() && r.holders[0].size() == 1;
      },
      60000));
  ASSERT_TRUE(redis.pause());
  Answer r;
  ASSERT_TRUE(a->dir->lookup(std::vector<ChunkKey>{key(1)}.data(), 1, &Answer::cb, &r).ok());
  ASSERT_TRUE(serve(
      {a.get()}, [&] { return r.done; }, 60000));
  EXPECT_EQ(r.st, Code::kTimeout);
  EXPECT_EQ(a->dir->counters().lookup_timeouts, 1u);
  EXPECT_FALSE(a->dir->connected());  // taken for hung: reconnecting
  r = ask({a.get()}, *a, {key(1)});
  EXPECT_EQ(r.st, Code::kConnectionReset);  // at once
  ASSERT_TRUE(redis.resume());
  ASSERT_TRUE(serve(
      {a.get()},
      [&] {
        Answer x = ask({a.get()}, *a, {key(1)});
        return x.st.ok() && x.holders[0].size() == 1;
      },
      60000));
  // Hung again, and the node is stopped: it leaves without Redis' answer.
  ASSERT_TRUE(redis.pause());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(a->dir->stop().ok() || a->dir->state() == CtxState::kStopping);
  ASSERT_TRUE(serve(
      {a.get()}, [&] { return a->dir->state() == CtxState::kIdle; }, 60000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));  // 1 s + scheduling
  a.reset();
  ASSERT_TRUE(redis.resume());
}

}  // namespace
}  // namespace dpukv
