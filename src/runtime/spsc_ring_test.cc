#include "runtime/spsc_ring.h"

#include <gtest/gtest.h>

#include <thread>

namespace dpukv {
namespace {

TEST(SpscRing, FillsToCapacityThenRefuses) {
  SpscRing<int> r(5);  // rounds to 8
  EXPECT_EQ(r.capacity(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(r.push(i));
  EXPECT_FALSE(r.push(99));
  int out[8];
  EXPECT_EQ(r.pop_bulk(out, 3), 3u);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[2], 2);
  EXPECT_TRUE(r.push(8));
  EXPECT_EQ(r.pop_bulk(out, 8), 6u);
  EXPECT_EQ(out[5], 8);
  EXPECT_TRUE(r.empty());
}

TEST(SpscRing, TwoThreadsKeepOrderAndLoseNothing) {
  SpscRing<uint64_t> r(64);
  constexpr uint64_t kN = 2'000'000;
  std::thread prod([&] {
    for (uint64_t i = 0; i < kN;)
      if (r.push(i)) ++i;
  });
  uint64_t expect = 0;
  uint64_t buf[32];
  while (expect < kN) {
    size_t n = r.pop_bulk(buf, 32);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], expect++);
  }
  prod.join();
  EXPECT_TRUE(r.empty());
}

}  // namespace
}  // namespace dpukv
