// The chunk table alone, without the cache engine: ids handed out and taken back,
// which copy states make a chunk present or busy, the disk queue's order and byte
// count, and the residency feed's arrivals, departures and replay.
#include "cache/chunk_table.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace dpukv {
namespace {

ChunkKey key(uint64_t n) {
  ChunkKey k;
  k.model = 7;
  k.prefix_hash = n;
  return k;
}

TEST(ChunkTable, IdsAreHandedOutUntilFullAndTakenBack) {
  ChunkTable t;
  t.init(4);
  std::set<int32_t> ids;
  for (uint64_t i = 0; i < 4; ++i) {
    const int32_t e = t.insert(key(i));
    ASSERT_GE(e, 0);
    ASSERT_LT(e, 4);
    EXPECT_TRUE(ids.insert(e).second) << "id handed out twice";
    EXPECT_TRUE(t.at(e).used);
    EXPECT_EQ(t.at(e).key, key(i));
  }
  EXPECT_EQ(t.insert(key(9)), -1) << "every id is in use";
  for (uint64_t i = 0; i < 4; ++i) EXPECT_GE(t.find(key(i)), 0);
  EXPECT_EQ(t.find(key(9)), -1);
  EXPECT_EQ(t.counts().chunks, 4u);

  const int32_t gone = t.find(key(2));
  t.erase(gone);
  EXPECT_EQ(t.find(key(2)), -1);
  EXPECT_FALSE(t.at(gone).used);
  t.erase(gone);  // a bug in the caller: logged, and the free list stays whole
  EXPECT_EQ(t.counts().chunks, 3u);
  const int32_t again = t.insert(key(10));
  EXPECT_EQ(again, gone);
  EXPECT_EQ(t.insert(key(11)), -1) << "the double erase must not have freed a second id";
  // A reused id starts clean.
  EXPECT_EQ(t.at(again).memory, ChunkEntry::Memory::kNone);
  EXPECT_EQ(t.at(again).disk, ChunkEntry::Disk::kNone);
  EXPECT_EQ(t.at(again).pins, 0u);
}

TEST(ChunkTable, OnlyReadyCopiesArePresentAndCopiesUnderWayAreBusy) {
  using M = ChunkEntry::Memory;
  using D = ChunkEntry::Disk;
  ChunkEntry en;
  const struct {
    M memory;
    D disk;
    bool present, busy, has_memory;
  } cases[] = {
      {M::kNone, D::kNone, false, false, false},  {M::kAwaitingRoom, D::kNone, false, true, false},
      {M::kFilling, D::kNone, false, true, true}, {M::kIngesting, D::kNone, false, true, true},
      {M::kReady, D::kNone, true, false, true},   {M::kReady, D::kWriting, true, true, true},
      {M::kReady, D::kReady, true, false, true},  {M::kNone, D::kReady, true, false, false},
      {M::kFilling, D::kReady, true, true, true},  // a reload
  };
  for (const auto& c : cases) {
    en.memory = c.memory;
    en.disk = c.disk;
    SCOPED_TRACE(testing::Message() << "memory " << static_cast<int>(c.memory) << " disk "
                                    << static_cast<int>(c.disk));
    EXPECT_EQ(en.present(), c.present);
    EXPECT_EQ(en.busy(0), c.busy);
    EXPECT_EQ(en.has_memory(), c.has_memory);
  }
  en.memory = M::kReady;
  en.disk = D::kNone;
  en.readers = 1;
  EXPECT_TRUE(en.busy(0)) << "a copy out of it is under way";
  en.readers = 0;
  en.pins = 1;
  en.pin_deadline = 100;
  EXPECT_TRUE(en.busy(99));
  EXPECT_FALSE(en.busy(100)) << "an expired pin holds nothing";
}

std::vector<uint64_t> coldest_first(const ChunkTable& t) {
  std::vector<uint64_t> out;
  for (int32_t e = t.disk_coldest(); e >= 0; e = t.disk_warmer(e))
    out.push_back(t.at(e).key.prefix_hash);
  return out;
}

TEST(ChunkTable, TheDiskQueueKeepsItsOrderAndBytes) {
  ChunkTable t;
  t.init(8);
  int32_t e[5];
  for (uint64_t i = 0; i < 5; ++i) {
    e[i] = t.insert(key(i));
    t.at(e[i]).stored = 100 * (i + 1);
  }
  t.disk_push_front(e[0]);
  t.disk_push_front(e[1]);
  t.disk_push_front(e[2]);
  t.disk_push_back(e[3]);  // a reloaded chunk's redundant copy: first to go
  EXPECT_EQ(coldest_first(t), (std::vector<uint64_t>{3, 0, 1, 2}));
  EXPECT_EQ(t.disk_queue_bytes(), 100u + 200 + 300 + 400);

  t.disk_unlink(e[0]);  // the middle
  t.disk_unlink(e[0]);  // not linked: nothing
  t.disk_unlink(e[4]);  // never linked: nothing
  EXPECT_EQ(coldest_first(t), (std::vector<uint64_t>{3, 1, 2}));
  EXPECT_EQ(t.disk_queue_bytes(), 200u + 300 + 400);

  t.erase(e[3]);  // erasing takes a chunk off the queue
  t.erase(e[2]);
  EXPECT_EQ(coldest_first(t), (std::vector<uint64_t>{1}));
  EXPECT_EQ(t.disk_queue_bytes(), 200u);
  t.disk_unlink(e[1]);
  EXPECT_EQ(t.disk_coldest(), -1);
  EXPECT_EQ(t.disk_queue_bytes(), 0u);
}

struct Feed {
  std::vector<std::pair<uint64_t, bool>> told;
  static void on(void* arg, const ChunkKey& k, bool present) {
    static_cast<Feed*>(arg)->told.emplace_back(k.prefix_hash, present);
  }
};

TEST(ChunkTable, TheResidencyFeedTellsArrivalsDeparturesAndReplays) {
  ChunkTable t;
  t.init(8);
  Feed a, b;
  t.add_listener(&Feed::on, &a, false);
  const int32_t e1 = t.insert(key(1));
  t.at(e1).memory = ChunkEntry::Memory::kReady;
  t.announce(e1);
  const int32_t e2 = t.insert(key(2));  // present but not announced yet
  t.at(e2).disk = ChunkEntry::Disk::kReady;
  const int32_t e3 = t.insert(key(3));  // being filled: not present
  t.at(e3).memory = ChunkEntry::Memory::kFilling;
  EXPECT_EQ(a.told, (std::vector<std::pair<uint64_t, bool>>{{1, true}}));

  // Replay: b hears of both present chunks; 2 is announced now, so a hears it too.
  t.add_listener(&Feed::on, &b, true);
  EXPECT_EQ(b.told, (std::vector<std::pair<uint64_t, bool>>{{1, true}, {2, true}}));
  EXPECT_EQ(a.told, (std::vector<std::pair<uint64_t, bool>>{{1, true}, {2, true}}));

  t.erase(e3);  // never announced: nobody hears of it
  t.erase(e1);
  EXPECT_EQ(b.told.back(), (std::pair<uint64_t, bool>{1, false}));
  EXPECT_EQ(a.told.back(), (std::pair<uint64_t, bool>{1, false}));
  t.remove_listener(&Feed::on, &a);
  t.erase(e2);
  EXPECT_EQ(a.told.size(), 3u) << "a removed listener hears nothing";
  EXPECT_EQ(b.told.back(), (std::pair<uint64_t, bool>{2, false}));

  const ChunkTable::Counts c = t.counts();
  EXPECT_EQ(c.chunks, 0u);
  EXPECT_EQ(c.memory + c.disk + c.both, 0u);
}

TEST(ChunkTable, CountsAreOfReadyCopies) {
  ChunkTable t;
  t.init(8);
  t.at(t.insert(key(1))).memory = ChunkEntry::Memory::kReady;
  t.at(t.insert(key(2))).disk = ChunkEntry::Disk::kReady;
  const int32_t both = t.insert(key(3));
  t.at(both).memory = ChunkEntry::Memory::kReady;
  t.at(both).disk = ChunkEntry::Disk::kReady;
  t.at(t.insert(key(4))).memory = ChunkEntry::Memory::kFilling;
  t.at(t.insert(key(5))).disk = ChunkEntry::Disk::kWriting;
  const ChunkTable::Counts c = t.counts();
  EXPECT_EQ(c.chunks, 5u);
  EXPECT_EQ(c.memory, 2u);
  EXPECT_EQ(c.disk, 2u);
  EXPECT_EQ(c.both, 1u);
}

}  // namespace
}  // namespace dpukv
