// The cache's device path against a copier that hashes bytes where they land, as
// the CUDA engine's kernel does (engines/gpu/verify_kernel.cu): a chunk corrupt in
// either tier is never served into device memory, and bytes that change on their
// way fail only the request that moved them. The copier's "device" is a host buffer
// (the seam, DeviceCopier, is what the test stands in for; the CUDA engine itself
// is tested through the driver double in cuda_engine_test and gpu_agent_test).
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>

#include "engines/device_copier.h"
#include "testing/cache_test_harness.h"

namespace dpukv {
namespace {

using cache_test::byte_of;
using cache_test::CacheHarness;
using cache_test::key;

class LandingCopier final : public DeviceCopier {
 public:
  std::vector<uint8_t> device = std::vector<uint8_t>(8 << 20);
  bool flip_next = false;  // the next copy lands with its first byte changed

  Status copy(uint64_t region, uint64_t offset, void* host, uint64_t bytes, bool to_device,
              uint64_t* checksum, DoneCb cb, void* arg) override {
    if (region != 1 || offset > device.size() || bytes > device.size() - offset)
      return Code::kInvalidValue;
    queued_.push_back({offset, static_cast<uint8_t*>(host), bytes, to_device, checksum, cb, arg});
    return Code::kSuccess;
  }
  // Finishes the copies queued so far (on the cache's thread, as poll() would).
  size_t run() {
    std::vector<Copy> now;
    now.swap(queued_);
    for (const Copy& c : now) {
      uint8_t* dev = device.data() + c.offset;
      if (c.to_device)
        std::memcpy(dev, c.host, c.bytes);
      else
        std::memcpy(c.host, dev, c.bytes);
      if (std::exchange(flip_next, false)) (c.to_device ? dev : c.host)[0] ^= 0x80;
      if (c.checksum != nullptr) *c.checksum = XXH3_64bits(dev, c.bytes);  // at the device end
      c.cb(c.arg, Code::kSuccess);
    }
    return now.size();
  }

 private:
  struct Copy {
    uint64_t offset;
    uint8_t* host;
    uint64_t bytes;
    bool to_device;
    uint64_t* checksum;
    DoneCb cb;
    void* arg;
  };
  std::vector<Copy> queued_;
};

constexpr uint64_t kChunk = 256 << 10;

struct DeviceCache {
  explicit DeviceCache(const CacheOptions& o) : h(o) { h.cache_->set_device_copier(&copier); }
  Status wait(Status* st) {
    while (*st == Code::kInProgress) {
      copier.run();
      h.pe_->progress();
    }
    return *st;
  }
  Status store(const ChunkKey& k, uint64_t dev_off) {
    for (uint64_t i = 0; i < kChunk; ++i) copier.device[dev_off + i] = byte_of(k, i);
    Status st = Code::kInProgress;
    const Status r =
        h.cache_->store_device(k, DeviceRange{1, dev_off, kChunk}, &CacheHarness::done, &st);
    return r.ok() ? wait(&st) : r;
  }
  // Retrieves into the device at dev_off; on success every byte is checked.
  Status retrieve(const ChunkKey& k, uint64_t dev_off) {
    std::fill_n(copier.device.begin() + static_cast<ptrdiff_t>(dev_off), kChunk, 0);
    Status st = Code::kInProgress;
    const Status r =
        h.cache_->retrieve_device(k, DeviceRange{1, dev_off, kChunk}, &CacheHarness::done, &st);
    if (!r.ok()) return r;
    if (wait(&st).ok())
      for (uint64_t i = 0; i < kChunk; ++i)
        if (copier.device[dev_off + i] != byte_of(k, i)) {
          ADD_FAILURE() << "wrong byte " << i << " served";
          break;
        }
    return st;
  }
  // The chunk's bytes in the arena (found by its first 64 bytes), or null.
  uint8_t* in_arena(const ChunkKey& k) {
    void* base;
    uint64_t len;
    h.cache_->arena(&base, &len);
    uint8_t want[64];
    for (size_t i = 0; i < sizeof(want); ++i) want[i] = byte_of(k, i);
    auto* p = static_cast<uint8_t*>(memmem(base, len, want, sizeof(want)));
    return p;
  }
  LandingCopier copier;
  CacheHarness h;
};

TEST(CacheDevice, AChunkCorruptInMemoryIsNeverServedToTheDevice) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  DeviceCache d(cache_test::small_memory(8, kChunk));
  ASSERT_TRUE(d.store(key(1), 0).ok());
  ASSERT_TRUE(d.retrieve(key(1), 1 << 20).ok());
  uint8_t* p = d.in_arena(key(1));
  ASSERT_NE(p, nullptr);
  p[kChunk / 2] ^= 0x01;  // one bit in the memory tier
  EXPECT_EQ(d.retrieve(key(1), 1 << 20), Code::kNotFound);
  EXPECT_EQ(d.h.cache_->stats().checksum_failures, 1u);
  EXPECT_EQ(d.h.cache_->stats().landed_mismatches, 0u);
  EXPECT_FALSE(d.h.cache_->contains(key(1)));  // dropped: no reader gets it again
}

TEST(CacheDevice, BytesChangedOnTheirWayFailOnlyThatRequestAndTheChunkStays) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  DeviceCache d(cache_test::small_memory(8, kChunk));
  ASSERT_TRUE(d.store(key(2), 0).ok());
  d.copier.flip_next = true;  // a link, or the client writing its own memory mid-copy
  EXPECT_EQ(d.retrieve(key(2), 1 << 20), Code::kNotFound);
  EXPECT_EQ(d.h.cache_->stats().landed_mismatches, 1u);
  EXPECT_EQ(d.h.cache_->stats().checksum_failures, 0u);
  EXPECT_TRUE(d.h.cache_->contains(key(2)));  // another client's read is not refused
  EXPECT_TRUE(d.retrieve(key(2), 1 << 20).ok());
  // A store whose bytes change on the way to memory: its checksum is of the
  // device's bytes, so the first read of the changed copy refuses it.
  d.copier.flip_next = true;
  ASSERT_TRUE(d.store(key(3), 2 << 20).ok());
  EXPECT_EQ(d.retrieve(key(3), 1 << 20), Code::kNotFound);
  EXPECT_EQ(d.h.cache_->stats().checksum_failures, 1u);
  EXPECT_FALSE(d.h.cache_->contains(key(3)));
}

TEST(CacheDevice, AChunkCorruptOnDiskIsNeverServedToTheDevice) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  const std::string dir = cache_test::temp_dir("device-disk");
  CacheOptions o = cache_test::with_disk(dir, 4, 16, kChunk);
  o.write_through = true;
  {
    DeviceCache d(o);
    for (uint64_t i = 0; i < 2; ++i) ASSERT_TRUE(d.store(key(10 + i), i * kChunk).ok());
    while (d.h.cache_->stats().spills < 2) d.h.pe_->progress();
  }
  const int fd = ::open((dir + "/dpukv-data").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  for (uint64_t off = 0; off < 16 * kChunk; off += kChunk) {  // one byte of each chunk
    uint8_t b;
    ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(off + 77)), 1);
    b ^= 0x40;
    ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(off + 77)), 1);
  }
  ::close(fd);
  {
    DeviceCache d(o);  // reopened: both chunks are on disk only
    ASSERT_EQ(d.h.cache_->stats().recovered, 2u);
    EXPECT_EQ(d.retrieve(key(10), 0), Code::kNotFound);
    EXPECT_EQ(d.retrieve(key(11), 0), Code::kNotFound);
    EXPECT_EQ(d.h.cache_->stats().checksum_failures, 2u);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpukv
