// The file chunk store alone: io_uring writes and reads on a real file, from
// registered (fixed) buffers and from others, tags coming back with their
// results, more in flight than the ring has entries, and a capacity the disk
// cannot give refused without leaving a file behind.
#include "cache/tier/file_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace dpukv {
namespace {

constexpr uint64_t kChunk = 64 << 10;

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Aligned = std::unique_ptr<uint8_t, AlignedFree>;

Aligned aligned(uint64_t bytes) {
  return Aligned(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)));
}

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/dpukv-file-store-test-" + std::to_string(getpid()) + ".data";
    std::filesystem::remove(path_);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove(path_);
  }
  // Reaps completions until n have come, or fails after a minute.
  std::vector<ChunkStore::Completion> reap(size_t n) {
    std::vector<ChunkStore::Completion> got;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
      ChunkStore::Completion c[8];
      const size_t k = store_->poll(c, 8);
      got.insert(got.end(), c, c + k);
    }
    EXPECT_EQ(got.size(), n);
    return got;
  }

  std::string path_;
  std::unique_ptr<ChunkStore> store_;
};

TEST_F(FileStoreTest, WritesAndReadsComeBackByTagFromFixedAndOtherBuffers) {
  Aligned fixed = aligned(4 * kChunk), other = aligned(4 * kChunk);
  ASSERT_TRUE(FileStore::open(path_, 16 * kChunk, 8, {{fixed.get(), 4 * kChunk}}, &store_).ok());
  EXPECT_STREQ(store_->kind(), "file");
  for (uint64_t i = 0; i < 4; ++i) {
    std::memset(fixed.get() + i * kChunk, static_cast<int>(0x10 + i), kChunk);
    ASSERT_TRUE(store_->write(i * 2 * kChunk, fixed.get() + i * kChunk, kChunk, 100 + i).ok());
  }
  std::set<uint64_t> tags;
  for (const auto& c : reap(4)) {
    EXPECT_TRUE(c.status.ok()) << c.err;
    tags.insert(c.tag);
  }
  EXPECT_EQ(tags, (std::set<uint64_t>{100, 101, 102, 103}));
  EXPECT_EQ(store_->inflight(), 0u);
  // Read back into memory that is not registered, in another order.
  std::memset(other.get(), 0, 4 * kChunk);
  for (uint64_t i = 0; i < 4; ++i)
    ASSERT_TRUE(store_->read((3 - i) * 2 * kChunk, other.get() + i * kChunk, kChunk, 200 + i).ok());
  for (const auto& c : reap(4)) EXPECT_TRUE(c.status.ok()) << c.tag << " " << c.err;
  for (uint64_t i = 0; i < 4; ++i)
    for (uint64_t at = 0; at < kChunk; at += 4096)
      ASSERT_EQ(other.get()[i * kChunk + at], static_cast<uint8_t>(0x10 + (3 - i))) << i;
}

// Each I/O is submitted as it is queued, so a ring of 4 entries carries any number
// in flight (the kernel keeps completions beyond the ring's room): all of them
// complete, each with its own tag and its own bytes.
TEST_F(FileStoreTest, MoreInFlightThanTheRingHoldsAllComplete) {
  constexpr uint32_t kN = 32;
  Aligned buf = aligned(kN * kChunk), back = aligned(kN * kChunk);
  ASSERT_TRUE(FileStore::open(path_, 64 * kChunk, 4, {{buf.get(), kN * kChunk}}, &store_).ok());
  for (uint32_t i = 0; i < kN; ++i) {
    std::memset(buf.get() + i * kChunk, static_cast<int>(i + 1), kChunk);
    ASSERT_TRUE(store_->write(i * kChunk, buf.get() + i * kChunk, kChunk, i).ok()) << i;
  }
  EXPECT_GT(store_->inflight(), 0u);
  std::set<uint64_t> tags;
  for (const auto& c : reap(kN)) {
    EXPECT_TRUE(c.status.ok()) << c.tag << " " << c.err;
    tags.insert(c.tag);
  }
  EXPECT_EQ(tags.size(), kN);
  EXPECT_EQ(store_->inflight(), 0u);
  for (uint32_t i = 0; i < kN; ++i)
    ASSERT_TRUE(store_->read(i * kChunk, back.get() + i * kChunk, kChunk, 1000 + i).ok());
  reap(kN);
  EXPECT_EQ(std::memcmp(buf.get(), back.get(), kN * kChunk), 0);
}

TEST_F(FileStoreTest, ACapacityTheDiskCannotGiveIsRefusedAndLeavesNoFile) {
  const uint64_t huge = 1ull << 60;
  EXPECT_EQ(FileStore::open(path_, huge, 8, {}, &store_), Code::kFull);
  EXPECT_FALSE(std::filesystem::exists(path_));
}

}  // namespace
}  // namespace dpukv
