#include "cluster/lent_pins.h"

#include <iterator>

namespace dpukv {

void LentPins::lend(uint64_t reader, uint64_t request, std::vector<ChunkKey> keys,
                    uint64_t now_ms) {
  auto [it, fresh] = lent_.try_emplace({reader, request});
  if (!fresh) cache_->unpin(it->second.keys.data(), static_cast<uint32_t>(it->second.keys.size()));
  it->second.deadline_ms = now_ms + timeout_ms_;
  it->second.keys = std::move(keys);
}

bool LentPins::give_back(uint64_t reader, uint64_t request) {
  auto it = lent_.find({reader, request});
  if (it == lent_.end()) return false;
  unpin(it);
  return true;
}

uint64_t LentPins::expire(uint64_t now_ms) {
  uint64_t chunks = 0;
  for (auto it = lent_.begin(); it != lent_.end();) {
    auto next = std::next(it);
    if (now_ms >= it->second.deadline_ms) {
      chunks += it->second.keys.size();
      unpin(it);
    }
    it = next;
  }
  return chunks;
}

void LentPins::give_all_back() {
  while (!lent_.empty()) unpin(lent_.begin());
}

bool LentPins::lends_to(uint64_t reader) const {
  auto it = lent_.lower_bound({reader, 0});
  return it != lent_.end() && it->first.first == reader;
}

void LentPins::unpin(Map::iterator it) {
  cache_->unpin(it->second.keys.data(), static_cast<uint32_t>(it->second.keys.size()));
  lent_.erase(it);
}

}  // namespace dpukv
