// The remote tier alone: two caches, each with a Directory and a RemoteTier, and
// a real redis-server the test starts. What one uploads the other ingests, byte
// for byte; a value that is cut short, names another key, or fails its checksum
// is refused and counted, and the keys after it are not taken; an arrival is not
// uploaded again.
#include "cluster/remote_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
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

constexpr size_t kChunk = 64 << 10;

struct Side {
  CacheHarness h{small_memory(16, 1 << 20)};
  std::unique_ptr<Directory> dir;
  std::unique_ptr<RemoteTier> tier;
  Side(uint16_t port, uint64_t node_id) {
    DirectoryOptions o;
    o.port = port;
    o.prefix = "dpukv-tier-test-" + std::to_string(getpid());
    o.node_id = node_id;
    o.description = "x";
    EXPECT_TRUE(Directory::create(h.pe_.get(), o, &dir).ok());
    EXPECT_TRUE(dir->start().ok());
    tier = std::make_unique<RemoteTier>(h.cache_.get(), dir.get());
  }
  ~Side() {
    tier->stop();
    (void)dir->stop();
    while (dir->state() != CtxState::kIdle) h.pe_->progress();
  }
  // Progresses until done() or 10 s.
  bool until(const std::function<bool()>& done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < end) {
      if (done()) return true;
      if (h.pe_->progress() + tier->poll() == 0) usleep(100);
    }
    return done();
  }
  struct Got {
    bool done = false;
    std::vector<uint8_t> got;
    static void cb(void* arg, const uint8_t* got, uint32_t n) {
      auto* g = static_cast<Got*>(arg);
      g->got.assign(got, got + n);
      g->done = true;
    }
  };
  // The tier's answer for keys ids.
  std::vector<uint8_t> get(const std::vector<uint64_t>& ids) {
    std::vector<ChunkKey> ks;
    for (uint64_t id : ids) ks.push_back(key(id));
    Got g;
    EXPECT_TRUE(tier->get(ks, &Got::cb, &g).ok());
    EXPECT_TRUE(until([&] { return g.done; }));
    return g.got;
  }
  // Writes value under key id's Redis key and waits until Redis has it.
  void put_raw(uint64_t id, std::string value) {
    const uint64_t before = dir->counters().values_put;
    dir->put_value(key(id), std::move(value));
    EXPECT_TRUE(until([&] { return dir->counters().values_put > before; }));
  }
};

TEST(RemoteTier, WhatOneSideUploadsTheOtherIngestsByteForByte) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Side a(redis.port(), 1), b(redis.port(), 2);
  ASSERT_TRUE(a.until([&] { return a.dir->connected(); }));
  ASSERT_TRUE(b.until([&] { return b.dir->connected(); }));
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(a.h.store(key(id), kChunk).ok());
    a.tier->on_present(key(id));
  }
  ASSERT_TRUE(a.until([&] { return a.dir->counters().values_put == 3; }));
  EXPECT_EQ(a.tier->counters().puts, 3u);

  // Leading keys only: key 9 is nowhere, so key 3 after it is not taken.
  EXPECT_EQ(b.get({1, 2, 9, 3}), (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_TRUE(b.h.retrieve(key(1), kChunk).ok());
  EXPECT_TRUE(b.h.retrieve(key(2), kChunk).ok());
  EXPECT_FALSE(b.h.cache_->contains(key(3)));
  EXPECT_EQ(b.tier->counters().hits, 2u);
  EXPECT_EQ(b.tier->counters().bytes, 2 * kChunk);
  // A key already here counts as got, and is not ingested twice.
  EXPECT_EQ(b.get({1, 3}), (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(b.tier->counters().hits, 3u);

  // The arrivals are not written back when the cache announces them.
  for (uint64_t id : {1, 2, 3}) b.tier->on_present(key(id));
  EXPECT_EQ(b.tier->poll(), 0u);
  EXPECT_EQ(b.tier->counters().puts, 0u);
  // A chunk stored here is.
  ASSERT_TRUE(b.h.store(key(4), kChunk).ok());
  b.tier->on_present(key(4));
  EXPECT_EQ(b.tier->poll(), 1u);
  EXPECT_EQ(b.tier->counters().puts, 1u);
}

TEST(RemoteTier, ValuesThatAreNotTheChunkAreRefusedAndNothingIsKept) {
  Redis redis;
  ASSERT_TRUE(redis.running()) << "no redis-server (scripts/deps.sh --test installs it)";
  Side a(redis.port(), 1), b(redis.port(), 2);
  ASSERT_TRUE(a.until([&] { return a.dir->connected(); }));
  ASSERT_TRUE(b.until([&] { return b.dir->connected(); }));
  ASSERT_TRUE(a.h.store(key(1), kChunk).ok());
  a.tier->on_present(key(1));
  ASSERT_TRUE(a.until([&] { return a.dir->counters().values_put == 1; }));
  // Key 1's real value, to cut and copy.
  struct Raw {
    bool done = false;
    std::string value;
    static void cb(void* arg, Status st, const std::vector<std::string>& values) {
      auto* r = static_cast<Raw*>(arg);
      if (st.ok() && values.size() == 1) r->value = values[0];
      r->done = true;
    }
  } raw;
  const ChunkKey k1 = key(1);
  ASSERT_TRUE(a.dir->get_values(&k1, 1, &Raw::cb, &raw).ok());
  ASSERT_TRUE(a.until([&] { return raw.done; }));
  ASSERT_EQ(raw.value.size(), sizeof(TierValue) + kChunk);

  struct Case {
    uint64_t id;
    std::string value;
    const char* what;
  };
  std::string bad_sum = raw.value;
  bad_sum.back() ^= 1;  // one bit of the bytes
  TierValue h;
  std::memcpy(&h, raw.value.data(), sizeof(h));
  h.key = key(13);
  h.magic = 0x54564b44;  // "DKVT": the first layout
  std::string old_layout(reinterpret_cast<const char*>(&h), sizeof(h));
  old_layout += raw.value.substr(sizeof(h));
  const Case cases[] = {
      {10, raw.value.substr(0, sizeof(TierValue) - 1), "shorter than its header"},
      {11, raw.value.substr(0, raw.value.size() - 1), "a byte short of its length"},
      {12, raw.value, "key 1's value under key 12"},
      {13, old_layout, "the first layout"},
      {1, bad_sum, "bytes that fail their checksum"},
  };
  uint64_t rejects = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    a.put_raw(c.id, c.value);
    // The refused key, then a good one after it: neither is taken.
    EXPECT_EQ(b.get({c.id, 1}), (std::vector<uint8_t>{0, 0}));
    EXPECT_EQ(b.tier->counters().rejects, ++rejects);
    EXPECT_FALSE(b.h.cache_->contains(key(c.id)));
    EXPECT_EQ(b.h.cache_->stats().ingests, 0u);
  }
  EXPECT_EQ(b.tier->counters().hits, 0u);
}

}  // namespace
}  // namespace dpukv
