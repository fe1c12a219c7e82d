#include "cache/eviction_policies.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <list>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/arc_policy.h"
#include "cache/cache_test_trace.h"
#include "testing/cache_test_harness.h"

namespace dpukv {
namespace {

using namespace cache_test;

// ------------------------------------------------------------------------ ARC

// ARC as cache/arc_policy.h defines it, written over std::list by chunk id: T1
// and T2 (front = most recent), the ghost windows B1 and B2 (the last `ghosts`
// chunks to leave each; a hit does not delete), p, and REPLACE's tie rule.
struct RefArc {
  RefArc(size_t chunks, size_t ghosts) : c(chunks), g(ghosts) {}
  size_t c, g, p = 0;
  bool last_from_b2 = false;
  std::list<uint64_t> t1, t2;
  std::deque<uint64_t> b1, b2;  // back = newest

  template <typename L>
  static bool in(const L& l, uint64_t id) {
    return std::find(l.begin(), l.end(), id) != l.end();
  }
  bool present(uint64_t id) const { return in(t1, id) || in(t2, id); }
  void ghost(std::deque<uint64_t>& b, uint64_t id) {
    b.push_back(id);
    if (b.size() > g) b.pop_front();
  }
  void insert(uint64_t id) {
    const size_t g1 = b1.size(), g2 = b2.size();
    last_from_b2 = false;
    if (in(b2, id)) {
      const size_t d = std::max<size_t>(g1 / std::max<size_t>(g2, 1), 1);
      p = p > d ? p - d : 0;
      t2.push_front(id);
      last_from_b2 = true;
    } else if (in(b1, id)) {
      p = std::min(c, p + std::max<size_t>(g2 / std::max<size_t>(g1, 1), 1));
      t2.push_front(id);
    } else {
      t1.push_front(id);
    }
  }
  void insert_cold(uint64_t id) { t1.push_back(id); }
  void access(uint64_t id) {
    if (in(t1, id))
      t1.remove(id);
    else
      t2.remove(id);
    t2.push_front(id);
  }
  void remove(uint64_t id) {
    if (in(t1, id)) {
      t1.remove(id);
      ghost(b1, id);
    } else if (in(t2, id)) {
      t2.remove(id);
      ghost(b2, id);
    }
  }
  template <typename May>
  int64_t victim(May may) const {
    const bool from_t1 =
        !t1.empty() && (t1.size() > p || (last_from_b2 && t1.size() == p) || t2.empty());
    auto scan = [&](const std::list<uint64_t>& l) -> int64_t {
      for (auto it = l.rbegin(); it != l.rend(); ++it)
        if (may(*it)) return static_cast<int64_t>(*it);
      return -1;
    };
    const int64_t v = scan(from_t1 ? t1 : t2);
    return v >= 0 ? v : scan(from_t1 ? t2 : t1);
  }
};

// The exact ghost window the policy is checked with: the last `capacity` hashes
// put, by count (GhostWindow approximates it with Bloom filters).
class ExactWindow {
 public:
  explicit ExactWindow(size_t max_capacity) : max_(max_capacity), cap_(max_capacity) {}
  bool contains(uint64_t h) const { return count_.count(h) != 0; }
  void set_capacity(size_t c) { cap_ = std::clamp<size_t>(c, 1, max_); }
  void put(uint64_t h) {
    q_.push_back(h);
    ++count_[h];
    while (q_.size() > cap_) {
      if (--count_[q_.front()] == 0) count_.erase(q_.front());
      q_.pop_front();
    }
  }
  size_t size() const { return q_.size(); }
  size_t memory_bytes() const { return 0; }

 private:
  size_t max_, cap_;
  std::deque<uint64_t> q_;
  std::unordered_map<uint64_t, int> count_;
};

// Chunk ids stand for entry ids; their key hashes are spread so fingerprints differ.
uint64_t hash_of(uint64_t id) {
  return (id + 1) * 0x9E3779B97F4A7C15ull;
}

// Drives the policy and the model with one sequence of ids (a miss inserts, after
// the victim leaves when c chunks are in; a hit is an access) and checks that every
// victim is the same. `pinned` ids may not be evicted while pinned. The policy
// counts bytes (chunks of `chunk` bytes in a tier of c of them), the model chunks.
// *max_p: the largest target size of T1 seen, in chunks (0: the ghost lists never
// taught it).
void drive_arc(const std::vector<uint64_t>& ids, size_t c, uint32_t max_id,
               const std::vector<uint8_t>& pinned, uint64_t* hits, size_t* max_p,
               uint64_t chunk = 4096) {
  // Ghost windows allowed far longer than the 4c the policy asks of them.
  ArcPolicy<ExactWindow> policy(max_id, c * chunk, kArcGhostFactor * max_id);
  EvictionPolicy* pol = &policy;
  RefArc ref(c, kArcGhostFactor * c);
  std::unordered_set<uint64_t> cached;
  struct Ctx {
    const std::vector<uint8_t>* pinned;
  } ctx{&pinned};
  auto may = [](const void* x, int32_t e) {
    const auto* p = static_cast<const Ctx*>(x)->pinned;
    return p->empty() || (*p)[static_cast<size_t>(e)] == 0;
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t id = ids[i];
    ASSERT_EQ(cached.count(id) != 0, ref.present(id));
    if (cached.count(id)) {
      pol->access(static_cast<int32_t>(id));
      ref.access(id);
      ++*hits;
      continue;
    }
    if (cached.size() >= c) {
      const int32_t v = pol->victim(may, &ctx);
      const int64_t rv = ref.victim([&](uint64_t x) { return may(&ctx, static_cast<int32_t>(x)); });
      ASSERT_EQ(v, rv) << "reference " << i << " of " << ids.size();
      if (v < 0) continue;  // all pinned: the chunk is not cached
      pol->remove(v);
      ref.remove(static_cast<uint64_t>(v));
      cached.erase(static_cast<uint64_t>(v));
    }
    pol->insert(static_cast<int32_t>(id), hash_of(id), chunk);
    ref.insert(id);
    cached.insert(id);
    EXPECT_EQ(policy.target_t1(), ref.p * chunk);
    *max_p = std::max(*max_p, ref.p);
  }
}

TEST(ArcPolicy, MatchesTheReferenceModelOnRandomSkewedReferences) {
  for (size_t c : {1u, 4u, 32u, 100u}) {
    std::mt19937_64 rng(c);
    std::vector<uint64_t> ids;
    // A hot set, a warm set, and a scan of one-time chunks, interleaved.
    for (int i = 0; i < 20000; ++i) {
      const uint64_t r = rng() % 10;
      ids.push_back(r < 4   ? rng() % (c / 2 + 1)
                    : r < 7 ? 100 + rng() % (3 * c)
                            : 1000 + rng() % 3000);
    }
    std::vector<uint8_t> pinned(4000, 0);
    for (size_t i = 0; i < pinned.size(); i += 7) pinned[i] = 1;  // some may not go
    uint64_t hits = 0;
    size_t max_p = 0;
    drive_arc(ids, c, 4000, {}, &hits, &max_p);
    EXPECT_GT(hits, 0u);
    if (c > 1) {
      EXPECT_GT(max_p, 0u) << c;
    }
    drive_arc(ids, c, 4000, pinned, &hits, &max_p);
  }
}

// The replay's own pattern on the repo's real trace: every block of a request,
// in order, at a capacity far below the working set.
TEST(ArcPolicy, MatchesTheReferenceModelOnTheConversationTrace) {
  const std::vector<uint64_t> ids = conversation_trace_refs(1500);
  uint64_t max_id = 0;
  for (uint64_t id : ids) max_id = std::max(max_id, id);
  ASSERT_GT(ids.size(), 10000u);
  uint64_t hits = 0;
  size_t max_p = 0;
  drive_arc(ids, 300, static_cast<uint32_t>(max_id + 1), {}, &hits, &max_p);
  EXPECT_GT(max_p, 0u);  // B1 hits moved p
  EXPECT_GT(hits, 0u);
}

// A copy of another agent's chunk (insert_cold) is T1's first to leave.
TEST(ArcPolicy, ColdInsertLeavesFirstAndWriteBackWalksT1ThenT2) {
  ArcPolicy<ExactWindow> arc(16, 4, 16);
  EvictionPolicy* pol = &arc;
  auto all = [](const void*, int32_t) { return true; };
  pol->insert(0, hash_of(0), 1);
  pol->insert(1, hash_of(1), 1);
  pol->access(1);  // 1 into T2
  pol->insert(2, hash_of(2), 1);
  pol->insert_cold(3, hash_of(3), 1);
  EXPECT_EQ(pol->victim(all, nullptr), 3);
  std::vector<int32_t> walk;
  for (int32_t e = pol->coldest(); e >= 0; e = pol->warmer(e)) walk.push_back(e);
  EXPECT_EQ(walk, (std::vector<int32_t>{3, 0, 2, 1}));
  // The production policy's memory: its links, a hash, and 2.5 bytes per ghost.
  EXPECT_LE(make_arc_policy(4096, 4096)->bytes_per_chunk(), 24u + 8u + 2 * 4 * 3u);
}

// ARC through the cache engine: the engine keeps in memory exactly the chunks a
// second ARC policy keeps when the test drives it with the same stores, retrieves
// and removes (a miss inserts after the victim leaves; a hit is an access). The
// tier holds `slots` chunks of `chunk` bytes; the largest chunk allowed is
// `max_chunk`.
void engine_keeps_what_arc_keeps(uint64_t slots, uint64_t chunk, uint64_t max_chunk) {
  CacheOptions o = small_memory(slots, chunk);
  o.max_chunk_bytes = max_chunk;
  o.policy = "arc";
  CacheHarness h(o);
  const uint64_t hot = slots / 2, ids = hot + 3 * slots;
  auto pol = make_arc_policy(static_cast<uint32_t>(ids), slots * chunk);
  std::unordered_set<uint64_t> cached;
  auto all = [](const void*, int32_t) { return true; };
  auto miss = [&](uint64_t id) {
    if (cached.size() >= slots) {
      const int32_t v = pol->victim(all, nullptr);
      ASSERT_GE(v, 0);
      pol->remove(v);
      cached.erase(static_cast<uint64_t>(v));
    }
    pol->insert(static_cast<int32_t>(id), key(id).hash(), chunk);
    cached.insert(id);
  };
  std::mt19937_64 rng(7);
  uint64_t hits = 0;
  for (uint64_t op = 0; op < 200 * slots; ++op) {
    const uint64_t id = (rng() % 3 == 0) ? rng() % hot : hot + rng() % (3 * slots);
    const int kind = static_cast<int>(rng() % 10);
    const bool present = cached.count(id) != 0;
    if (kind < 5) {
      ASSERT_TRUE(h.store(key(id), chunk).ok());
      if (present)
        pol->access(static_cast<int32_t>(id));
      else
        miss(id);
    } else if (kind < 9) {
      Status st = h.retrieve(key(id), chunk);
      ASSERT_EQ(st.ok(), present) << "op " << op << " id " << id;
      if (present) pol->access(static_cast<int32_t>(id)), ++hits;
    } else if (present) {
      ASSERT_TRUE(h.cache_->remove(key(id)).ok());
      pol->remove(static_cast<int32_t>(id));
      cached.erase(id);
    }
    ASSERT_EQ(h.cache_->stats().memory_chunks, cached.size()) << "op " << op;
  }
  EXPECT_GT(hits, 0u);
  EXPECT_GT(h.cache_->stats().evictions, 0u);
}

TEST(ArcPolicy, TheCacheEngineKeepsWhatThePolicyDrivenDirectlyKeeps) {
  engine_keeps_what_arc_keeps(20, 256 << 10, 256 << 10);
}

// Chunks 64 times smaller than the largest allowed (LMCache's per-layer chunks
// under the default 64 MiB limit): the engine's ARC is still ARC over the chunks
// the tier holds. Sized by the largest chunk, its T1 was two chunks here.
TEST(ArcPolicy, ChunksFarBelowTheLargestAllowedGetTheSameArc) {
  engine_keeps_what_arc_keeps(128, 64 << 10, 4 << 20);
}

}  // namespace
}  // namespace dpukv
