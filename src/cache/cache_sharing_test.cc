// Sharing with other agents: a chunk shown in place and copied out of one cache's
// arena is taken in by another, checked, and served as its own; a wrong copy is
// refused; the residency listener hears every arrival and departure.
#include <xxhash.h>

#include <cstring>
#include <set>

#include "testing/cache_test_harness.h"

namespace dpukv {
namespace {

using cache_test::CacheHarness;
using cache_test::key;
using cache_test::small_memory;

struct Residency {
  std::set<uint64_t> present;
  int arrivals = 0, departures = 0;
  static void on(void* arg, const ChunkKey& k, bool present) {
    auto* r = static_cast<Residency*>(arg);
    if (present) {
      EXPECT_TRUE(r->present.insert(k.prefix_hash).second) << "told twice of an arrival";
      ++r->arrivals;
    } else {
      EXPECT_EQ(r->present.erase(k.prefix_hash), 1u) << "told of a departure never announced";
      ++r->departures;
    }
  }
};

// Copies a located chunk from one cache's arena into another's, as a peer's
// one-sided read does.
Status copy_between(CacheHarness& from, CacheHarness& to, const ChunkKey& k, bool corrupt) {
  ChunkPlacement p;
  DPUKV_RETURN_IF_ERROR(from.cache_->locate(k, &p));
  void* base;
  uint64_t len;
  from.cache_->arena(&base, &len);
  EXPECT_LE(p.offset + p.stored, len);
  uint8_t* dst = nullptr;
  Status st = to.cache_->begin_ingest(k, p, &dst);
  if (st.ok()) {
    std::memcpy(dst, static_cast<uint8_t*>(base) + p.offset, p.stored);
    if (corrupt) dst[p.stored / 2] ^= 1;
    st = to.cache_->end_ingest(k, true);
  }
  from.cache_->unpin(&k, 1);
  return st;
}

TEST(CacheSharing, LocatedChunkIngestedElsewhereIsServedThere) {
  CacheHarness a(small_memory(8, 1 << 20)), b(small_memory(8, 1 << 20));
  ASSERT_TRUE(a.store(key(1), 300000).ok());
  ASSERT_TRUE(copy_between(a, b, key(1), false).ok());
  EXPECT_TRUE(b.cache_->contains(key(1)));
  EXPECT_TRUE(b.retrieve(key(1), 300000).ok());  // checks every byte
  const CacheStats s = b.cache_->stats();
  EXPECT_EQ(s.ingests, 1u);
  EXPECT_EQ(s.ingest_bytes, 300000u);
  EXPECT_EQ(a.cache_->stats().located, 1u);
  // Present already: refused, the chunk untouched.
  ChunkPlacement p;
  ASSERT_TRUE(a.cache_->locate(key(1), &p).ok());
  uint8_t* dst;
  EXPECT_EQ(b.cache_->begin_ingest(key(1), p, &dst), Code::kBadState);
  EXPECT_TRUE(b.retrieve(key(1), 300000).ok());
}

TEST(CacheSharing, CorruptOrFailedIngestLeavesNothingAndFreesTheRoom) {
  CacheHarness a(small_memory(8, 1 << 20)), b(small_memory(2, 1 << 20));
  ASSERT_TRUE(a.store(key(1), 1 << 20).ok());
  ASSERT_TRUE(a.store(key(2), 1 << 20).ok());
  EXPECT_EQ(copy_between(a, b, key(1), true), Code::kCorrupted);
  EXPECT_FALSE(b.cache_->contains(key(1)));
  const ChunkKey k1 = key(1);
  EXPECT_EQ(b.cache_->lookup(&k1, 1, false), 0u);
  EXPECT_EQ(b.cache_->stats().checksum_failures, 1u);
  // A writer that failed (its read broke): nothing present, no checksum counted.
  ChunkPlacement p;
  ASSERT_TRUE(a.cache_->locate(key(2), &p).ok());
  uint8_t* dst;
  ASSERT_TRUE(b.cache_->begin_ingest(key(2), p, &dst).ok());
  EXPECT_FALSE(b.cache_->contains(key(2)));  // not present while being written
  EXPECT_EQ(b.cache_->end_ingest(key(2), false), Code::kIoFailed);
  EXPECT_EQ(b.cache_->end_ingest(key(2), true), Code::kBadState);  // once only
  EXPECT_EQ(b.cache_->stats().memory_used, 0u);
  EXPECT_EQ(b.cache_->stats().checksum_failures, 1u);
  // The whole tier is free again: two full chunks fit.
  EXPECT_TRUE(copy_between(a, b, key(1), false).ok());
  EXPECT_TRUE(copy_between(a, b, key(2), false).ok());
  EXPECT_TRUE(b.retrieve(key(2), 1 << 20).ok());
}

TEST(CacheSharing, IngestRoomComesFromEvictionButNeverFromPinnedChunks) {
  CacheHarness a(small_memory(8, 1 << 20)), b(small_memory(2, 1 << 20));
  ASSERT_TRUE(a.store(key(1), 1 << 20).ok());
  ASSERT_TRUE(b.store(key(10), 1 << 20).ok());
  ASSERT_TRUE(b.store(key(11), 1 << 20).ok());
  const ChunkKey pinned[2] = {key(10), key(11)};
  ASSERT_EQ(b.cache_->lookup(pinned, 2, true), 2u);
  EXPECT_EQ(copy_between(a, b, key(1), false), Code::kNoMemory);
  EXPECT_EQ(b.cache_->stats().ingest_rejects, 1u);
  b.cache_->unpin(pinned, 2);
  EXPECT_TRUE(copy_between(a, b, key(1), false).ok());
  EXPECT_EQ(b.cache_->lookup(pinned, 1, false), 0u);  // the least recently used left
  EXPECT_TRUE(b.retrieve(key(11), 1 << 20).ok());
}

TEST(CacheSharing, PlacementsThatCannotBeThisCachesAreRefused) {
  CacheHarness b(small_memory(2, 1 << 20));
  uint8_t* dst;
  ChunkPlacement p{0, 4096, 4096, 0, false};
  p.stored = 2 << 20;
  p.size = 2 << 20;
  EXPECT_EQ(b.cache_->begin_ingest(key(1), p, &dst), Code::kTooBig);
  p = ChunkPlacement{0, 4096, 8192, 0, false};
  EXPECT_EQ(b.cache_->begin_ingest(key(1), p, &dst), Code::kInvalidValue);
  p = ChunkPlacement{0, 4096, 8192, 0, true};  // encoded, but this cache has no codec
  EXPECT_EQ(b.cache_->begin_ingest(key(1), p, &dst), Code::kNotSupported);
  p = ChunkPlacement{0, 0, 0, 0, false};
  EXPECT_EQ(b.cache_->begin_ingest(key(1), p, &dst), Code::kInvalidValue);
  EXPECT_EQ(b.cache_->stats().chunks, 0u);
  ChunkPlacement out;
  EXPECT_EQ(b.cache_->locate(key(1), &out), Code::kNotFound);
}

TEST(CacheSharing, LocatePinsAndSaysWhenOnlyTheDiskHasIt) {
  const std::string dir = cache_test::temp_dir("sharing");
  CacheHarness a(cache_test::with_disk(dir, 2, 8, 1 << 20));
  ASSERT_TRUE(a.store(key(1), 1 << 20).ok());
  ChunkPlacement p;
  ASSERT_TRUE(a.cache_->locate(key(1), &p).ok());
  // Pinned by locate: new stores wait or spill around it, never over it.
  ASSERT_TRUE(a.store(key(2), 1 << 20).ok());
  ASSERT_TRUE(a.store(key(3), 1 << 20).ok());
  a.settle();
  void* base;
  uint64_t len;
  a.cache_->arena(&base, &len);
  EXPECT_EQ(XXH3_64bits(static_cast<uint8_t*>(base) + p.offset, p.stored), p.checksum);
  const ChunkKey k1 = key(1);
  a.cache_->unpin(&k1, 1);
  ASSERT_TRUE(a.store(key(4), 1 << 20).ok());
  ASSERT_TRUE(a.store(key(5), 1 << 20).ok());
  a.settle();
  // key(1) is on disk only now: AGAIN until prefetched.
  ASSERT_TRUE(a.cache_->contains(key(1)));
  EXPECT_EQ(a.cache_->locate(key(1), &p), Code::kAgain);
  ASSERT_TRUE(a.prefetch(key(1)).ok());
  const Status st = a.cache_->locate(key(1), &p);
  EXPECT_TRUE(st.ok()) << st.name();
  a.cache_->unpin(&k1, 1);
  std::filesystem::remove_all(dir);
}

TEST(CacheSharing, ResidencyListenerHearsArrivalsAndDepartures) {
  CacheHarness a(small_memory(2, 1 << 20)), b(small_memory(4, 1 << 20));
  ASSERT_TRUE(a.store(key(1), 1 << 20).ok());
  Residency r;
  a.cache_->add_residency_listener(&Residency::on, &r, true);
  EXPECT_EQ(r.arrivals, 1);  // told of what is present on setting
  ASSERT_TRUE(a.store(key(2), 1 << 20).ok());
  ASSERT_TRUE(a.store(key(2), 1 << 20).ok());  // present already: no second arrival
  EXPECT_EQ(r.arrivals, 2);
  ASSERT_TRUE(a.store(key(3), 1 << 20).ok());  // evicts key(1)
  EXPECT_EQ(r.departures, 1);
  EXPECT_EQ(r.present.count(key(1).prefix_hash), 0u);
  ASSERT_TRUE(a.cache_->remove(key(2)).ok());
  EXPECT_EQ(r.departures, 2);
  // A failed store and a failed ingest are never announced, so never departed.
  ASSERT_TRUE(b.store(key(7), 1 << 20).ok());
  ChunkPlacement p;
  ASSERT_TRUE(b.cache_->locate(key(7), &p).ok());
  uint8_t* dst;
  ASSERT_TRUE(a.cache_->begin_ingest(key(7), p, &dst).ok());
  EXPECT_EQ(a.cache_->end_ingest(key(7), false), Code::kIoFailed);
  EXPECT_EQ(r.arrivals, 3);
  EXPECT_EQ(r.departures, 2);
  EXPECT_EQ(r.present, std::set<uint64_t>{key(3).prefix_hash});
  // A second listener without replay hears only what happens next; a removed
  // listener hears nothing more.
  Residency r2;
  a.cache_->add_residency_listener(&Residency::on, &r2, false);
  EXPECT_EQ(r2.arrivals, 0);
  ASSERT_TRUE(a.store(key(4), 1 << 20).ok());
  EXPECT_EQ(r.arrivals, 4);
  EXPECT_EQ(r2.arrivals, 1);
  a.cache_->remove_residency_listener(&Residency::on, &r);
  ASSERT_TRUE(a.cache_->remove(key(4)).ok());
  EXPECT_EQ(r.departures, 2);
  EXPECT_EQ(r2.departures, 1);
}

}  // namespace
}  // namespace dpukv

namespace dpukv {
namespace {

// A copy of a chunk another agent holds is first to go: the read it was fetched
// for does not make it recent; a second read does.
TEST(CacheSharing, IngestedCopiesLeaveBeforeChunksOfThisCache) {
  CacheHarness a(small_memory(8, 1 << 20)), b(small_memory(3, 1 << 20));
  ASSERT_TRUE(a.store(key(1), 1 << 20).ok());
  ASSERT_TRUE(a.store(key(2), 1 << 20).ok());
  ASSERT_TRUE(b.store(key(10), 1 << 20).ok());
  ASSERT_TRUE(b.store(key(11), 1 << 20).ok());
  ASSERT_TRUE(copy_between(a, b, key(1), false).ok());
  EXPECT_TRUE(b.retrieve(key(1), 1 << 20).ok());  // the read it came for
  ASSERT_TRUE(b.store(key(12), 1 << 20).ok());    // full: the copy leaves, not key 10
  EXPECT_FALSE(b.cache_->contains(key(1)));
  EXPECT_TRUE(b.cache_->contains(key(10)));
  // Read twice, a copy is as recent as any chunk.
  ASSERT_TRUE(copy_between(a, b, key(2), false).ok());  // evicts key 10 (least recent)
  EXPECT_TRUE(b.retrieve(key(2), 1 << 20).ok());
  EXPECT_TRUE(b.retrieve(key(2), 1 << 20).ok());
  ASSERT_TRUE(b.store(key(13), 1 << 20).ok());
  EXPECT_TRUE(b.cache_->contains(key(2)));
  EXPECT_FALSE(b.cache_->contains(key(11)));
}

}  // namespace
}  // namespace dpukv
