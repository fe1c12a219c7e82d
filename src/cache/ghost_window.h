// What left memory lately, as membership only: the key hashes of about the last
// `capacity` chunks put (between 3/4 of it and all of it), in four generations of
// Bloom filters. When the newest generation is full the oldest is cleared and
// becomes the newest, so hashes age out in bulk and nothing is ever deleted one by
// one. At 10 bits per hash each filter errs on about 1 % of hashes never put, so
// the window on up to 4 %; for an adaptive policy (ARC's B1 and B2) such a false match only nudges
// what it learns. Two bytes and a half per remembered chunk, where an exact list with 32-bit
// fingerprints costs twelve: room for the long memory these traces reward (reuse comes 4,000-32,000
// references later; docs/cache_policy.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpukv {

class GhostWindow {
 public:
  explicit GhostWindow(size_t capacity);

  bool contains(uint64_t key_hash) const;
  void put(uint64_t key_hash);
  // Hashes remembered now (put, not yet aged out): at most capacity.
  size_t size() const { return size_; }
  size_t capacity() const { return per_generation_ * kGenerations; }
  size_t memory_bytes() const { return bits_.size() * sizeof(uint64_t); }

  static constexpr size_t kGenerations = 4;
  static constexpr size_t kBitsPerHash = 10;
  static constexpr unsigned kProbes = 7;

 private:
  const uint64_t* generation(size_t g) const { return bits_.data() + g * words_; }

  size_t per_generation_;
  size_t words_;  // per generation
  std::vector<uint64_t> bits_;
  size_t counts_[kGenerations] = {};
  size_t newest_ = 0, size_ = 0;
};

}  // namespace dpukv
