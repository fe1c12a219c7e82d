// The cache's chunk index: which entry id holds a chunk key. Entry ids are
// 0..capacity-1, handed out by insert() from a free list sized once and taken back
// by erase(). The table is open addressing over at least twice the capacity (a
// power of two); tombstones are rebuilt away in place once they pass a quarter of
// it, so probes stay short, and nothing is allocated after init().
//
// The keys live with the caller's entries: KeyOf(id) gives the key an id holds, or
// null when the id is free (what a rebuild skips). Not thread safe: used from the
// cache engine's thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "protocol/chunk_key.h"

namespace dpukv {

template <class KeyOf>  // const ChunkKey* operator()(int32_t id) const
class ChunkIndex {
 public:
  explicit ChunkIndex(KeyOf key_of) : key_of_(key_of) {}

  void init(uint32_t capacity) {
    capacity_ = capacity;
    free_.clear();
    free_.reserve(capacity);
    for (uint32_t i = capacity; i-- > 0;) free_.push_back(static_cast<int32_t>(i));
    uint64_t slots = 1;
    while (slots < 2ull * capacity) slots <<= 1;
    table_.assign(slots, kEmpty);
    mask_ = slots - 1;
    tombstones_ = 0;
  }

  // The id that holds k, or -1. Bounded by the table size; rebuilds keep empty
  // slots, so a miss ends early.
  int32_t find(const ChunkKey& k) const { return find(k, k.hash()); }
  // With k.hash() already taken (a store hashes its key once for every step).
  int32_t find(const ChunkKey& k, uint64_t hash) const {
    uint64_t i = hash & mask_;
    for (uint64_t n = 0; n <= mask_; ++n, i = (i + 1) & mask_) {
      const int32_t e = table_[i];
      if (e == kEmpty) return -1;
      if (e >= 0 && *key_of_(e) == k) return e;
    }
    return -1;
  }

  // A free id for k, which must not be in the index; -1 when every id is in use.
  // The caller stores k under the id before the next find.
  int32_t insert(const ChunkKey& k) { return insert(k.hash()); }
  int32_t insert(uint64_t hash) {
    if (free_.empty()) return -1;
    uint64_t i = hash & mask_;
    while (table_[i] >= 0) i = (i + 1) & mask_;
    if (table_[i] == kTomb) --tombstones_;
    const int32_t e = free_.back();
    free_.pop_back();
    table_[i] = e;
    return e;
  }

  // Takes id e, which holds k, out of the index and back to the free list. The
  // caller marks e free (KeyOf(e) null) before calling: a rebuild skips it.
  void erase(int32_t e, const ChunkKey& k) { erase(e, k.hash()); }
  void erase(int32_t e, uint64_t hash) {
    uint64_t i = hash & mask_;
    for (uint64_t n = 0; n <= mask_; ++n, i = (i + 1) & mask_) {
      if (table_[i] == e) {
        table_[i] = kTomb;
        ++tombstones_;
        break;
      }
    }
    free_.push_back(e);
    if (tombstones_ * 4 > table_.size()) rebuild();
  }

  bool full() const { return free_.empty(); }
  // Table bytes per id: what the index costs a chunk beyond its entry.
  uint64_t bytes_per_id() const {
    return sizeof(int32_t) * table_.size() / std::max<uint32_t>(capacity_, 1) + sizeof(int32_t);
  }

 private:
  static constexpr int32_t kEmpty = -1, kTomb = -2;

  void rebuild() {
    std::fill(table_.begin(), table_.end(), kEmpty);
    tombstones_ = 0;
    for (int32_t x = 0; x < static_cast<int32_t>(capacity_); ++x) {
      const ChunkKey* k = key_of_(x);
      if (k == nullptr) continue;
      uint64_t j = k->hash() & mask_;
      while (table_[j] >= 0) j = (j + 1) & mask_;
      table_[j] = x;
    }
  }

  KeyOf key_of_;
  uint32_t capacity_ = 0;
  std::vector<int32_t> free_;   // ids not in use
  std::vector<int32_t> table_;  // open addressing: kEmpty, kTomb, or an id
  uint64_t mask_ = 0;
  uint64_t tombstones_ = 0;
};

}  // namespace dpukv
