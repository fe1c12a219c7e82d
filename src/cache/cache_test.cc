#include "cache/cache_engine.h"
#include "cache/eviction_policies.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/cache_test_trace.h"
#include "cache/chunk_index.h"
#include "cache/tier/slab_allocator.h"
#include "engines/compress/kv_synth.h"
#include "runtime/child_process.h"
#include "runtime/log.h"
#include "testing/cache_test_harness.h"

namespace dpukv {
namespace {

using namespace cache_test;

TEST(CacheEngine, StoreRetrieveLookupAndMisses) {
  CacheHarness h(small_memory(16, 1 << 20));
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(h.store(key(i), 1000 + i * 100000).ok());
  EXPECT_TRUE(h.store(key(3), 1000 + 3 * 100000).ok());  // existing key: a success
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(h.retrieve(key(i), 1000 + i * 100000).ok());
  EXPECT_EQ(h.retrieve(key(99), 10), Code::kNotFound);
  // Lookup counts the leading chunks present; a hole stops it.
  std::vector<ChunkKey> ks = {key(0), key(1), key(2), key(50), key(3)};
  EXPECT_EQ(h.cache_->lookup(ks.data(), 5, false), 3u);
  ASSERT_TRUE(h.cache_->remove(key(1)).ok());
  EXPECT_EQ(h.cache_->lookup(ks.data(), 5, false), 1u);
  EXPECT_FALSE(h.cache_->contains(key(1)));
  EXPECT_EQ(h.cache_->remove(key(1)), Code::kNotFound);
  EXPECT_EQ(h.cache_->store(key(200), nullptr, nullptr, nullptr), Code::kInvalidValue);
  // A destination smaller than the chunk.
  Buf* b;
  ASSERT_TRUE(h.inv_->get_by_addr(h.map_.get(), h.staging(), 100, &b).ok());
  Status st = Code::kInProgress;
  ASSERT_TRUE(h.cache_->retrieve(key(2), b, &CacheHarness::done, &st).ok());
  EXPECT_EQ(h.wait(&st), Code::kTooBig);
  (void)b->dec_refcount();
  const CacheStats s = h.cache_->stats();
  EXPECT_EQ(s.stores, 8u);
  EXPECT_GE(s.misses, 1u);
  EXPECT_GT(h.cache_->index_bytes_per_chunk(), 0u);
}

// Churn through far more keys than the index holds: deleted slots must not fill the
// hash table (a miss would then probe forever).
TEST(CacheEngine, IndexSurvivesChurnWithoutFillingWithTombstones) {
  CacheOptions o = small_memory(8, 64 << 10);
  o.max_chunks = 16;
  CacheHarness h(o);
  for (uint64_t i = 0; i < 5000; ++i) {
    ASSERT_TRUE(h.store(key(i), 4096).ok());
    if (i % 3 == 0) {
      ASSERT_TRUE(h.cache_->remove(key(i)).ok());
    }
  }
  EXPECT_FALSE(h.cache_->contains(key(999999)));
  EXPECT_TRUE(h.cache_->contains(key(4999)));
}

TEST(CacheEngine, LruEvictsLeastRecentlyUsedAndPinsHold) {
  CacheHarness h(small_memory(4, 1 << 20));
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(h.store(key(i), 1 << 20).ok());
  ASSERT_TRUE(h.retrieve(key(0), 1 << 20).ok());  // 0 is now the most recent; 1 the LRU
  ASSERT_TRUE(h.store(key(4), 1 << 20).ok());
  EXPECT_FALSE(h.cache_->contains(key(1)));
  EXPECT_TRUE(h.cache_->contains(key(0)));
  // Pin everything present: a new store cannot evict anything.
  std::vector<ChunkKey> present = {key(0), key(2), key(3), key(4)};
  ASSERT_EQ(h.cache_->lookup(present.data(), 4, true), 4u);
  EXPECT_EQ(h.store(key(5), 1 << 20), Code::kNoMemory);
  EXPECT_EQ(h.cache_->remove(key(2)), Code::kBadState);
  h.cache_->unpin(present.data(), 4);
  ASSERT_TRUE(h.store(key(5), 1 << 20).ok());
  EXPECT_EQ(h.cache_->stats().evictions, 2u);
}

// Random stores, retrieves and removes against a reference LRU model: capacity
// always holds, contents are always right, and membership matches the model.
TEST(CacheEngine, PropertyCapacityAndContentsMatchReferenceLru) {
  const uint64_t chunk = 256 << 10, slots = 12;
  CacheHarness h(small_memory(slots, chunk));
  std::list<uint64_t> lru;  // front = most recent
  std::mt19937_64 rng(17);
  for (int op = 0; op < 3000; ++op) {
    const uint64_t id = rng() % 40;
    const int kind = static_cast<int>(rng() % 10);
    auto it = std::find(lru.begin(), lru.end(), id);
    if (kind < 5) {
      ASSERT_TRUE(h.store(key(id), chunk).ok());
      if (it == lru.end()) {
        if (lru.size() == slots) lru.pop_back();
        lru.push_front(id);
      } else {
        lru.splice(lru.begin(), lru, it);  // storing an existing chunk refreshes it
      }
    } else if (kind < 9) {
      Status st = h.retrieve(key(id), chunk);
      ASSERT_EQ(st.ok(), it != lru.end()) << "op " << op;
      if (it != lru.end()) lru.splice(lru.begin(), lru, it);
    } else if (it != lru.end()) {
      ASSERT_TRUE(h.cache_->remove(key(id)).ok());
      lru.erase(it);
    }
    const CacheStats s = h.cache_->stats();
    ASSERT_LE(s.memory_used, s.memory_capacity);
    ASSERT_EQ(s.memory_chunks, lru.size());
  }
  for (uint64_t id : lru) EXPECT_TRUE(h.cache_->contains(key(id)));
}

// S3-FIFO against a direct implementation of the algorithm over the same operations.
struct RefS3Fifo {
  size_t slots, ghost_cap;
  std::list<uint64_t> small, main;                           // front = most recent
  std::unordered_map<uint64_t, std::pair<bool, int>> where;  // id -> (in small, freq)
  std::list<uint64_t> ghost;
  bool present(uint64_t id) const { return where.count(id) != 0; }
  void touch(uint64_t id) {
    auto& f = where[id].second;
    f = std::min(f + 1, 3);
  }
  void evict_one() {
    for (;;) {
      const bool from_small = !small.empty() && (small.size() * 10 > slots || main.empty());
      if (from_small) {
        uint64_t v = small.back();
        small.pop_back();
        if (where[v].second > 0) {
          where[v] = {false, 0};
          main.push_front(v);
          continue;
        }
        where.erase(v);
        ghost.push_front(v);
        if (ghost.size() > ghost_cap) ghost.pop_back();
        return;
      }
      uint64_t v = main.back();
      main.pop_back();
      if (where[v].second > 0) {
        --where[v].second;
        main.push_front(v);
        continue;
      }
      where.erase(v);
      return;
    }
  }
  void insert(uint64_t id) {
    while (small.size() + main.size() >= slots) evict_one();
    auto g = std::find(ghost.begin(), ghost.end(), id);
    if (g != ghost.end()) {
      ghost.erase(g);
      main.push_front(id);
      where[id] = {false, 0};
    } else {
      small.push_front(id);
      where[id] = {true, 0};
    }
  }
  void remove(uint64_t id) {
    if (where[id].first)
      small.remove(id);
    else
      main.remove(id);
    where.erase(id);
  }
};

// LRU and S3-FIFO, driven directly with the conversation trace's references (a
// miss inserts after the victim leaves; a hit is an access), keep what their
// reference models keep, at a capacity far below the working set.
TEST(EvictionPolicies, LruAndS3FifoMatchTheirModelsOnTheConversationTrace) {
  const std::vector<uint64_t> ids = conversation_trace_refs(1500);
  ASSERT_GT(ids.size(), 10000u);
  uint64_t max_id = 0;
  for (uint64_t id : ids) max_id = std::max(max_id, id);
  const size_t slots = 300;
  auto all = [](const void*, int32_t) { return true; };
  auto hash_of = [](uint64_t id) { return (id + 1) * 0x9E3779B97F4A7C15ull; };
  for (const char* name : {"lru", "s3fifo"}) {
    auto pol = std::string(name) == "lru"
                   ? make_lru_policy(static_cast<uint32_t>(max_id + 1))
                   : make_s3fifo_policy(static_cast<uint32_t>(max_id + 1), slots, 1024);
    std::list<uint64_t> lru;  // front = most recent
    RefS3Fifo s3{slots, 1024, {}, {}, {}, {}};
    std::unordered_set<uint64_t> cached;
    uint64_t hits = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t id = ids[i];
      const bool ref_has =
          name[0] == 'l' ? std::find(lru.begin(), lru.end(), id) != lru.end() : s3.present(id);
      ASSERT_EQ(cached.count(id) != 0, ref_has) << name << ", reference " << i;
      if (ref_has) {
        pol->access(static_cast<int32_t>(id));
        ++hits;
        if (name[0] == 'l')
          lru.splice(lru.begin(), lru, std::find(lru.begin(), lru.end(), id));
        else
          s3.touch(id);
        continue;
      }
      if (cached.size() >= slots) {
        const int32_t v = pol->victim(all, nullptr);
        ASSERT_GE(v, 0);
        pol->remove(v);
        cached.erase(static_cast<uint64_t>(v));
        if (name[0] == 'l') {
          ASSERT_EQ(static_cast<uint64_t>(v), lru.back()) << "reference " << i;
          lru.pop_back();
        }
      }
      pol->insert(static_cast<int32_t>(id), hash_of(id), 1);  // one byte a chunk: slots bytes
      cached.insert(id);
      if (name[0] == 'l')
        lru.push_front(id);
      else
        s3.insert(id);
    }
    EXPECT_GT(hits, 0u) << name;
  }
}

// S3-FIFO made from the policy table as the cache makes it, with chunks 1,024
// times below the largest allowed: its ghost list holds as many chunks as the tier
// (3,000), as the model's does. Sized by the largest chunk, it held 1,024.
TEST(EvictionPolicies, S3FifosGhostsFollowTheChunksHeldNotTheLargestAllowed) {
  const size_t slots = 3000;
  const uint64_t chunk = 64 << 10;
  const uint32_t max_id = 40000;
  auto pol = find_eviction_policy("s3fifo")->make({max_id, slots * chunk, 64ull << 20});
  RefS3Fifo s3{slots, slots, {}, {}, {}, {}};
  std::mt19937_64 rng(5);
  std::unordered_set<uint64_t> cached;
  auto all = [](const void*, int32_t) { return true; };
  uint64_t hits = 0;
  for (int i = 0; i < 60000; ++i) {
    const uint64_t r = rng() % 10;
    const uint64_t id = r < 3 ? rng() % 1500 : r < 7 ? 1500 + rng() % 6000 : 10000 + rng() % 30000;
    ASSERT_EQ(cached.count(id) != 0, s3.present(id)) << "reference " << i;
    if (s3.present(id)) {
      pol->access(static_cast<int32_t>(id));
      s3.touch(id);
      ++hits;
      continue;
    }
    if (cached.size() >= slots) {
      const int32_t v = pol->victim(all, nullptr);
      ASSERT_GE(v, 0);
      pol->remove(v);
      cached.erase(static_cast<uint64_t>(v));
    }
    pol->insert(static_cast<int32_t>(id), (id + 1) * 0x9E3779B97F4A7C15ull, chunk);
    cached.insert(id);
    s3.insert(id);
  }
  EXPECT_GT(hits, 0u);
}

// Every policy is a row of one table; the cache takes any row's name and refuses
// a name that is not one.
// A batch longer than the DMA engine's ring (the chunks of one long prompt) waits
// for ring slots instead of failing entries with AGAIN: every store and every
// retrieve of 64 chunks submitted at once through a ring of 2 succeeds, byte exact.
TEST(CacheEngine, ABatchLongerThanTheDmaRingWaitsForSlotsInsteadOfFailing) {
  const size_t len = 64 << 10;
  const uint64_t n = 64;
  CacheOptions o = small_memory(n * 2, len);
  o.dma.queue_depth = 2;
  CacheHarness h(o);
  for (const Status& st : h.store_batch(0, n, len)) ASSERT_TRUE(st.ok()) << st.name();
  std::vector<Status> st(n, Code::kInProgress);
  std::vector<Buf*> bufs(n, nullptr);
  uint8_t* dst = h.staging() + (32 << 20);
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(h.inv_->get_by_addr(h.map_.get(), dst + i * len, len, &bufs[i]).ok());
    const Status r = h.cache_->retrieve(key(i), bufs[i], &CacheHarness::done, &st[i]);
    if (!r.ok()) st[i] = r;
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(h.wait(&st[i]).ok()) << "chunk " << i << ": " << st[i].name();
    (void)bufs[i]->dec_refcount();
    for (size_t x = 0; x < len; ++x)
      ASSERT_EQ(dst[i * len + x], byte_of(key(i), x)) << "chunk " << i << " byte " << x;
  }
  EXPECT_GT(h.cache_->stats().engine_waits, 0u);  // the ring was full, and they waited
}

TEST(CacheEngine, EvictionPoliciesAreChosenByNameFromOneTable) {
  EXPECT_EQ(eviction_policy_names("|"), "arc|lru|s3fifo");
  EXPECT_STREQ(eviction_policies().front().name, CacheOptions{}.policy.c_str());  // the default
  std::unique_ptr<ProgressEngine> pe;
  ASSERT_TRUE(ProgressEngine::create(&pe).ok());
  for (const EvictionPolicyInfo& p : eviction_policies()) {
    CacheOptions o = small_memory(4, 64 << 10);
    o.policy = p.name;
    std::unique_ptr<CacheEngine> c;
    ASSERT_TRUE(CacheEngine::create(pe.get(), o, &c).ok()) << p.name;
    EXPECT_EQ(find_eviction_policy(p.name), &p);
  }
  CacheOptions o = small_memory(4, 64 << 10);
  o.policy = "lfu";
  std::unique_ptr<CacheEngine> c;
  EXPECT_EQ(CacheEngine::create(pe.get(), o, &c), Code::kInvalidValue);
  EXPECT_EQ(find_eviction_policy("lfu"), nullptr);
}

TEST(CacheEngine, S3FifoMatchesReferenceAndKeepsCapacity) {
  const uint64_t chunk = 256 << 10, slots = 20;
  CacheOptions o = small_memory(slots, chunk);
  o.policy = "s3fifo";
  CacheHarness h(o);
  RefS3Fifo ref{slots, 1024, {}, {}, {}, {}};
  std::mt19937_64 rng(99);
  uint64_t hits = 0;
  for (int op = 0; op < 4000; ++op) {
    // Skewed ids: some hot, many cold, as a cache sees them.
    const uint64_t id = (rng() % 4 == 0) ? rng() % 8 : 8 + rng() % 60;
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 5) {
      ASSERT_TRUE(h.store(key(id), chunk).ok());
      if (ref.present(id))
        ref.touch(id);
      else
        ref.insert(id);
    } else if (kind < 9) {
      Status st = h.retrieve(key(id), chunk);
      ASSERT_EQ(st.ok(), ref.present(id)) << "op " << op << " id " << id;
      if (st.ok()) ref.touch(id), ++hits;
    } else if (ref.present(id)) {
      ASSERT_TRUE(h.cache_->remove(key(id)).ok());
      ref.remove(id);
    }
    const CacheStats s = h.cache_->stats();
    ASSERT_LE(s.memory_used, s.memory_capacity);
    ASSERT_EQ(s.memory_chunks, ref.where.size()) << "op " << op;
  }
  EXPECT_GT(hits, 0u);
}

// With compression on, chunks are encoded by the compress engine on store and
// decoded on retrieve: exact bytes back, less memory used, and the disk tier keeps
// the encoded form across a restart.
TEST(CacheEngine, CompressedChunksRoundTripTakeLessMemoryAndSurviveRestart) {
  const std::string dir = "/tmp/dpukv-cache-codec-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const uint64_t chunk = 256 << 10;
  CacheOptions o = small_memory(16, chunk);
  o.compress = true;
  o.disk_dir = dir;
  o.disk_bytes = 64 * chunk;
  o.write_through = true;
  std::vector<std::vector<uint16_t>> data(8);
  {
    CacheHarness h(o);
    for (uint64_t i = 0; i < 8; ++i) {
      kv_synth(KvDataset::kRealistic, KvDtype::kBf16, KvShape{1, 128, 1024}, 40 + i, &data[i]);
      std::memcpy(h.staging() + i * chunk, data[i].data(), chunk);
      Buf* b;
      ASSERT_TRUE(h.inv_->get_by_data(h.map_.get(), h.staging() + i * chunk, chunk, &b).ok());
      Status st = Code::kInProgress;
      ASSERT_TRUE(h.cache_->store(key(i), b, &CacheHarness::done, &st).ok());
      ASSERT_TRUE(h.wait(&st).ok());
      (void)b->dec_refcount();
    }
    const CacheStats s = h.cache_->stats();
    EXPECT_GE(static_cast<double>(s.encoded_bytes_in) / s.encoded_bytes_out, 1.3);
    EXPECT_LT(s.memory_used, 8 * chunk * 85 / 100);
    EXPECT_EQ(h.cache_->chunk_size(key(3)), chunk);
    for (uint64_t i = 0; i < 8; ++i) {
      uint8_t* dst = h.staging() + (32 << 20);
      std::memset(dst, 0, chunk);
      Buf* b;
      ASSERT_TRUE(h.inv_->get_by_addr(h.map_.get(), dst, chunk, &b).ok());
      Status st = Code::kInProgress;
      ASSERT_TRUE(h.cache_->retrieve(key(i), b, &CacheHarness::done, &st).ok());
      ASSERT_TRUE(h.wait(&st).ok());
      EXPECT_EQ(b->data_len(), chunk);
      EXPECT_EQ(std::memcmp(dst, data[i].data(), chunk), 0) << i;
      (void)b->dec_refcount();
    }
    while (h.cache_->stats().spills < 8) h.pe_->progress();
  }
  {
    CacheHarness h(o);
    EXPECT_EQ(h.cache_->stats().recovered, 8u);
    uint8_t* dst = h.staging() + (32 << 20);
    Buf* b;
    ASSERT_TRUE(h.inv_->get_by_addr(h.map_.get(), dst, chunk, &b).ok());
    Status st = Code::kInProgress;
    ASSERT_TRUE(h.cache_->retrieve(key(5), b, &CacheHarness::done, &st).ok());
    ASSERT_TRUE(h.wait(&st).ok());
    EXPECT_EQ(std::memcmp(dst, data[5].data(), chunk), 0);
    (void)b->dec_refcount();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpukv
