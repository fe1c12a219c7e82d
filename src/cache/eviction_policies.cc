#include "cache/eviction_policies.h"

#include <algorithm>
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

class S3FifoPolicy final : public EvictionPolicy {
 public:
  S3FifoPolicy(uint32_t n, uint64_t capacity, size_t ghosts)
      : links_(n), capacity_(capacity), hashes_(n, 0), ghost_ring_(ghosts, 0) {
    size_t t = 1;
    while (t < 2 * ghosts) t <<= 1;
    ghost_table_.assign(t, 0);
  }
  const char* name() const override { return "s3fifo"; }
  void insert(int32_t e, uint64_t key_hash, uint64_t bytes) override {
    Node& n = links_[e];
    n.bytes = bytes;
    n.freq = 0;
    // New chunks start in the small queue, unless evicted from it lately.
    n.small = !ghost_take(key_hash);
    links_.push_front(n.small ? small_ : main_, e);
    hashes_of(e) = key_hash;
  }
  void access(int32_t e) override {
    Node& n = links_[e];
    if (n.freq < 3) ++n.freq;  // FIFO queues do not move on a hit
  }
  void remove(int32_t e) override { links_.unlink(links_[e].small ? small_ : main_, e); }
  // From the small queue while it holds over 10% of the tier (chunks hit there
  // move to the main queue; the others leave and are remembered in the ghost
  // list), else from the main queue (chunks hit since their last pass get another
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
        ghost_put(hashes_of(v));
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
  uint64_t bytes_per_chunk() const override { return sizeof(Node) + sizeof(uint64_t); }

 private:
  uint64_t& hashes_of(int32_t e) { return hashes_[static_cast<size_t>(e)]; }
  bool ghost_take(uint64_t h);
  void ghost_put(uint64_t h);

  Links links_;
  uint64_t capacity_;
  Queue small_, main_;
  std::vector<uint64_t> hashes_;  // key hash per entry (for the ghost list)
  std::vector<uint64_t> ghost_ring_;
  std::vector<uint64_t> ghost_table_;  // open addressing of hashes; 0 empty, 1 tombstone
  size_t ghost_next_ = 0;
};

bool S3FifoPolicy::ghost_take(uint64_t h) {
  if (ghost_table_.empty()) return false;
  h |= 2;  // 0 and 1 are markers
  const uint64_t mask = ghost_table_.size() - 1;
  for (uint64_t i = h & mask;; i = (i + 1) & mask) {
    if (ghost_table_[i] == 0) return false;
    if (ghost_table_[i] == h) {
      ghost_table_[i] = 1;
      return true;
    }
  }
}

void S3FifoPolicy::ghost_put(uint64_t h) {
  if (ghost_ring_.empty()) return;
  h |= 2;
  const uint64_t mask = ghost_table_.size() - 1;
  // The ring's oldest hash leaves the table.
  const uint64_t old = ghost_ring_[ghost_next_];
  if (old != 0) {
    for (uint64_t i = old & mask;; i = (i + 1) & mask) {
      if (ghost_table_[i] == 0) break;
      if (ghost_table_[i] == old) {
        ghost_table_[i] = 1;
        break;
      }
    }
  }
  ghost_ring_[ghost_next_] = h;
  ghost_next_ = (ghost_next_ + 1) % ghost_ring_.size();
  uint64_t i = h & mask;
  while (ghost_table_[i] > 1) i = (i + 1) & mask;
  ghost_table_[i] = h;
  // Tombstones pile up in a long run: rebuild from the ring now and then.
  if (ghost_next_ == 0) {
    std::fill(ghost_table_.begin(), ghost_table_.end(), 0);
    for (uint64_t g : ghost_ring_) {
      if (g == 0) continue;
      uint64_t j = g & mask;
      while (ghost_table_[j] > 1) j = (j + 1) & mask;
      ghost_table_[j] = g;
    }
  }
}

}  // namespace

namespace {

std::unique_ptr<EvictionPolicy> lru_from(const EvictionPolicySizing& s) {
  return make_lru_policy(s.max_chunks);
}

std::unique_ptr<EvictionPolicy> s3fifo_from(const EvictionPolicySizing& s) {
  // As many ghosts as the tier holds chunks of the largest size (at least 1024).
  const uint64_t fit = s.largest_chunk == 0 ? 0 : s.capacity_bytes / s.largest_chunk;
  return make_s3fifo_policy(s.max_chunks, s.capacity_bytes, std::max<uint64_t>(fit, 1024));
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
  // The windows' memory is sized for the most chunks the tier can hold (the entry
  // ids); their length follows the chunks actually held (arc_policy.h).
  return std::make_unique<ArcPolicy<GhostWindow>>(max_chunks, capacity_bytes,
                                                  kArcGhostFactor * max_chunks);
}

}  // namespace dpukv
