#include "cache/tier/slab_allocator.h"

#include <gtest/gtest.h>

#include <vector>

namespace dpukv {
namespace {

TEST(SlabAllocator, ClassesBoundWasteAndPagesComeBack) {
  SlabAllocator a;
  ASSERT_TRUE(a.init(64 << 20, 4 << 20).ok());
  EXPECT_EQ(a.class_size(1), 4096u);
  EXPECT_EQ(a.class_size(5000), 5120u);
  EXPECT_EQ(a.class_size(256 << 10), 256u << 10);
  for (uint64_t s : {4097ull, 70000ull, 300000ull, 3000000ull})
    EXPECT_LE(a.class_size(s), s + s / 4 + 4096);
  EXPECT_EQ(a.class_size((4 << 20) + 1), 0u);
  // The class is computed, not searched: the smallest of the series that holds s.
  auto walked = [](uint64_t size) {
    for (int c = 0;; ++c) {
      const uint64_t base = uint64_t{4096} << (c / 4), cls = base + base / 4 * (c % 4);
      if (cls >= size) return cls;
    }
  };
  for (uint64_t s = 1; s <= (4 << 20); s += s < 20000 ? 1 : 997)
    ASSERT_EQ(a.class_size(s), walked(s)) << "size " << s;
  for (int e = 12; e <= 22; ++e)
    for (int64_t d : {-1, 0, 1}) {
      const uint64_t s = (uint64_t{1} << e) + static_cast<uint64_t>(d);
      ASSERT_EQ(a.class_size(s), s > (4 << 20) ? 0 : walked(s)) << "size " << s;
    }
  std::vector<uint64_t> offs;
  uint64_t off;
  while (a.alloc(1 << 20, &off)) offs.push_back(off);
  EXPECT_EQ(offs.size(), 64u);
  EXPECT_EQ(a.used_bytes(), 64u << 20);
  EXPECT_FALSE(a.alloc(4096, &off));
  for (uint64_t o : offs) a.free(o);
  EXPECT_EQ(a.pages_in_use(), 0u);
  EXPECT_TRUE(a.alloc(4096, &off));
  EXPECT_TRUE(a.alloc_at(8 << 20, 1 << 20));
  EXPECT_FALSE(a.alloc_at(8 << 20, 1 << 20));           // taken
  EXPECT_FALSE(a.alloc_at((8 << 20) + 4096, 1 << 20));  // misaligned for its class
}

// ---------------------------------------------------------------- engine fixture

}  // namespace
}  // namespace dpukv
