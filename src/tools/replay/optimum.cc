#include "tools/replay/optimum.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <unordered_map>
#include <utility>

namespace dpukv::replay {

OptimumHits belady_optimum(const std::vector<Request>& reqs, uint64_t capacity) {
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  size_t refs = 0;
  for (const Request& r : reqs) refs += r.ids.size();
  // next[i]: the position of the next reference to the block referenced at i.
  std::vector<uint64_t> next(refs);
  {
    std::unordered_map<uint64_t, uint64_t> later;
    later.reserve(refs);
    size_t i = refs;
    for (auto r = reqs.rbegin(); r != reqs.rend(); ++r)
      for (auto id = r->ids.rbegin(); id != r->ids.rend(); ++id) {
        --i;
        auto [it, fresh] = later.try_emplace(*id, i);
        next[i] = fresh ? kNever : it->second;
        it->second = i;
      }
  }
  // The cached blocks by their next use; the heap keeps stale pairs until they
  // reach its top (a block's pair is current while cached[id] equals its time).
  std::unordered_map<uint64_t, uint64_t> cached;
  cached.reserve(std::min<uint64_t>(capacity, refs) * 2);
  std::priority_queue<std::pair<uint64_t, uint64_t>> furthest;
  OptimumHits out;
  size_t i = 0;
  for (const Request& r : reqs) {
    bool prefix = true;
    for (uint64_t id : r.ids) {
      const uint64_t nu = next[i++];
      auto it = cached.find(id);
      if (it != cached.end()) {
        ++out.block_hits;
        out.prefix_hits += prefix ? 1 : 0;
        it->second = nu;
        furthest.emplace(nu, id);
        continue;
      }
      prefix = false;
      if (nu == kNever) continue;
      if (cached.size() >= capacity) {
        for (;;) {  // drop stale pairs: blocks gone, or used since
          const auto c = cached.find(furthest.top().second);
          if (c != cached.end() && c->second == furthest.top().first) break;
          furthest.pop();
        }
        const auto [far, victim] = furthest.top();
        if (far <= nu) continue;  // everything cached is used sooner: do not cache this one
        furthest.pop();
        cached.erase(victim);
      }
      cached.emplace(id, nu);
      furthest.emplace(nu, id);
    }
  }
  return out;
}

}  // namespace dpukv::replay
