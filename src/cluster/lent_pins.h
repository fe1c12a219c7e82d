// The pins a holder has lent to readers: with a PLACED, the chunks a reader may
// read one-sided stay pinned in this agent's cache until that reader's UNPIN of
// that request gives them back, or the lend times out (a reader that died, or
// never read). An UNPIN names its request, not keys, so no reader can give back
// another's pins, and each pin goes back once. Not thread safe: the cluster
// node's thread.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cache/cache_engine.h"

namespace dpukv {

class LentPins {
 public:
  LentPins(CacheEngine* cache, uint32_t timeout_ms) : cache_(cache), timeout_ms_(timeout_ms) {}
  ~LentPins() { give_all_back(); }
  LentPins(const LentPins&) = delete;
  LentPins& operator=(const LentPins&) = delete;

  // keys were pinned for reader's request (already, by the cache's locate). The
  // same request lent twice: the earlier pins go back first.
  void lend(uint64_t reader, uint64_t request, std::vector<ChunkKey> keys, uint64_t now_ms);
  // reader's UNPIN of request; false if nothing is lent under it (a late or
  // foreign UNPIN: nothing is given back).
  bool give_back(uint64_t reader, uint64_t request);
  // Gives back every lend whose deadline has passed; the chunks given back.
  uint64_t expire(uint64_t now_ms);
  void give_all_back();
  bool lends_to(uint64_t reader) const;
  bool empty() const { return lent_.empty(); }

 private:
  struct Lend {
    uint64_t deadline_ms = 0;
    std::vector<ChunkKey> keys;
  };
  using Map = std::map<std::pair<uint64_t, uint64_t>, Lend>;  // (reader, request)
  void unpin(Map::iterator it);

  CacheEngine* cache_;
  uint32_t timeout_ms_;
  Map lent_;
};

}  // namespace dpukv
