#include "cache/eviction_policies.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cache/arc_policy.h"
#include "cache/ghost_window.h"
#include "cache/policy_links.h"

namespace dpukv {
namespace {

using policy::Links;
using policy::Node;
using policy::Queue;

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(uint32_t n) : links_(n) {}
  const char* name() const override { return "lru"; }
  void insert(int32_t e, uint64_t, uint64_t bytes) override {
    links_[e].bytes = bytes;
    links_.push_front(q_, e);
  }
  void insert_cold(int32_t e, uint64_t, uint64_t bytes) override {
    links_[e].bytes = bytes;
    links_.push_back(q_, e);
  }
  void access(int32_t e) override {
    if (q_.head == e) return;
    links_.unlink(q_, e);
    links_.push_front(q_, e);
  }
  void remove(int32_t e) override { links_.unlink(q_, e); }
  int32_t victim(MayEvict may, const void* ctx) override { return links_.scan(q_, may, ctx); }
  int32_t coldest() const override { return q_.tail; }
  int32_t warmer(int32_t e) const override { return links_[e].prev; }
  uint64_t bytes_per_chunk() const override { return sizeof(Node); }

 private:
  Links links_;
  Queue q_;
};

// S3-FIFO's ghost queue as the paper (and the tests' model) has it: the hashes of
// the last `length` chunks evicted from the small queue, the oldest leaving first;
// a hit takes its hash out. Nodes come from a pool with room for the longest
// queue, linked oldest to newest and found through an open-addressing table of
// node numbers; nothing is allocated after construction.
class GhostFifo {
 public:
  explicit GhostFifo(size_t room) : nodes_(room) {
    size_t t = 1;
    while (t < 2 * room) t <<= 1;
    table_.assign(room == 0 ? 0 : t, kEmpty);
    free_.reserve(room);
    for (size_t n = room; n-- > 0;) free_.push_back(static_cast<uint32_t>(n));
  }
  size_t size() const { return size_; }
  size_t memory_bytes() const {
    return nodes_.size() * sizeof(GhostNode) + table_.size() * sizeof(uint32_t) +
           free_.capacity() * sizeof(uint32_t);
  }
  // True (and h gone) if h was in the queue.
  bool take(uint64_t h) {
    const size_t slot = find(h);
    if (slot == kNotFound) return false;
    drop(slot);
    return true;
  }
  // h joins as the newest; the oldest leave while `length` (at most the room) are in.
  void put(uint64_t h, size_t length) {
    if (nodes_.empty()) return;
    (void)take(h);  // at most once in the queue
    length = std::clamp<size_t>(length, 1, nodes_.size());
    while (size_ >= length) drop(find(nodes_[oldest_].hash));
    const uint32_t n = free_.back();
    free_.pop_back();
    nodes_[n] = {h, newest_, kNil};
    if (newest_ != kNil) nodes_[newest_].next = n;
    newest_ = n;
    if (oldest_ == kNil) oldest_ = n;
    ++size_;
    place(n);
  }

 private:
  struct GhostNode {
    uint64_t hash;
    uint32_t prev, next;  // toward the oldest, toward the newest
  };
  static constexpr uint32_t kNil = UINT32_MAX;
  static constexpr uint32_t kEmpty = UINT32_MAX, kTomb = UINT32_MAX - 1;
  static constexpr size_t kNotFound = SIZE_MAX;

  size_t mask() const { return table_.size() - 1; }
  size_t find(uint64_t h) const {
    if (table_.empty()) return kNotFound;
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      const uint32_t n = table_[i];
      if (n == kEmpty) return kNotFound;
      if (n != kTomb && nodes_[n].hash == h) return i;
    }
  }
  void place(uint32_t n) {
    size_t i = nodes_[n].hash & mask();
    while (table_[i] != kEmpty && table_[i] != kTomb) i = (i + 1) & mask();
    if (table_[i] == kTomb) --tombs_;
    table_[i] = n;
  }
  // Takes the node at table slot `slot` out of the queue.
  void drop(size_t slot) {
    const uint32_t n = table_[slot];
    table_[slot] = kTomb;
    ++tombs_;
    GhostNode& g = nodes_[n];
    (g.prev != kNil ? nodes_[g.prev].next : oldest_) = g.next;
    (g.next != kNil ? nodes_[g.next].prev : newest_) = g.prev;
    free_.push_back(n);
    --size_;
    if (tombs_ * 4 > table_.size()) rebuild();
  }
  // Tombstones lengthen probes: past a quarter of the table, place the queue anew.
  void rebuild() {
    std::fill(table_.begin(), table_.end(), kEmpty);
    tombs_ = 0;
    for (uint32_t n = oldest_; n != kNil; n = nodes_[n].next) place(n);
  }

  std::vector<GhostNode> nodes_;
  std::vector<uint32_t> table_;
  std::vector<uint32_t> free_;
  uint32_t oldest_ = kNil, newest_ = kNil;
  size_t size_ = 0, tombs_ = 0;
};

class S3FifoPolicy final : public EvictionPolicy {
 public:
  // max_ghosts: room for the ghost queue, allocated once; its length follows the
  // chunks the tier holds (at least kMinGhosts), as the paper sizes it.
  S3FifoPolicy(uint32_t n, uint64_t capacity, size_t max_ghosts)
      : links_(n), capacity_(capacity), hashes_(n, 0), ghosts_(max_ghosts) {}
  const char* name() const override { return "s3fifo"; }
  void insert(int32_t e, uint64_t key_hash, uint64_t bytes) override {
    Node& n = links_[e];
    n.bytes = bytes;
    n.freq = 0;
    // New chunks start in the small queue, unless evicted from it lately.
    n.small = !ghosts_.take(key_hash);
    links_.push_front(n.small ? small_ : main_, e);
    hashes_of(e) = key_hash;
    ++chunks_;
  }
  void access(int32_t e) override {
    Node& n = links_[e];
    if (n.freq < 3) ++n.freq;  // FIFO queues do not move on a hit
  }
  void remove(int32_t e) override {
    Queue& q = links_[e].small ? small_ : main_;
    if (q.head != e && links_[e].prev < 0) return;  // not linked
    links_.unlink(q, e);
    --chunks_;
  }
  // From the small queue while it holds over 10% of the tier (chunks hit there
  // move to the main queue; the others leave and are remembered in the ghost
  // queue), else from the main queue (chunks hit since their last pass get another
  // pass, one hit less).
  int32_t victim(MayEvict may, const void* ctx) override {
    for (size_t guard = 0; guard < 4 * hashes_.size() + 8; ++guard) {
      const bool from_small = small_.head >= 0 && (small_.bytes * 10 > capacity_ || main_.head < 0);
      int32_t v = links_.scan(from_small ? small_ : main_, may, ctx);
      bool in_small = from_small;
      if (v < 0) {
        v = links_.scan(from_small ? main_ : small_, may, ctx);
        in_small = !from_small;
      }
      if (v < 0) return -1;
      Node& n = links_[v];
      if (in_small) {
        links_.unlink(small_, v);
        n.small = false;
        if (n.freq > 0) {  // hit while new: promote
          n.freq = 0;
          links_.push_front(main_, v);
          continue;
        }
        links_.push_front(main_, v);  // linked for remove(); leaves at once
        ghosts_.put(hashes_of(v), ghost_length());
        return v;
      }
      if (n.freq > 0) {
        --n.freq;
        links_.unlink(main_, v);
        links_.push_front(main_, v);
        continue;
      }
      return v;
    }
    return -1;
  }
  int32_t coldest() const override { return main_.tail; }
  int32_t warmer(int32_t e) const override { return links_[e].prev; }
  uint64_t bytes_per_chunk() const override {
    return sizeof(Node) + sizeof(uint64_t) +
           ghosts_.memory_bytes() / std::max<size_t>(hashes_.size(), 1);
  }

  static constexpr size_t kMinGhosts = 1024;

 private:
  uint64_t& hashes_of(int32_t e) { return hashes_[static_cast<size_t>(e)]; }
  // As many ghosts as the tier holds chunks now (its bytes over their mean size).
  size_t ghost_length() const {
    const uint64_t held = small_.bytes + main_.bytes;
    const uint64_t mean = std::max<uint64_t>(held / std::max<uint64_t>(chunks_, 1), 1);
    return std::max<size_t>(kMinGhosts, capacity_ / mean);
  }

  Links links_;
  uint64_t capacity_;
  Queue small_, main_;
  uint64_t chunks_ = 0;           // in the small and main queues
  std::vector<uint64_t> hashes_;  // key hash per entry (for the ghost queue)
  GhostFifo ghosts_;
};

}  // namespace

namespace {

std::unique_ptr<EvictionPolicy> lru_from(const EvictionPolicySizing& s) {
  return make_lru_policy(s.max_chunks);
}

// The most chunks a memory tier of `capacity_bytes` is sized for: chunks of 16 KiB
// (LMCache's are 256 KiB and up), and never more than the chunk table's entries.
// Ghost memory is allocated for that many; the lengths follow the chunks held.
uint64_t chunks_sized_for(uint32_t max_chunks, uint64_t capacity_bytes) {
  return std::max<uint64_t>(std::min<uint64_t>(max_chunks, capacity_bytes / (16 << 10)), 1);
}

std::unique_ptr<EvictionPolicy> s3fifo_from(const EvictionPolicySizing& s) {
  return make_s3fifo_policy(s.max_chunks, s.capacity_bytes,
                            std::max<uint64_t>(chunks_sized_for(s.max_chunks, s.capacity_bytes),
                                               S3FifoPolicy::kMinGhosts));
}

std::unique_ptr<EvictionPolicy> arc_from(const EvictionPolicySizing& s) {
  return make_arc_policy(s.max_chunks, s.capacity_bytes);
}

constexpr EvictionPolicyInfo kPolicies[] = {
    {"arc", "ARC: chunks used once and chunks used again, balanced by what left each lately",
     &arc_from},
    {"lru", "least recently used leaves first", &lru_from},
    {"s3fifo", "S3-FIFO: one-time chunks leave before the working set", &s3fifo_from},
};

}  // namespace

std::span<const EvictionPolicyInfo> eviction_policies() {
  return kPolicies;
}

const EvictionPolicyInfo* find_eviction_policy(std::string_view name) {
  for (const EvictionPolicyInfo& p : kPolicies)
    if (name == p.name) return &p;
  return nullptr;
}

std::string eviction_policy_names(std::string_view sep) {
  std::string out;
  for (const EvictionPolicyInfo& p : kPolicies) {
    if (!out.empty()) out += sep;
    out += p.name;
  }
  return out;
}

std::unique_ptr<EvictionPolicy> make_lru_policy(uint32_t max_chunks) {
  return std::make_unique<LruPolicy>(max_chunks);
}

std::unique_ptr<EvictionPolicy> make_s3fifo_policy(uint32_t max_chunks, uint64_t capacity_bytes,
                                                   size_t ghosts) {
  return std::make_unique<S3FifoPolicy>(max_chunks, capacity_bytes, ghosts);
}

std::unique_ptr<EvictionPolicy> make_arc_policy(uint32_t max_chunks, uint64_t capacity_bytes) {
  return std::make_unique<ArcPolicy<GhostWindow>>(
      max_chunks, capacity_bytes, kArcGhostFactor * chunks_sized_for(max_chunks, capacity_bytes));
}

}  // namespace dpukv
