#include "tools/replay/optimum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace dpukv::replay {
namespace {

// The most block hits any cache of `cap` blocks can get, by trying every choice at
// every miss (cache it in a free slot, cache it in place of any block, or not
// cache it), memoised over (position, cached set). Ids are below 8.
uint64_t exhaustive_optimum(const std::vector<uint64_t>& refs, size_t cap) {
  std::map<std::pair<size_t, unsigned>, uint64_t> memo;
  auto best = [&](auto& self, size_t i, unsigned set) -> uint64_t {
    if (i == refs.size()) return 0;
    const auto k = std::make_pair(i, set);
    if (auto it = memo.find(k); it != memo.end()) return it->second;
    const unsigned bit = 1u << refs[i];
    uint64_t r;
    if (set & bit) {
      r = 1 + self(self, i + 1, set);
    } else {
      r = self(self, i + 1, set);  // not cached
      if (static_cast<size_t>(__builtin_popcount(set)) < cap)
        r = std::max(r, self(self, i + 1, set | bit));
      for (unsigned v = 0; v < 8; ++v)
        if (set & (1u << v)) r = std::max(r, self(self, i + 1, (set & ~(1u << v)) | bit));
    }
    memo[k] = r;
    return r;
  };
  return best(best, 0, 0);
}

std::vector<Request> one_block_requests(const std::vector<uint64_t>& refs) {
  std::vector<Request> reqs;
  for (uint64_t id : refs) reqs.push_back({0, 512, {id}});
  return reqs;
}

TEST(BeladyOptimum, EqualsAnExhaustiveSearchOnSmallTraces) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t len = 4 + rng() % 14, ids = 2 + rng() % 6, cap = 1 + rng() % 3;
    std::vector<uint64_t> refs(len);
    for (auto& r : refs) r = rng() % ids;
    const OptimumHits o = belady_optimum(one_block_requests(refs), cap);
    ASSERT_EQ(o.block_hits, exhaustive_optimum(refs, cap)) << "trial " << trial;
  }
}

// Conversations that come back with their prompt extended, as the traces' prefix
// chains do: the optimum's hits are all leading hits, never fewer than an LRU's of
// the same size, and with room for everything every re-reference is a hit.
TEST(BeladyOptimum, BoundsLruAndCountsLeadingHitsOnPrefixChains) {
  std::mt19937_64 rng(11);
  std::vector<std::vector<uint64_t>> chats(40);
  uint64_t next_id = 1;
  std::vector<Request> reqs;
  for (int i = 0; i < 3000; ++i) {
    auto& chat = chats[rng() % chats.size()];
    if (chat.empty()) chat.push_back(0);  // the shared system prompt
    for (uint64_t k = rng() % 3 + 1; k > 0; --k) chat.push_back(next_id++);
    reqs.push_back({0, static_cast<uint32_t>(512 * chat.size()), chat});
    if (rng() % 10 == 0) chat.clear();  // a new conversation in this seat
  }
  uint64_t ideal = 0;
  std::set<uint64_t> seen;
  for (const auto& r : reqs)
    for (uint64_t id : r.ids) ideal += seen.insert(id).second ? 0 : 1;
  for (uint64_t cap : {10u, 100u, 1000u}) {
    LruSim lru(cap);
    uint64_t lru_hits = 0;
    for (const auto& r : reqs) lru_hits += lru.access(r.ids);
    const OptimumHits o = belady_optimum(reqs, cap);
    EXPECT_EQ(o.prefix_hits, o.block_hits) << cap;
    EXPECT_GE(o.block_hits, lru_hits) << cap;
    EXPECT_LE(o.block_hits, ideal) << cap;
  }
  EXPECT_EQ(belady_optimum(reqs, 1u << 30).block_hits, ideal);
}

}  // namespace
}  // namespace dpukv::replay
