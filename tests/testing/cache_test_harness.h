// What the cache engine's tests share: a harness that runs an engine on its own
// progress engine with caller staging, deterministic chunk bytes per key, and
// option presets (a small memory tier, a disk tier in a fresh directory).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/cache_engine.h"

namespace dpukv::cache_test {

inline uint8_t byte_of(const ChunkKey& k, size_t i) {
  return static_cast<uint8_t>((k.prefix_hash >> (i % 7 * 8)) + i * 131);
}

inline ChunkKey key(uint64_t id) {
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
  // Serves completions until the engine is idle: no request in any state, no disk
  // I/O in flight, and a progress round that found nothing to do (writes in
  // flight have landed, write-back it started has finished). A condition, not a
  // time: a busy machine only makes it take longer (failing after 60 s).
  void settle() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < end) {
      const size_t work = pe_->progress();
      const CacheStats s = cache_->stats();
      bool idle = work == 0 && s.disk_ios_in_flight == 0;
      for (uint64_t c : s.requests_in_state) idle = idle && c == 0;
      if (idle) return;
      if (work == 0) usleep(200);
    }
    ADD_FAILURE() << "the cache engine did not settle in 60 s";
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

inline CacheOptions small_memory(uint64_t chunks, uint64_t chunk_bytes) {
  CacheOptions o;
  o.memory_bytes = chunks * chunk_bytes;
  o.max_chunk_bytes = chunk_bytes;
  o.max_chunks = 4096;
  o.max_requests = 64;
  o.policy = "lru";  // the engine's mechanics are checked with the simplest order
  return o;
}

inline std::string temp_dir(const char* tag) {
  std::string d = "/tmp/dpukv-cache-" + std::string(tag) + "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  return d;
}

inline CacheOptions with_disk(const std::string& dir, uint64_t mem_chunks, uint64_t disk_chunks,
                              uint64_t chunk) {
  CacheOptions o = small_memory(mem_chunks, chunk);
  o.disk_dir = dir;
  o.disk_bytes = disk_chunks * chunk;
  return o;
}

}  // namespace dpukv::cache_test
