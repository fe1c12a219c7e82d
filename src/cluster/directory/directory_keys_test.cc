// The directory's names and values in Redis: what is formatted parses back, and
// what this code did not write (anyone who can write to the Redis can put it
// there) is refused.
#include "cluster/directory/directory_keys.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dpukv {
namespace {

ChunkKey sample() {
  ChunkKey k;
  k.model = 0x1122334455667788ull;
  k.prefix_hash = 0x99aabbccddeeff00ull;
  k.world_size = 8;
  k.rank = 3;
  k.layout = 0x0102030405060708ull;
  return k;
}

TEST(DirectoryKeys, NamesAreThePrefixAKindAndTheKeysBytes) {
  const DirectoryKeys keys("pfx");
  const std::string c = keys.holders_key(sample());
  ASSERT_EQ(c.size(), keys.chunk_key_size());
  EXPECT_EQ(c.size(), 3u + 3 + 32);
  EXPECT_EQ(c.substr(0, 6), "pfx:c:");
  EXPECT_EQ(keys.value_key(sample()).substr(0, 6), "pfx:v:");
  EXPECT_EQ(keys.value_key(sample()).substr(6), c.substr(6)) << "the same key bytes";
  EXPECT_EQ(keys.node_key(0xabc), "pfx:n:0000000000000abc");
  EXPECT_EQ(keys.nodes_key(), "pfx:nodes");
  EXPECT_EQ(keys.events_channel(), "pfx:events");
  EXPECT_EQ(keys.holders_pattern(), "pfx:c:*");

  ChunkKey back;
  ASSERT_TRUE(keys.parse_holders_key(c.data(), c.size(), &back));
  EXPECT_EQ(back, sample());
}

TEST(DirectoryKeys, OnlyThisPrefixsHolderNamesParse) {
  const DirectoryKeys keys("pfx");
  const std::string c = keys.holders_key(sample());
  ChunkKey k;
  const std::string v = keys.value_key(sample());
  EXPECT_FALSE(keys.parse_holders_key(v.data(), v.size(), &k)) << "a value, not holders";
  const std::string other = DirectoryKeys("pfy").holders_key(sample());
  EXPECT_FALSE(keys.parse_holders_key(other.data(), other.size(), &k)) << "another cluster";
  EXPECT_FALSE(keys.parse_holders_key(c.data(), c.size() - 1, &k)) << "a byte short";
  const std::string longer = c + "x";
  EXPECT_FALSE(keys.parse_holders_key(longer.data(), longer.size(), &k));
  std::string colon = c;
  colon[5] = ';';
  EXPECT_FALSE(keys.parse_holders_key(colon.data(), colon.size(), &k));
}

TEST(DirectoryKeys, HolderListsParseOrLeaveTheOutputAsItWas) {
  std::vector<uint64_t> out = {42};
  const std::string two = "," + DirectoryKeys::hex16(1) + "," + DirectoryKeys::hex16(0xfe) + ",";
  ASSERT_TRUE(DirectoryKeys::parse_holders(two.data(), two.size(), &out));
  EXPECT_EQ(out, (std::vector<uint64_t>{42, 1, 0xfe}));

  out = {42};
  const std::string twice = "," + DirectoryKeys::hex16(5) + "," + DirectoryKeys::hex16(5) + ",";
  ASSERT_TRUE(DirectoryKeys::parse_holders(twice.data(), twice.size(), &out));
  EXPECT_EQ(out, (std::vector<uint64_t>{42, 5})) << "each holder once";

  out = {42};
  ASSERT_TRUE(DirectoryKeys::parse_holders(",", 1, &out)) << "an entry whose holders all left";
  EXPECT_EQ(out, (std::vector<uint64_t>{42}));

  std::string many = ",";
  for (uint64_t i = 0; i <= DirectoryKeys::kMaxHolders; ++i) many += DirectoryKeys::hex16(i) + ",";
  const std::string bad[] = {
      "",
      two.substr(1),                        // no leading comma
      two.substr(0, two.size() - 1),        // no trailing comma
      ",000000000000000G,",                 // not hex
      ",000000000000000A,",                 // upper case
      ",00000000000000001,",                // 17 digits
      "," + DirectoryKeys::hex16(1) + ";",  // another separator
      many,                                 // more than kMaxHolders
  };
  for (const std::string& s : bad) {
    SCOPED_TRACE(s.substr(0, 40));
    out = {42};
    EXPECT_FALSE(DirectoryKeys::parse_holders(s.data(), s.size(), &out));
    EXPECT_EQ(out, (std::vector<uint64_t>{42}));
  }
}

TEST(DirectoryKeys, Hex16RoundTrips) {
  for (uint64_t v : {0ull, 1ull, 0xdeadbeefull, ~0ull}) {
    const std::string s = DirectoryKeys::hex16(v);
    ASSERT_EQ(s.size(), 16u);
    uint64_t back = 1;
    ASSERT_TRUE(DirectoryKeys::parse_hex16(s.data(), s.size(), &back));
    EXPECT_EQ(back, v);
  }
  uint64_t x;
  EXPECT_FALSE(DirectoryKeys::parse_hex16("123", 3, &x));
}

}  // namespace
}  // namespace dpukv
