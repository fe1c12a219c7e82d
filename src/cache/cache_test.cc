#include "cache/cache_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <random>
#include <set>
#include <unordered_map>
#include <vector>

#include "cache/slab_allocator.h"
#include "engines/compress/kv_synth.h"
#include "runtime/child_process.h"
#include "runtime/log.h"

namespace dpukv {
namespace {

TEST(ChunkKey, GoldenValuesAndPrefixChaining) {
  KeyContext ctx{model_id("meta-llama/Llama-3.1-8B"), 1, 0,
                 kv_layout_fingerprint("bf16", 32, 8, 128)};
  EXPECT_EQ(ctx.model, 0x0e40671a050495a5ull);
  EXPECT_EQ(ctx.layout, 0x1e9c088bfe612b7dull);
  std::vector<int32_t> t(600);
  for (int i = 0; i < 600; ++i) t[static_cast<size_t>(i)] = i * 7 + 1;
  std::vector<ChunkKey> k;
  chunk_keys(ctx, t.data(), t.size(), 256, true, &k);
  ASSERT_EQ(k.size(), 3u);
  EXPECT_EQ(k[0].prefix_hash, 0x1cebeeeb1ce8b399ull);
  EXPECT_EQ(k[1].prefix_hash, 0xc5134755e1824fe3ull);
  EXPECT_EQ(k[2].prefix_hash, 0xddf9eb429a488a23ull);  // the partial last chunk
  EXPECT_EQ(key_from_block_id(ctx, 46).prefix_hash, 0x198544bdb1c10beaull);
  chunk_keys(ctx, t.data(), t.size(), 256, false, &k);
  EXPECT_EQ(k.size(), 2u);
  // A different token in chunk 0 changes every later key; one in chunk 1 keeps chunk 0's.
  std::vector<ChunkKey> k2;
  t[300] = -5;
  chunk_keys(ctx, t.data(), t.size(), 256, false, &k2);
  EXPECT_EQ(k2[0], k[0]);
  EXPECT_NE(k2[1].prefix_hash, k[1].prefix_hash);
  // Rank and model are part of the key.
  KeyContext other = ctx;
  other.rank = 1;
  chunk_keys(other, t.data(), 256, 256, false, &k2);
  EXPECT_FALSE(k2[0] == k[0]);
}

TEST(SlabAllocator, ClassesBoundWasteAndPagesComeBack) {
  SlabAllocator a;
  ASSERT_TRUE(a.init(64 << 20, 4 << 20).ok());
  EXPECT_EQ(a.class_size(1), 4096u);
  EXPECT_EQ(a.class_size(5000), 5120u);
  EXPECT_EQ(a.class_size(256 << 10), 256u << 10);
  for (uint64_t s : {4097ull, 70000ull, 300000ull, 3000000ull})
    EXPECT_LE(a.class_size(s), s + s / 4 + 4096);
  EXPECT_EQ(a.class_size((4 << 20) + 1), 0u);
  std::vector<uint64_t> offs;
  uint64_t off;
  while (a.alloc(1 << 20, &off)) offs.push_back(off);
  EXPECT_EQ(offs.size(), 64u);
  EXPECT_EQ(a.used_bytes(), 64u << 20);
  EXPECT_FALSE(a.alloc(4096, &off));
  for (uint64_t o : offs) a.free(o);
  EXPECT_EQ(a.pages_in_use(), 0u);
  EXPECT_TRUE(a.alloc(4096, &off));
  EXPECT_TRUE(a.alloc_at(8 << 20, 1 << 20));
  EXPECT_FALSE(a.alloc_at(8 << 20, 1 << 20));           // taken
  EXPECT_FALSE(a.alloc_at((8 << 20) + 4096, 1 << 20));  // misaligned for its class
}

// ---------------------------------------------------------------- engine fixture

uint8_t byte_of(const ChunkKey& k, size_t i) {
  return static_cast<uint8_t>((k.prefix_hash >> (i % 7 * 8)) + i * 131);
}

ChunkKey key(uint64_t id) {
  return key_from_block_id(KeyContext{1, 1, 0, 2}, id);
}

class CacheHarness {
 public:
  explicit CacheHarness(const CacheOptions& o) {
    EXPECT_TRUE(ProgressEngine::create(&pe_).ok());
    EXPECT_TRUE(CacheEngine::create(pe_.get(), o, &cache_).ok());
    EXPECT_TRUE(cache_->start().ok());
    EXPECT_TRUE(MemRegion::create(64 << 20, MemRegionOptions{}, &mem_).ok());
    EXPECT_TRUE(
        Mmap::create(mem_->data(), mem_->size(), kAccessLocalReadWrite, mem_->fd(), 0, &map_).ok());
    EXPECT_TRUE(map_->start().ok());
    EXPECT_TRUE(BufInventory::create(1024, &inv_).ok());
  }
  ~CacheHarness() {
    if (cache_->state() != CtxState::kIdle) {
      (void)cache_->stop();
      while (cache_->state() != CtxState::kIdle) pe_->progress();
    }
    cache_.reset();
    (void)map_->stop();
  }
  uint8_t* staging() { return static_cast<uint8_t*>(mem_->data()); }

  static void done(void* arg, Status st) { *static_cast<Status*>(arg) = st; }
  Status wait(Status* slot) {
    while (*slot == Code::kInProgress) pe_->progress();
    return *slot;
  }
  Status store(const ChunkKey& k, size_t len) {
    for (size_t i = 0; i < len; ++i) staging()[i] = byte_of(k, i);
    Buf* b;
    EXPECT_TRUE(inv_->get_by_data(map_.get(), staging(), len, &b).ok());
    Status st = Code::kInProgress;
    Status r = cache_->store(k, b, &CacheHarness::done, &st);
    if (!r.ok())
      st = r;
    else
      (void)wait(&st);
    (void)b->dec_refcount();
    return st;
  }
  // Retrieves into staging + 32 MiB and checks every byte.
  Status retrieve(const ChunkKey& k, size_t len) {
    uint8_t* dst = staging() + (32 << 20);
    std::memset(dst, 0, len);
    Buf* b;
    EXPECT_TRUE(inv_->get_by_addr(map_.get(), dst, 32 << 20, &b).ok());
    Status st = Code::kInProgress;
    Status r = cache_->retrieve(k, b, &CacheHarness::done, &st);
    if (!r.ok())
      st = r;
    else
      (void)wait(&st);
    if (st.ok()) {
      EXPECT_EQ(b->data_len(), len);
      for (size_t i = 0; i < len; ++i)
        if (dst[i] != byte_of(k, i)) {
          ADD_FAILURE() << "wrong byte " << i;
          break;
        }
    }
    (void)b->dec_refcount();
    return st;
  }
  // Serves completions for ms milliseconds (writes in flight land).
  void settle(int ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end)
      if (!pe_->progress()) usleep(200);
  }
  // Stores of n chunks of len bytes submitted at once (as one batch of the agent
  // does), each from its own piece of staging; wait() collects every completion.
  struct Batch {
    std::vector<Status> st;
    std::vector<Buf*> bufs;
  };
  void submit_stores(uint64_t first, uint64_t n, size_t len, Batch* b) {
    b->st.assign(n, Code::kInProgress);
    b->bufs.assign(n, nullptr);
    for (uint64_t i = 0; i < n; ++i) {
      uint8_t* p = staging() + i * len;
      for (size_t x = 0; x < len; ++x) p[x] = byte_of(key(first + i), x);
      EXPECT_TRUE(inv_->get_by_data(map_.get(), p, len, &b->bufs[i]).ok());
      Status r = cache_->store(key(first + i), b->bufs[i], &CacheHarness::done, &b->st[i]);
      if (!r.ok()) b->st[i] = r;
    }
  }
  std::vector<Status> wait(Batch* b) {
    for (size_t i = 0; i < b->st.size(); ++i) {
      (void)wait(&b->st[i]);
      (void)b->bufs[i]->dec_refcount();
    }
    return b->st;
  }
  std::vector<Status> store_batch(uint64_t first, uint64_t n, size_t len) {
    Batch b;
    submit_stores(first, n, len, &b);
    return wait(&b);
  }
  Status prefetch(const ChunkKey& k) {
    Status st = Code::kInProgress;
    Status r = cache_->prefetch(k, &CacheHarness::done, &st);
    return r.ok() ? wait(&st) : r;
  }

  std::unique_ptr<ProgressEngine> pe_;
  std::unique_ptr<CacheEngine> cache_;
  std::unique_ptr<MemRegion> mem_;
  std::unique_ptr<Mmap> map_;
  std::unique_ptr<BufInventory> inv_;
};

CacheOptions small_memory(uint64_t chunks, uint64_t chunk_bytes) {
  CacheOptions o;
  o.memory_bytes = chunks * chunk_bytes;
  o.max_chunk_bytes = chunk_bytes;
  o.max_chunks = 4096;
  o.max_requests = 64;
  return o;
}

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

TEST(CacheEngine, S3FifoMatchesReferenceAndKeepsCapacity) {
  const uint64_t chunk = 256 << 10, slots = 20;
  CacheOptions o = small_memory(slots, chunk);
  o.policy = CacheOptions::Policy::kS3Fifo;
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

std::string temp_dir(const char* tag) {
  std::string d = "/tmp/dpukv-cache-" + std::string(tag) + "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  return d;
}

CacheOptions with_disk(const std::string& dir, uint64_t mem_chunks, uint64_t disk_chunks,
                       uint64_t chunk) {
  CacheOptions o = small_memory(mem_chunks, chunk);
  o.disk_dir = dir;
  o.disk_bytes = disk_chunks * chunk;
  return o;
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

TEST(CacheEngine, SpillToDiskAndReload) {
  const std::string dir = temp_dir("spill");
  const uint64_t chunk = 1 << 20;
  {
    CacheHarness h(with_disk(dir, 4, 32, chunk));
    for (uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(h.store(key(i), chunk - i * 1000).ok());
    const CacheStats s = h.cache_->stats();
    EXPECT_GE(s.spills, 8u);
    EXPECT_LE(s.memory_used, s.memory_capacity);
    for (uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(h.retrieve(key(i), chunk - i * 1000).ok()) << i;
    EXPECT_GT(h.cache_->stats().reloads, 0u);
    // Prefetch brings a disk-only chunk up.
    ASSERT_TRUE(h.store(key(100), chunk).ok());
    ASSERT_TRUE(h.store(key(101), chunk).ok());
    ASSERT_TRUE(h.store(key(102), chunk).ok());
    ASSERT_TRUE(h.store(key(103), chunk).ok());
    ASSERT_TRUE(h.prefetch(key(0)).ok());
    std::vector<ChunkKey> k0 = {key(0)};
    EXPECT_EQ(h.cache_->lookup(k0.data(), 1, false), 1u);
  }
  // Reopen: the disk tier comes back.
  {
    CacheHarness h(with_disk(dir, 4, 32, chunk));
    EXPECT_GE(h.cache_->stats().recovered, 8u);
    for (uint64_t i = 0; i < 12; ++i) {
      Status st = h.retrieve(key(i), chunk - i * 1000);
      EXPECT_TRUE(st.ok() || st == Code::kNotFound) << st.name();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(CacheEngine, CorruptedBytesOnDiskAreDetectedNotReturned) {
  const std::string dir = temp_dir("corrupt");
  const uint64_t chunk = 256 << 10;
  CacheOptions o = with_disk(dir, 4, 16, chunk);
  o.write_through = true;
  {
    CacheHarness h(o);
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(h.store(key(i), chunk).ok());
    while (h.cache_->stats().spills < 3) h.pe_->progress();
  }
  // Flip one byte in each chunk's data on disk.
  int fd = ::open((dir + "/dpukv-data").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  for (uint64_t off = 0; off < 16 * chunk; off += chunk) {
    uint8_t b;
    ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(off + 1234)), 1);
    b ^= 0x40;
    ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(off + 1234)), 1);
  }
  ::close(fd);
  {
    CacheHarness h(o);
    EXPECT_EQ(h.cache_->stats().recovered, 3u);
    for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(h.retrieve(key(i), chunk), Code::kNotFound);
    EXPECT_EQ(h.prefetch(key(0)), Code::kNotFound);
    EXPECT_EQ(h.cache_->stats().checksum_failures, 3u);
    EXPECT_FALSE(h.cache_->contains(key(0)));
  }
  std::filesystem::remove_all(dir);
}

// A child process stores chunks with write-through and is killed at a random
// moment; the reopened cache returns every recovered chunk exactly, or a miss.
TEST(CacheEngine, CrashMidSpillRecoversOnlyWholeChunks) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  const uint64_t chunk = 512 << 10;
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  for (int round = 0; round < 3; ++round) {
    const std::string dir = temp_dir(("crash" + std::to_string(round)).c_str());
    CacheOptions o = with_disk(dir, 8, 64, chunk);
    o.write_through = true;
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(p[0]);
      CacheHarness h(o);
      for (uint64_t i = 0;; ++i) {
        if (!h.store(key(i % 60), chunk).ok()) _exit(3);
        if (i == 10) (void)!write(p[1], "x", 1);
      }
    }
    close(p[1]);
    char c;
    ASSERT_EQ(read(p[0], &c, 1), 1);
    close(p[0]);
    usleep(static_cast<useconds_t>(rng() % 20000));
    ASSERT_TRUE(signal_child(pid, SIGKILL));
    reap_child(pid, nullptr);
    CacheHarness h(o);
    const uint64_t recovered = h.cache_->stats().recovered;
    EXPECT_GT(recovered, 0u);
    uint64_t good = 0;
    for (uint64_t i = 0; i < 60; ++i) {
      Status st = h.retrieve(key(i), chunk);  // checks every byte when it succeeds
      ASSERT_TRUE(st.ok() || st == Code::kNotFound) << st.name();
      good += st.ok();
    }
    EXPECT_GE(good + h.cache_->stats().checksum_failures, recovered);
    std::filesystem::remove_all(dir);
  }
}

// Writes past a file-size limit fail like a full disk: counted, and the chunks
// stay served from memory.
TEST(CacheEngine, DiskFullKeepsServingFromMemory) {
  const std::string dir = temp_dir("full");
  const uint64_t chunk = 256 << 10;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    CacheOptions o = with_disk(dir, 32, 16, chunk);
    o.write_through = true;
    CacheHarness h(o);
    rlimit rl{4 * chunk, 4 * chunk};  // only the first 4 slots can be written
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
    for (uint64_t i = 0; i < 12; ++i)
      if (!h.store(key(i), chunk).ok()) _exit(11);
    // The first failure stops writing back for a while; the chunks stay in memory.
    while (h.cache_->stats().io_errors == 0) h.pe_->progress();
    h.settle(200);
    const CacheStats s = h.cache_->stats();
    if (s.io_errors == 0 || s.spills == 0) _exit(12);
    if (s.memory_chunks != 12) _exit(15);
    for (uint64_t i = 0; i < 12; ++i)
      if (!h.retrieve(key(i), chunk).ok()) _exit(13);
    _exit(::testing::Test::HasFailure() ? 14 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpukv

namespace dpukv {
namespace {

// A tier larger than the free space is refused before a byte is taken, and the
// data file it would have created is gone (on a 16 MiB tmpfs made for the test).
TEST(DiskTier, RefusesATierLargerThanTheFreeSpace) {
  const std::string mnt = temp_dir("small-fs");
  std::filesystem::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=16m") != 0) {
    std::filesystem::remove_all(mnt);
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  }
  const std::string dir = mnt + "/tier";
  std::unique_ptr<DiskTier> t;
  std::vector<DiskTier::Recovered> rec;
  DiskTierOptions o;
  o.dir = dir;
  o.page_size = 1 << 20;
  o.capacity = 64ull << 20;
  EXPECT_EQ(DiskTier::open(o, {}, &rec, &t), Code::kFull);
  EXPECT_FALSE(std::filesystem::exists(dir + "/dpukv-data"));
  struct statvfs v {};
  ASSERT_EQ(::statvfs(mnt.c_str(), &v), 0);
  EXPECT_GT(static_cast<uint64_t>(v.f_bavail) * v.f_frsize, 15ull << 20);  // nothing taken
  // One that fits opens, and opens again (its own file's space counts as available).
  o.capacity = 8ull << 20;
  ASSERT_TRUE(DiskTier::open(o, {}, &rec, &t).ok());
  t.reset();
  ASSERT_TRUE(DiskTier::open(o, {}, &rec, &t).ok());
  t.reset();
  ASSERT_EQ(::umount(mnt.c_str()), 0);
  std::filesystem::remove_all(mnt);
}

// Two owners of one directory would hand out the same extents: the second is
// refused while the first lives, and takes over once it is gone.
TEST(DiskTier, OneOwnerPerDirectory) {
  const std::string dir = temp_dir("lock");
  DiskTierOptions o;
  o.dir = dir;
  o.page_size = 1 << 20;
  o.capacity = 4ull << 20;
  std::unique_ptr<DiskTier> a, b;
  std::vector<DiskTier::Recovered> rec;
  ASSERT_TRUE(DiskTier::open(o, {}, &rec, &a).ok());
  EXPECT_EQ(DiskTier::open(o, {}, &rec, &b), Code::kBadState);
  std::ifstream f(dir + "/dpukv.lock");
  pid_t owner = 0;
  f >> owner;
  EXPECT_EQ(owner, getpid());
  a.reset();
  EXPECT_TRUE(DiskTier::open(o, {}, &rec, &b).ok());
  b.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpukv

namespace dpukv {
namespace {

// A full disk tier makes room: sequential stores through a 4-chunk memory tier and
// a 16-chunk disk tier leave the most recent ~20 chunks in the cache, not the
// first 16 forever.
TEST(CacheEngine, DiskTierEvictsItsLeastRecentChunks) {
  const std::string dir = temp_dir("disk-evict");
  const uint64_t chunk = 64 << 10;
  CacheHarness h(with_disk(dir, 4, 16, chunk));
  for (uint64_t i = 0; i < 100; ++i) {
    Status st = h.store(key(i), chunk);
    ASSERT_TRUE(st.ok()) << i << " " << st.name();
  }
  h.settle(100);
  const CacheStats s = h.cache_->stats();
  EXPECT_GT(s.disk_evictions, 60u);
  EXPECT_EQ(s.memory_chunks, 4u);
  EXPECT_LE(s.both_chunks, 1u);  // write-ahead keeps at most one chunk in both tiers here
  uint32_t recent = 0;
  for (uint64_t i = 80; i < 100; ++i) recent += h.retrieve(key(i), chunk).ok();
  EXPECT_GE(recent, 19u);
  uint32_t old = 0;
  for (uint64_t i = 0; i < 60; ++i) old += h.cache_->contains(key(i));
  EXPECT_EQ(old, 0u);
  std::filesystem::remove_all(dir);
}

// A reloaded chunk's disk copy is redundant and goes first: reading old chunks
// back does not push other chunks out of the hierarchy.
TEST(CacheEngine, RedundantDiskCopiesGoBeforeDiskOnlyChunks) {
  const std::string dir = temp_dir("disk-dup");
  const uint64_t chunk = 64 << 10;
  CacheHarness h(with_disk(dir, 4, 16, chunk));
  for (uint64_t i = 0; i < 19; ++i) ASSERT_TRUE(h.store(key(i), chunk).ok());
  h.settle(100);
  // Memory: 15..18 (15 also written ahead to disk); disk: 0..15, full. Reload 0..3:
  // their disk copies become redundant, and 16..18 leaving memory must displace
  // those copies, not the disk-only chunks 4..7.
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(h.retrieve(key(i), chunk).ok()) << i;
  h.settle(100);
  for (uint64_t i = 0; i < 19; ++i) EXPECT_TRUE(h.cache_->contains(key(i))) << i;
  EXPECT_EQ(h.cache_->stats().disk_evictions, 0u);
  std::filesystem::remove_all(dir);
}

// Many stores submitted at once through a full memory tier: write-back is paced
// (a bounded number of writes, stores wait for them), so every store succeeds,
// no chunk is dropped without its disk copy, and memory stays full.
TEST(CacheEngine, WriteBackIsPacedAndLosesNothing) {
  const std::string dir = temp_dir("paced");
  const uint64_t chunk = 64 << 10;
  CacheOptions o = with_disk(dir, 64, 512, chunk);
  o.max_requests = 1024;
  CacheHarness h(o);
  std::vector<Status> st = h.store_batch(0, 300, chunk);
  for (uint64_t i = 0; i < st.size(); ++i) ASSERT_TRUE(st[i].ok()) << i << " " << st[i].name();
  h.settle(100);
  const CacheStats s = h.cache_->stats();
  EXPECT_GE(s.memory_chunks, 56u) << "memory drained by write-back";
  EXPECT_EQ(s.io_errors, 0u);
  EXPECT_EQ(s.chunks, 300u);
  for (uint64_t i = 0; i < 300; ++i) EXPECT_TRUE(h.retrieve(key(i), chunk).ok()) << i;
  std::filesystem::remove_all(dir);
}

// Stores that find memory full of chunks not yet on disk each start their own
// write-back: N stores waiting keep N writes in flight (up to the engine's cap), so
// the disk sees the caller's queue depth. (Before, a store that saw any write
// under way waited for it: one write at a time, half the disk's throughput at
// 256 KiB.) Completions are handled only by progress(), so the count read right
// after the submissions is exact.
TEST(CacheEngine, EachStoreWaitingForRoomHasItsOwnWriteBack) {
  const std::string dir = temp_dir("perwaiter");
  const uint64_t chunk = 64 << 10;
  CacheOptions o = with_disk(dir, 64, 512, chunk);
  o.max_requests = 256;
  CacheHarness h(o);
  std::vector<Status> st = h.store_batch(0, 64, chunk);
  for (uint64_t i = 0; i < st.size(); ++i) ASSERT_TRUE(st[i].ok()) << i;
  h.settle(100);  // the write-ahead reserve (an eighth of memory) is on disk now
  ASSERT_EQ(h.cache_->stats().disk_ios_in_flight, 0u);
  const uint64_t n = 24;
  CacheHarness::Batch batch;
  h.submit_stores(100, n, chunk, &batch);
  // The first 8 stores take the clean reserve; the 16 others each need a write.
  EXPECT_GE(h.cache_->stats().disk_ios_in_flight, 16u);
  const std::vector<Status> st2 = h.wait(&batch);
  for (uint64_t i = 0; i < n; ++i) EXPECT_TRUE(st2[i].ok()) << i;
  for (uint64_t i = 0; i < n; ++i) EXPECT_TRUE(h.retrieve(key(100 + i), chunk).ok()) << i;
  std::filesystem::remove_all(dir);
}

// The index log cannot grow: the tier's filesystem (a tmpfs made for the test)
// has room for the preallocated data file, the lock file and one page of log (46
// records). Spills then fail, are counted and logged, and memory keeps what it
// would hold with no disk tier at all.
TEST(CacheEngine, FailingDiskLogDoesNotDrainMemory) {
  const std::string mnt = temp_dir("logfull");
  const uint64_t chunk = 64 << 10;
  std::filesystem::create_directories(mnt);
  const std::string size = "size=" + std::to_string(32 * chunk + 2 * 4096);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, size.c_str()) != 0) {
    std::filesystem::remove_all(mnt);
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  }
  {
    CacheHarness h(with_disk(mnt + "/tier", 8, 32, chunk));
    for (uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(h.store(key(i), chunk).ok()) << i;
    h.settle(100);
    const CacheStats s = h.cache_->stats();
    EXPECT_GT(s.disk_log_errors, 0u);
    EXPECT_GT(s.io_errors, 0u);
    EXPECT_EQ(s.memory_chunks, 8u);
    for (uint64_t i = 92; i < 100; ++i) EXPECT_TRUE(h.retrieve(key(i), chunk).ok()) << i;
  }
  ASSERT_EQ(::umount(mnt.c_str()), 0);
  std::filesystem::remove_all(mnt);
}

}  // namespace
}  // namespace dpukv
