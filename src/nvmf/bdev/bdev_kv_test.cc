// The KV-cache block device: what a host writes through LBAs comes back from the
// cache engine's tiers; partial chunks are read-modify-written; zeroing and
// deallocation remove chunks; evicted chunks read as zeroes; a disk tier keeps
// chunks the memory tier lets go.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "nvmf/bdev/bdev_kv.h"
#include "runtime/log.h"

namespace dpukv::nvme {
namespace {

struct Io {
  BdevIo io;
  Status st = Code::kInProgress;
  iovec iov[2];
};

Status run(Bdev& b, BdevOp op, uint64_t lba, uint64_t n, uint8_t* buf, size_t split = 0) {
  Io x;
  x.io.op = op;
  x.io.lba = lba;
  x.io.nblocks = n;
  size_t len = n * b.block_size();
  if (buf != nullptr) {  // two segments, as PRPs or a transport would give them
    size_t first = split != 0 ? split : len;
    x.iov[0] = iovec{buf, first};
    x.iov[1] = iovec{buf + first, len - first};
    x.io.iov = x.iov;
    x.io.iovcnt = split != 0 ? 2 : 1;
  }
  x.io.ctx = &x;
  x.io.done = [](BdevIo* io, Status st) { static_cast<Io*>(io->ctx)->st = st; };
  b.submit(&x.io);
  for (int i = 0; x.st == Code::kInProgress && i < 10'000'000; ++i) b.poll();
  return x.st;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& c : v) c = static_cast<uint8_t>(rng());
  return v;
}

TEST(KvBdev, WritesReadBackWholeAndPartialChunks) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  KvBdevOptions o;
  o.num_blocks = 4096;  // 16 MiB namespace of 4 KiB blocks, 64 KiB chunks
  o.memory_bytes = 8 << 20;
  std::unique_ptr<Bdev> b;
  ASSERT_TRUE(create_kv_bdev("kv0", o, &b).ok());
  EXPECT_STREQ(b->kind(), "kv");
  // Never written: zeroes.
  std::vector<uint8_t> r(256 * 1024, 0xee), zero(256 * 1024, 0);
  ASSERT_TRUE(run(*b, BdevOp::kRead, 0, 64, r.data()).ok());
  EXPECT_EQ(r, zero);
  // Whole chunks (64 KiB aligned), then a write that starts and ends mid-chunk.
  auto w = pattern(128 * 1024, 1);
  ASSERT_TRUE(run(*b, BdevOp::kWrite, 16, 32, w.data(), 5000).ok());
  auto p = pattern(12 * 4096, 2);
  ASSERT_TRUE(run(*b, BdevOp::kWrite, 30, 12, p.data()).ok());
  std::memcpy(w.data() + 14 * 4096, p.data(), p.size());
  r.assign(128 * 1024, 0);
  ASSERT_TRUE(run(*b, BdevOp::kRead, 16, 32, r.data(), 12345).ok());
  EXPECT_EQ(std::memcmp(r.data(), w.data(), w.size()), 0);
  // Zeroing part of a chunk and deallocating a whole one.
  ASSERT_TRUE(run(*b, BdevOp::kWriteZeroes, 17, 2, nullptr).ok());
  ASSERT_TRUE(run(*b, BdevOp::kUnmap, 32, 16, nullptr).ok());
  std::memset(w.data() + 4096, 0, 8192);
  std::memset(w.data() + 16 * 4096, 0, 16 * 4096);
  ASSERT_TRUE(run(*b, BdevOp::kRead, 16, 32, r.data()).ok());
  EXPECT_EQ(std::memcmp(r.data(), w.data(), w.size()), 0);
  EXPECT_TRUE(run(*b, BdevOp::kFlush, 0, 0, nullptr).ok());
  EXPECT_EQ(run(*b, BdevOp::kRead, 4095, 2, r.data()).code(), Code::kInvalidValue);
}

TEST(KvBdev, EvictedChunksReadAsZeroesAndADiskTierKeepsThem) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  std::string dir = "/tmp/dpukv-kv-bdev-test-" + std::to_string(getpid());
  for (bool disk : {false, true}) {
    std::filesystem::remove_all(dir);
    KvBdevOptions o;
    o.num_blocks = 4096;
    o.memory_bytes = 4 * 65536;  // room for 4 chunks
    if (disk) {
      o.disk_dir = dir;
      o.disk_bytes = 16 << 20;
    }
    std::unique_ptr<Bdev> b;
    ASSERT_TRUE(create_kv_bdev("kv1", o, &b).ok());
    std::vector<std::vector<uint8_t>> chunks;
    for (uint32_t c = 0; c < 12; ++c) {
      chunks.push_back(pattern(65536, 100 + c));
      ASSERT_TRUE(run(*b, BdevOp::kWrite, c * 16, 16, chunks.back().data()).ok());
    }
    std::vector<uint8_t> r(65536), zero(65536, 0);
    int intact = 0, zeroed = 0;
    for (uint32_t c = 0; c < 12; ++c) {
      ASSERT_TRUE(run(*b, BdevOp::kRead, c * 16, 16, r.data()).ok());
      if (r == chunks[c])
        ++intact;
      else if (r == zero)
        ++zeroed;
      else
        ADD_FAILURE() << "chunk " << c << " is neither its data nor zeroes";
    }
    if (disk) {
      EXPECT_EQ(intact, 12);  // spilled to disk and reloaded
    } else {
      EXPECT_GE(zeroed, 8);  // a 4-chunk memory tier kept at most 4
      EXPECT_LE(intact, 4);
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpukv::nvme
