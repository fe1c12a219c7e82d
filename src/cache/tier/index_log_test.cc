// The disk tier's index log alone, on real files: what replays after puts and
// deletes, after a torn tail and after a corrupt record, what keep() drops, that
// the log open() leaves holds the live records only, and in log order, and that a
// disk with no room for that log keeps the old one.
#include "cache/tier/index_log.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/crc32c.h"

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

// Recovery hands the live records back in log order, oldest first: that order is
// the disk tier's recency, and the log open() writes keeps it for the next start.
TEST_F(IndexLogTest, LiveRecordsComeBackOldestFirst) {
  open_all();
  const uint64_t order[] = {7, 3, 9, 1, 5};
  for (uint64_t k : order) ASSERT_TRUE(log_->put(key(k), k * 4096, 4096, k, 4096, false));
  ASSERT_TRUE(log_->put(key(3), 65536, 4096, 3, 4096, false));  // used again: now the newest
  ASSERT_TRUE(log_->del(key(9)));
  const std::vector<uint64_t> want = {7, 1, 5, 3};
  for (int start = 0; start < 2; ++start) {  // the replayed log, then the compacted one
    log_.reset();
    std::vector<IndexLog::Record> live;
    ASSERT_TRUE(IndexLog::open(
                    path_, [](const IndexLog::Record&) { return true; }, &live, &log_)
                    .ok());
    std::vector<uint64_t> got;
    for (const auto& r : live) got.push_back(r.key.prefix_hash);
    EXPECT_EQ(got, want) << "start " << start;
  }
}

// keep() is asked newest first, so a tier that now holds fewer chunks keeps the
// most recent ones; the rest leave the log.
TEST_F(IndexLogTest, ABoundOnTheChunksKeepsTheNewest) {
  open_all();
  for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(log_->put(key(i), i * 4096, 4096, i, 4096, false));
  log_.reset();
  std::vector<IndexLog::Record> live;
  int asked = 0;
  ASSERT_TRUE(IndexLog::open(
                  path_, [&asked](const IndexLog::Record&) { return ++asked <= 2; }, &live, &log_)
                  .ok());
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].key, key(4));
  EXPECT_EQ(live[1].key, key(5));
  EXPECT_EQ(file_bytes(), 2 * kRecordBytes);
  EXPECT_EQ(open_all().size(), 2u);
}

// A record whose checksum holds but whose type is neither put nor delete (another
// format, or a bug) is corrupt: it and what follows are not trusted.
TEST_F(IndexLogTest, ARecordOfAnUnknownTypeEndsTheReplay) {
  open_all();
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(log_->put(key(i), i * 4096, 4096, i, 4096, false));
  log_.reset();
  {
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    char rec[kRecordBytes];
    f.seekg(static_cast<std::streamoff>(kRecordBytes));
    ASSERT_TRUE(f.read(rec, sizeof(rec)));
    const uint16_t type = 3;
    std::memcpy(rec + 4, &type, sizeof(type));  // after the magic
    const uint32_t crc = crc32c(rec, kRecordBytes - 4);
    std::memcpy(rec + kRecordBytes - 4, &crc, sizeof(crc));
    f.seekp(static_cast<std::streamoff>(kRecordBytes));
    ASSERT_TRUE(f.write(rec, sizeof(rec)));
  }
  const auto live = open_all();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].key, key(0));
}

// A disk with no room for the compacted log (here: a file-size limit of one
// record, in a child) keeps the tier: the old log's valid prefix is kept, its torn
// tail cut, and appended to; an append past the limit fails and is counted; with
// room again the next open compacts as usual.
TEST_F(IndexLogTest, ALogThatCannotBeCompactedIsKeptAndAppendedTo) {
  open_all();
  for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(log_->put(key(i), i * 4096, 4096, i, 4096, false));
  ASSERT_TRUE(log_->del(key(1)));
  ASSERT_TRUE(log_->put(key(0), 65536, 4096, 7, 4096, false));
  log_.reset();
  std::filesystem::resize_file(path_, 8 * kRecordBytes + kRecordBytes / 2);  // a torn tail
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit rl{kRecordBytes, kRecordBytes};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
    std::vector<IndexLog::Record> live;
    std::unique_ptr<IndexLog> log;
    if (!IndexLog::open(
             path_, [](const IndexLog::Record&) { return true; }, &live, &log)
             .ok())
      _exit(11);
    const std::vector<uint64_t> want = {2, 3, 4, 5, 0};
    if (live.size() != want.size()) _exit(12);
    for (size_t i = 0; i < want.size(); ++i)
      if (live[i].key != key(want[i])) _exit(13);
    if (std::filesystem::file_size(path_) != 8 * kRecordBytes) _exit(14);  // the tail cut
    if (std::filesystem::exists(path_ + ".tmp")) _exit(15);
    if (log->put(key(9), 0, 4096, 9, 4096, false) || log->errors() != 1) _exit(16);
    if (std::filesystem::file_size(path_) != 8 * kRecordBytes) _exit(17);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const auto live = open_all();  // room again: compacted
  EXPECT_EQ(live.size(), 5u);
  EXPECT_EQ(file_bytes(), 5 * kRecordBytes);
  ASSERT_TRUE(log_->put(key(9), 0, 4096, 9, 4096, false));
  EXPECT_EQ(open_all().size(), 6u);
}

}  // namespace
}  // namespace dpukv
