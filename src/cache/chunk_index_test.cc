#include "cache/chunk_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dpukv {
namespace {

// The chunk index against a reference map through many inserts and erases (the
// tombstones pass a quarter of the table again and again, so it is rebuilt in
// place many times): every key is found under the id it was given, an erased key
// is not, and ids come back for reuse; a full index refuses.
TEST(ChunkIndex, FindsWhatItHoldsThroughRebuildsAndRefusesWhenFull) {
  struct Keys {
    const std::vector<std::pair<bool, ChunkKey>>* slots;
    const ChunkKey* operator()(int32_t e) const {
      const auto& s = (*slots)[static_cast<size_t>(e)];
      return s.first ? &s.second : nullptr;
    }
  };
  constexpr uint32_t kCap = 257;
  std::vector<std::pair<bool, ChunkKey>> slots(kCap);
  ChunkIndex<Keys> index{Keys{&slots}};
  index.init(kCap);
  std::unordered_map<uint64_t, int32_t> ref;  // block id -> entry id
  std::mt19937_64 rng(7);
  auto k = [](uint64_t id) { return key_from_block_id(KeyContext{}, id); };
  for (int op = 0; op < 200000; ++op) {
    const uint64_t id = rng() % 600;
    auto it = ref.find(id);
    if (it == ref.end()) {
      ASSERT_EQ(index.find(k(id)), -1) << id;
      const int32_t e = index.insert(k(id));
      if (ref.size() == kCap) {
        ASSERT_EQ(e, -1);
        ASSERT_TRUE(index.full());
        continue;
      }
      ASSERT_GE(e, 0);
      ASSERT_LT(e, static_cast<int32_t>(kCap));
      ASSERT_FALSE(slots[static_cast<size_t>(e)].first) << "id " << e << " handed out twice";
      slots[static_cast<size_t>(e)] = {true, k(id)};
      ref[id] = e;
    } else {
      ASSERT_EQ(index.find(k(id)), it->second) << id;
      if (rng() % 2) {
        slots[static_cast<size_t>(it->second)].first = false;
        index.erase(it->second, k(id));
        ASSERT_EQ(index.find(k(id)), -1) << id;
        ref.erase(it);
      }
    }
  }
  for (const auto& [id, e] : ref) EXPECT_EQ(index.find(k(id)), e) << id;
}

}  // namespace
}  // namespace dpukv
