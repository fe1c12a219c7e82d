// This node's copy of the cluster directory, kept from the directory's event
// channel and a scan of the entries when it (re)subscribes: which nodes hold each
// chunk, so that a lookup is answered without a round trip to Redis. At most
// kMaxHolders holders are kept per chunk (a reader needs one that answers) and at
// most max_keys chunks; past that the replica reports overflow and the directory
// goes back to asking Redis.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "protocol/chunk_key.h"

namespace dpukv {

class DirectoryReplica {
 public:
  static constexpr size_t kMaxHolders = 4;

  explicit DirectoryReplica(size_t max_keys) : max_keys_(max_keys) {}

  void clear() {
    map_.clear();
    overflow_ = false;
  }
  void add(const ChunkKey& k, uint64_t node);
  void drop(const ChunkKey& k, uint64_t node);
  // Appends the holders recorded for k.
  void find(const ChunkKey& k, std::vector<uint64_t>* out) const;

  size_t size() const { return map_.size(); }
  bool overflow() const { return overflow_; }

 private:
  struct KeyHash {
    size_t operator()(const ChunkKey& k) const { return k.hash(); }
  };
  struct Holders {
    std::array<uint64_t, kMaxHolders> node{};
    uint8_t n = 0;
  };
  size_t max_keys_;
  bool overflow_ = false;
  std::unordered_map<ChunkKey, Holders, KeyHash> map_;
};

}  // namespace dpukv
