// Placement alone, without the request pipeline or any engine: chunks are put in
// place as the pipeline puts them (an entry, room, the bytes, store_landed), and
// what leaves to make room, what waits for a write-back, and what the room
// listener hears are checked directly. The disk tier is a real file.
#include "cache/placement.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "runtime/chunk_checksum.h"

namespace dpukv {
namespace {

constexpr uint64_t kChunk = 64 << 10;

ChunkKey key(uint64_t n) {
  ChunkKey k;
  k.model = 11;
  k.prefix_hash = n;
  return k;
}

// A kept key of tenant `tag` (protocol/tenant_key.h: the tag is the world size).
ChunkKey tenant_key(uint32_t tag, uint64_t n) {
  ChunkKey k = key(n);
  k.world_size = tag;
  k.rank = 1u << 16;
  return k;
}

class PlacementTest : public ::testing::Test {
 protected:
  void TearDown() override {
    p_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void make(uint64_t chunks_of_memory, bool disk) {
    o_.memory_bytes = chunks_of_memory * kChunk;
    o_.max_chunk_bytes = kChunk;
    o_.max_chunks = 64;
    if (disk) {
      dir_ = "/tmp/dpukv-placement-test-" + std::to_string(getpid());
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      o_.disk_dir = dir_;
      o_.disk_bytes = 16 * kChunk;
    }
    p_ = std::make_unique<Placement>(o_, &st_);
    ASSERT_TRUE(p_->init().ok());
    p_->set_room_listener([](void* self) { ++*static_cast<int*>(self); }, &room_calls_);
  }
  // A chunk in memory as a store leaves it; false if there was no room now.
  bool put(uint64_t n) { return put_key(key(n)); }
  // As the pipeline's store does for a tenant: its quota first, then the tier.
  bool put_tenant(uint32_t tag, uint64_t n) {
    if (!p_->fit_tenant_memory(tag, kChunk, -1)) return false;
    return put_key(tenant_key(tag, n));
  }
  bool put_key(const ChunkKey& k) {
    const uint64_t n = k.prefix_hash;
    const int32_t e = p_->reserve(k, k.hash(), kChunk, kChunk, false);
    if (e < 0) return false;
    uint64_t off;
    if (!p_->make_room(kChunk, 0, &off)) {
      p_->abandon(e);
      return false;
    }
    p_->begin_fill(e, off);
    std::memset(p_->arena_at(off), static_cast<int>(n), kChunk);
    p_->store_landed(e, chunk_checksum(p_->arena_at(off), kChunk));
    return true;
  }
  bool in_memory(uint64_t n) { return key_in_memory(key(n)); }
  bool key_in_memory(const ChunkKey& k) {
    const int32_t e = p_->table().find(k);
    return e >= 0 && p_->table().at(e).mem_ready();
  }
  // Reaps the disk tier's completions (write-backs only here) until `n` landed.
  void land_spills(uint32_t n) {
    uint32_t landed = 0;
    while (landed < n) {
      DiskTier::Completion c[8];
      const size_t got = p_->poll_disk(c, 8);
      for (size_t i = 0; i < got; ++i) {
        ASSERT_NE(c[i].tag & Placement::kSpillTag, 0u) << "only write-backs were started";
        p_->spill_done(c[i].tag, c[i].status, c[i].err);
      }
      landed += static_cast<uint32_t>(got);
      if (got == 0) std::this_thread::yield();
    }
  }

  CacheOptions o_;
  CacheStats st_;
  std::string dir_;
  std::unique_ptr<Placement> p_;
  int room_calls_ = 0;
};

TEST_F(PlacementTest, RoomComesFromTheLeastRecentChunkAndNeverAPinnedOne) {
  make(4, false);
  for (uint64_t n = 1; n <= 4; ++n) ASSERT_TRUE(put(n));
  EXPECT_EQ(p_->memory().used_bytes(), 4 * kChunk);
  const ChunkKey two = key(2);
  EXPECT_EQ(p_->lookup(&two, 1, /*pin=*/true), 1u);
  p_->touch(p_->table().find(key(1)));  // 1 is recent now; 2 is pinned
  ASSERT_TRUE(put(5));
  EXPECT_FALSE(in_memory(3)) << "3 was the least recent unpinned chunk";
  EXPECT_TRUE(in_memory(1));
  EXPECT_TRUE(in_memory(2));
  EXPECT_EQ(st_.evictions, 1u);
  EXPECT_LE(p_->memory().used_bytes(), p_->memory().capacity());

  // Everything pinned: no room, and nothing is dropped.
  std::vector<ChunkKey> all = {key(1), key(2), key(4), key(5)};
  EXPECT_EQ(p_->lookup(all.data(), 4, true), 4u);
  EXPECT_FALSE(put(6));
  for (uint64_t n : {1, 2, 4, 5}) EXPECT_TRUE(in_memory(n)) << n;
  EXPECT_EQ(st_.evictions, 1u);
}

// With a disk tier, a chunk without a disk copy is written back before its memory
// goes: make_room says "wait", the write-back lands through spill_done, the
// room listener hears it, and the chunk is then on disk only.
TEST_F(PlacementTest, AVictimWithoutADiskCopyIsWrittenBackFirstAndTheListenerHearsIt) {
  make(2, true);
  ASSERT_TRUE(put(1));
  ASSERT_TRUE(put(2));  // full; neither has a disk copy (no write-back ran yet)
  ASSERT_EQ(p_->spills_in_flight(), 0u);
  uint64_t off;
  EXPECT_FALSE(p_->make_room(kChunk, 0, &off)) << "the victim must reach the disk first";
  EXPECT_EQ(p_->spills_in_flight(), 1u);
  EXPECT_TRUE(in_memory(1)) << "its memory goes only once the write landed";
  EXPECT_EQ(room_calls_, 0);
  land_spills(1);
  EXPECT_EQ(room_calls_, 1);
  EXPECT_EQ(st_.spills, 1u);
  ASSERT_TRUE(p_->make_room(kChunk, 0, &off));
  // 1, the least recent, left memory and is still in the cache, on disk.
  EXPECT_FALSE(in_memory(1));
  EXPECT_TRUE(p_->contains(key(1)));
  EXPECT_TRUE(in_memory(2));
  EXPECT_EQ(st_.evictions, 1u);
  p_->free_slot(off);
}

// An ingest whose bytes do not match gives its room back and says so to the
// listener (a store waiting for room may go on); a matching one is present.
TEST_F(PlacementTest, AFailedIngestGivesItsRoomBack) {
  make(2, false);
  ChunkPlacement cp;
  cp.size = cp.stored = kChunk;
  std::vector<uint8_t> bytes(kChunk, 0x3c);
  cp.checksum = chunk_checksum(bytes.data(), kChunk);
  uint8_t* dst = nullptr;
  ASSERT_TRUE(p_->begin_ingest(key(7), cp, false, 0, &dst).ok());
  EXPECT_EQ(p_->memory().used_bytes(), kChunk);
  std::memcpy(dst, bytes.data(), kChunk);
  dst[100] ^= 1;  // changed on the way
  EXPECT_EQ(p_->end_ingest(key(7), true), Code::kCorrupted);
  EXPECT_EQ(p_->memory().used_bytes(), 0u);
  EXPECT_EQ(room_calls_, 1);
  EXPECT_FALSE(p_->contains(key(7)));

  ASSERT_TRUE(p_->begin_ingest(key(7), cp, false, 0, &dst).ok());
  std::memcpy(dst, bytes.data(), kChunk);
  EXPECT_TRUE(p_->end_ingest(key(7), true).ok());
  EXPECT_TRUE(p_->contains(key(7)));
  EXPECT_EQ(p_->begin_ingest(key(7), cp, false, 0, &dst), Code::kBadState);  // present
  EXPECT_EQ(p_->begin_ingest(key(8), cp, true, 0, &dst), Code::kNotSupported);
}

// A tenant over its memory share loses its own coldest chunk, never another
// tenant's, even where the other's are colder; the figures follow.
TEST_F(PlacementTest, ATenantOverItsQuotaEvictsItsOwnChunksOnly) {
  make(8, false);
  constexpr uint32_t kA = 0xa, kB = 0xb;
  p_->set_tenant_quota(kA, 3 * kChunk, 0);
  for (uint64_t n = 1; n <= 2; ++n) ASSERT_TRUE(put_tenant(kB, n));  // colder than A's
  for (uint64_t n = 1; n <= 3; ++n) ASSERT_TRUE(put_tenant(kA, n));
  EXPECT_EQ(p_->tenant_usage(kA).memory_bytes, 3 * kChunk);
  ASSERT_TRUE(put_tenant(kA, 4));
  EXPECT_FALSE(key_in_memory(tenant_key(kA, 1))) << "A's coldest goes for A's store";
  for (uint64_t n = 1; n <= 2; ++n) EXPECT_TRUE(key_in_memory(tenant_key(kB, n))) << n;
  for (uint64_t n = 2; n <= 4; ++n) EXPECT_TRUE(key_in_memory(tenant_key(kA, n))) << n;
  const TenantUsage a = p_->tenant_usage(kA), b = p_->tenant_usage(kB);
  EXPECT_EQ(a.memory_bytes, 3 * kChunk);
  EXPECT_EQ(a.chunks, 3u);
  EXPECT_EQ(a.quota_evictions, 1u);
  EXPECT_EQ(b.memory_bytes, 2 * kChunk);
  EXPECT_EQ(b.quota_evictions, 0u);
  // Pinned, A's chunks stay and its next store does not fit: refused, not taken
  // from B.
  std::vector<ChunkKey> mine = {tenant_key(kA, 2), tenant_key(kA, 3), tenant_key(kA, 4)};
  EXPECT_EQ(p_->lookup(mine.data(), 3, /*pin=*/true), 3u);
  EXPECT_FALSE(put_tenant(kA, 5));
  EXPECT_EQ(p_->tenant_usage(kB).memory_bytes, 2 * kChunk);
  // A chunk larger than the whole share evicts nothing.
  p_->unpin(mine.data(), 3);
  EXPECT_FALSE(p_->fit_tenant_memory(kA, 4 * kChunk, -1));
  EXPECT_EQ(p_->tenant_usage(kA).memory_bytes, 3 * kChunk);
}

// Slots of stores in flight count against the share: a batch that would
// overshoot it finds no victim while its own fills are under way (the pipeline
// then waits for them to land), and once they land they are its victims.
TEST_F(PlacementTest, StoresInFlightCountAgainstTheTenantsShare) {
  make(8, false);
  constexpr uint32_t kA = 0xa;
  p_->set_tenant_quota(kA, 2 * kChunk, 0);
  ASSERT_TRUE(put_tenant(kA, 1));
  p_->charge_fill(kA, kChunk);  // a second store of A's is filling
  EXPECT_EQ(p_->tenant_usage(kA).memory_filling, kChunk);
  EXPECT_TRUE(p_->fit_tenant_memory(kA, kChunk, -1)) << "its landed chunk makes room";
  EXPECT_FALSE(key_in_memory(tenant_key(kA, 1)));
  p_->charge_fill(kA, kChunk);  // both slots of the share are in flight
  EXPECT_FALSE(p_->fit_tenant_memory(kA, kChunk, -1));
  p_->release_fill(kA, 2 * kChunk);
  EXPECT_TRUE(p_->fit_tenant_memory(kA, kChunk, -1));
  EXPECT_EQ(p_->tenant_usage(kA).memory_filling, 0u);
}

// A tenant over its disk share makes room from its own coldest disk copies before a
// write-back, never another tenant's, even a colder one.
TEST_F(PlacementTest, ATenantOverItsDiskQuotaDropsItsOwnDiskCopiesOnly) {
  make(2, true);
  constexpr uint32_t kA = 0xa, kB = 0xb;
  p_->set_tenant_quota(kA, 0, kChunk);
  uint64_t off;
  auto spill_one = [&] {  // memory full: its coldest chunk is written back, then leaves
    ASSERT_FALSE(p_->make_room(kChunk, 0, &off));
    land_spills(1);
    ASSERT_TRUE(p_->make_room(kChunk, 0, &off));
    p_->free_slot(off);
  };
  ASSERT_TRUE(put_tenant(kB, 1));
  ASSERT_TRUE(put_tenant(kA, 1));
  spill_one();  // B1 to disk
  ASSERT_TRUE(put_tenant(kA, 2));
  spill_one();  // A1 to disk: A's share is full
  ASSERT_TRUE(put_tenant(kA, 3));
  spill_one();  // A2's write-back: A1's disk copy goes, not B1's (colder)
  EXPECT_TRUE(p_->contains(tenant_key(kB, 1)));
  EXPECT_FALSE(p_->contains(tenant_key(kA, 1)));
  EXPECT_TRUE(p_->contains(tenant_key(kA, 2)));
  EXPECT_EQ(p_->tenant_usage(kA).disk_bytes, kChunk);
  EXPECT_EQ(p_->tenant_usage(kA).quota_evictions, 1u);
  EXPECT_EQ(p_->tenant_usage(kB).disk_bytes, kChunk);
}

}  // namespace
}  // namespace dpukv
