// The disk tier's index log alone, on real files: what replays after puts and
// deletes, after a torn tail and after a corrupt record, what keep() drops, and
// that the log open() leaves holds the live records only.
#include "cache/tier/index_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dpukv {
namespace {

constexpr uint64_t kRecordBytes = 88;

ChunkKey key(uint64_t n) {
  ChunkKey k;
  k.model = 5;
  k.prefix_hash = n;
  return k;
}

class IndexLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/dpukv-index-log-test-" + std::to_string(getpid()) + ".log";
    std::filesystem::remove(path_);
  }
  void TearDown() override {
    log_.reset();
    std::filesystem::remove(path_);
    std::filesystem::remove(path_ + ".tmp");
  }
  // Opens the log keeping every record; the live records sorted by key.
  std::vector<IndexLog::Record> open_all() {
    std::vector<IndexLog::Record> live;
    log_.reset();
    EXPECT_TRUE(IndexLog::open(
                    path_, [](const IndexLog::Record&) { return true; }, &live, &log_)
                    .ok());
    std::sort(live.begin(), live.end(),
              [](const auto& a, const auto& b) { return a.key.prefix_hash < b.key.prefix_hash; });
    return live;
  }
  uint64_t file_bytes() const { return std::filesystem::file_size(path_); }

  std::string path_;
  std::unique_ptr<IndexLog> log_;
};

TEST_F(IndexLogTest, PutsAndDeletesReplayToTheLiveChunks) {
  EXPECT_TRUE(open_all().empty());
  ASSERT_TRUE(log_->put(key(1), 0, 4096, 0x11, 4096, false));
  ASSERT_TRUE(log_->put(key(2), 4096, 8192, 0x22, 9000, true));
  ASSERT_TRUE(log_->put(key(3), 12288, 4096, 0x33, 4096, false));
  ASSERT_TRUE(log_->del(key(2)));
  ASSERT_TRUE(log_->put(key(1), 65536, 4096, 0x44, 4096, false));  // moved: the later put wins
  ASSERT_TRUE(log_->sync().ok());
  const auto live = open_all();
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].key, key(1));
  EXPECT_EQ(live[0].offset, 65536u);
  EXPECT_EQ(live[0].checksum, 0x44u);
  EXPECT_EQ(live[1].key, key(3));
  EXPECT_EQ(live[1].offset, 12288u);
  EXPECT_EQ(live[1].len, 4096u);
  EXPECT_EQ(live[1].raw_len, 4096u);
  EXPECT_FALSE(live[1].encoded);
  // The log open() wrote holds the live records only.
  EXPECT_EQ(file_bytes(), 2 * kRecordBytes);
  EXPECT_EQ(log_->errors(), 0u);
}

TEST_F(IndexLogTest, ATornTailLosesOnlyTheRecordItCut) {
  open_all();
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(log_->put(key(i), i * 4096, 4096, i, 4096, false));
  log_.reset();
  // A crash mid-append: the last record is half there.
  std::filesystem::resize_file(path_, 4 * kRecordBytes - kRecordBytes / 2);
  const auto live = open_all();
  ASSERT_EQ(live.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(live[i].key, key(i));
  EXPECT_EQ(file_bytes(), 3 * kRecordBytes);
  // Appends after the tear replay (nothing is left behind a torn record).
  ASSERT_TRUE(log_->put(key(9), 0, 4096, 9, 4096, true));
  EXPECT_EQ(open_all().size(), 4u);
}

TEST_F(IndexLogTest, NothingAfterACorruptRecordIsTrusted) {
  open_all();
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(log_->put(key(i), i * 4096, 4096, i, 4096, false));
  log_.reset();
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kRecordBytes + 40));  // inside the second record
    f.put('\x5a');
  }
  const auto live = open_all();
  ASSERT_EQ(live.size(), 1u) << "records after the corrupt one must not come back";
  EXPECT_EQ(live[0].key, key(0));
}

TEST_F(IndexLogTest, KeepDropsRecordsThatNoLongerFitTheTier) {
  open_all();
  ASSERT_TRUE(log_->put(key(1), 0, 4096, 1, 4096, false));
  ASSERT_TRUE(log_->put(key(2), 1 << 30, 4096, 2, 4096, false));  // beyond a smaller tier now
  log_.reset();
  std::vector<IndexLog::Record> live;
  ASSERT_TRUE(
      IndexLog::open(
          path_, [](const IndexLog::Record& r) { return r.offset < (1 << 20); }, &live, &log_)
          .ok());
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].key, key(1));
  EXPECT_EQ(file_bytes(), kRecordBytes);
  EXPECT_EQ(open_all().size(), 1u);
}

}  // namespace
}  // namespace dpukv
