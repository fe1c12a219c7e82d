#include "cache/ghost_window.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace dpukv {
namespace {

// Every hash among the last 3/4 of the window's capacity is remembered (a Bloom
// filter has no false negatives), whatever came before.
TEST(GhostWindow, RemembersEveryRecentHash) {
  for (size_t cap : {1u, 4u, 100u, 4000u}) {
    GhostWindow w(cap);
    std::mt19937_64 rng(cap);
    std::vector<uint64_t> put;
    for (size_t i = 0; i < cap * 10 + 7; ++i) {
      put.push_back(rng());
      w.put(put.back());
      const size_t recent = std::min(put.size(), w.capacity() * 3 / 4);
      for (size_t k = put.size() - recent; k < put.size(); k += 1 + recent / 50)
        ASSERT_TRUE(w.contains(put[k])) << "cap " << cap << ": put " << put.size() - k << " ago";
      ASSERT_LE(w.size(), w.capacity());
      ASSERT_GE(w.size(), std::min(put.size(), w.capacity() * 3 / 4));
    }
  }
}

// Hashes never put, and hashes that aged out, are reported present only as often
// as four filters of 10 bits per hash err (about 1 % each).
TEST(GhostWindow, FalseMatchesAreRareAndOldHashesAgeOut) {
  const size_t cap = 8000;
  GhostWindow w(cap);
  std::mt19937_64 rng(3);
  std::vector<uint64_t> old(cap);
  for (uint64_t& h : old) w.put(h = rng());
  for (size_t i = 0; i < 2 * cap; ++i) w.put(rng());  // the first cap hashes age out
  size_t stale = 0, never = 0;
  for (uint64_t h : old) stale += w.contains(h) ? 1 : 0;
  for (size_t i = 0; i < 100000; ++i) never += w.contains(rng()) ? 1 : 0;
  EXPECT_LT(stale, cap * 5 / 100) << stale;
  EXPECT_LT(never, 100000u * 5 / 100) << never;
  EXPECT_GT(w.memory_bytes(), 0u);
  EXPECT_LE(w.memory_bytes() * 8, cap * GhostWindow::kBitsPerHash + 4 * 64);  // 10 bits each
}

}  // namespace
}  // namespace dpukv
