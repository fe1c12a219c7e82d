// What left memory lately, as membership only: the key hashes of about the last
// `capacity` chunks put (between 3/4 of it and all of it), in four generations of
// Bloom filters. When the newest generation is full the oldest is cleared and
// becomes the newest, so hashes age out in bulk and nothing is ever deleted one by
// one. At 10 bits per hash each filter errs on about 1 % of hashes never put, so
// the window on up to 4 %; for an adaptive policy (ARC's B1 and B2) such a false match only nudges
// what it learns. Two bytes and a half per remembered chunk, where an exact list with 32-bit
// fingerprints costs twelve: room for the long memory these traces reward (reuse comes 4,000-32,000
// references later; docs/cache_policy.md).
//
// The memory is sized once for the longest window (max_capacity); set_capacity()
// changes the window's length, up to that, from the next generation on (each
// generation keeps the length, and so the filter size, it began with), because a
// policy learns how many chunks its tier holds only as they arrive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpukv {

class GhostWindow {
 public:
  explicit GhostWindow(size_t max_capacity);

  bool contains(uint64_t key_hash) const;
  void put(uint64_t key_hash);
  // The window's length from the next generation on (clamped to 1..max_capacity).
  void set_capacity(size_t capacity);
  // Hashes remembered now (put, not yet aged out): at most max_capacity.
  size_t size() const { return size_; }
  size_t capacity() const { return per_generation_ * kGenerations; }  // for new generations
  size_t max_capacity() const { return max_per_generation_ * kGenerations; }
  size_t memory_bytes() const { return bits_.size() * sizeof(uint64_t); }

  static constexpr size_t kGenerations = 4;
  static constexpr size_t kBitsPerHash = 10;
  static constexpr unsigned kProbes = 7;

 private:
  static size_t words_for(size_t hashes) { return (hashes * kBitsPerHash + 63) / 64; }
  void start_generation(size_t g);

  size_t max_per_generation_;
  size_t stride_;          // words between generations (sized for the longest window)
  size_t per_generation_;  // the length a new generation takes
  std::vector<uint64_t> bits_;
  size_t counts_[kGenerations] = {};
  size_t limits_[kGenerations] = {};  // hashes each generation holds when full
  size_t words_[kGenerations] = {};   // its filter's size
  size_t newest_ = 0, size_ = 0;
};

}  // namespace dpukv
