// The GPU kernel's decomposition of XXH3-64, composed on the host in the kernel's
// order (tiles of block sums, scrambles in order, tail, merge), against libxxhash:
// the digest the GPU computes is the chunk checksum, or every GPU read would fail.
// Every load the kernel makes as an aligned 8-byte word is watched: a GPU faults on
// a misaligned one (an H200 did, on 2026-11-28, for lengths not a multiple of 8).
#include <cstdint>

namespace {
uint64_t misaligned_loads = 0;
}  // namespace
#define DPUKV_XXH3_ALIGNED_LOAD(p) \
  (misaligned_loads += reinterpret_cast<uintptr_t>(p) % 8 != 0 ? 1 : 0)
#include "engines/gpu/xxh3_lanes.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

namespace {

using namespace dpukv_xxh3;  // NOLINT(google-build-using-namespace)

// verify_kernel.cu's steps, with its tile size; lanes in any order within a tile.
uint64_t by_lanes(const uint8_t* p, uint64_t len, unsigned tile_blocks) {
  uint64_t acc[8];
  for (unsigned l = 0; l < 8; ++l) acc[l] = kInitAcc[l];
  const uint64_t blocks = whole_blocks(len);
  std::vector<uint64_t> sums(static_cast<size_t>(tile_blocks) * 8);
  for (uint64_t first = 0; first < blocks; first += tile_blocks) {
    const uint64_t n = std::min<uint64_t>(tile_blocks, blocks - first);
    for (uint64_t item = n * 8; item-- > 0;)  // backwards: order within a tile is free
      sums[item] = block_lane_sum(p + (first + item / 8) * kBlock, item % 8, kStripesPerBlock);
    for (unsigned l = 0; l < 8; ++l)
      for (uint64_t b = 0; b < n; ++b) acc[l] = scramble(acc[l] + sums[b * 8 + l], l);
  }
  for (unsigned l = 0; l < 8; ++l) acc[l] += tail_lane_sum(p, len, l);
  return merge(acc, len);
}

TEST(Xxh3Lanes, MatchesLibxxhashForEveryLengthClass) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf((1 << 20) + 4096);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<uint64_t> lengths = {kMinLength,     255,    256,  1023, 1024,      1025,
                                   1087,           1088,   1089, 2048, 4096 + 63, 128 * 1024,
                                   128 * 1024 + 1, 1 << 20};
  for (int i = 0; i < 200; ++i) lengths.push_back(kMinLength + rng() % ((1 << 20) - kMinLength));
  for (uint64_t len : lengths)
    for (unsigned tile : {1u, 128u}) {
      ASSERT_EQ(by_lanes(buf.data(), len, tile), XXH3_64bits(buf.data(), len))
          << "length " << len << ", tile " << tile;
    }
}

// The engine sends the kernel 8-byte-aligned inputs of any length (a chunk of
// 2 MiB + 123 bytes at a page of GPU memory, say); none of the word loads may be
// misaligned then, or the GPU's context is lost with the first such chunk.
TEST(Xxh3Lanes, AlignedInputsOfAnyLengthMakeOnlyAlignedWordLoads) {
  std::vector<uint64_t> words(((1 << 20) + 4096) / 8, 0x0123456789abcdefULL);
  const auto* p = reinterpret_cast<const uint8_t*>(words.data());
  for (uint64_t len = kMinLength; len < kMinLength + 64; ++len)
    for (uint64_t extra : {uint64_t{0}, uint64_t{2} << 19}) {
      misaligned_loads = 0;
      EXPECT_EQ(by_lanes(p, len + extra, 128), XXH3_64bits(p, len + extra));
      EXPECT_EQ(misaligned_loads, 0u) << "length " << len + extra;
    }
}

TEST(Xxh3Lanes, AnyChangedByteChangesTheDigest) {
  std::vector<uint8_t> buf(64 * 1024 + 17, 0x5a);
  const uint64_t clean = by_lanes(buf.data(), buf.size(), 128);
  for (size_t at : {size_t{0}, size_t{1023}, size_t{1024}, buf.size() - 65, buf.size() - 1}) {
    buf[at] ^= 1;
    EXPECT_NE(by_lanes(buf.data(), buf.size(), 128), clean) << "byte " << at;
    buf[at] ^= 1;
  }
}

}  // namespace
