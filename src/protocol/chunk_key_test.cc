// Chunk keys: the golden values every node and the disk log rely on (changing them
// is a cache-format change), and what a key depends on.
#include "protocol/chunk_key.h"

#include <gtest/gtest.h>

#include <vector>

namespace dpukv {
namespace {

TEST(ChunkKey, GoldenValuesAndPrefixChaining) {
  KeyContext ctx{model_id("meta-llama/Llama-3.1-8B"), 1, 0,
                 kv_layout_fingerprint("bf16", 32, 8, 128)};
  EXPECT_EQ(ctx.model, 0x0e40671a050495a5ull);
  EXPECT_EQ(ctx.layout, 0x1e9c088bfe612b7dull);
  std::vector<int32_t> t(600);
  for (int i = 0; i < 600; ++i) t[static_cast<size_t>(i)] = i * 7 + 1;
  std::vector<ChunkKey> k;
  chunk_keys(ctx, t.data(), t.size(), 256, true, &k);
  ASSERT_EQ(k.size(), 3u);
  EXPECT_EQ(k[0].prefix_hash, 0x1cebeeeb1ce8b399ull);
  EXPECT_EQ(k[1].prefix_hash, 0xc5134755e1824fe3ull);
  EXPECT_EQ(k[2].prefix_hash, 0xddf9eb429a488a23ull);  // the partial last chunk
  EXPECT_EQ(key_from_block_id(ctx, 46).prefix_hash, 0x198544bdb1c10beaull);
  chunk_keys(ctx, t.data(), t.size(), 256, false, &k);
  EXPECT_EQ(k.size(), 2u);
  // A different token in chunk 0 changes every later key; one in chunk 1 keeps chunk 0's.
  std::vector<ChunkKey> k2;
  t[300] = -5;
  chunk_keys(ctx, t.data(), t.size(), 256, false, &k2);
  EXPECT_EQ(k2[0], k[0]);
  EXPECT_NE(k2[1].prefix_hash, k[1].prefix_hash);
  // Rank and model are part of the key.
  KeyContext other = ctx;
  other.rank = 1;
  chunk_keys(other, t.data(), 256, 256, false, &k2);
  EXPECT_FALSE(k2[0] == k[0]);
}

TEST(ChunkKey, TextIsModelAndPrefixInHex) {
  ChunkKey k;
  k.model = 0x0123456789abcdefull;
  k.prefix_hash = 0xfedcba9876543210ull;
  EXPECT_STREQ(key_text(k).c_str(), "0123456789abcdef:fedcba9876543210");
}

}  // namespace
}  // namespace dpukv
