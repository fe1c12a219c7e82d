#include "cache/cache_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <random>
#include <set>
#include <unordered_map>
#include <vector>

#include "cache/tier/slab_allocator.h"
#include "engines/compress/kv_synth.h"
#include "runtime/child_process.h"
#include "runtime/log.h"
#include "testing/cache_test_harness.h"

namespace dpukv {
namespace {

using namespace cache_test;

// A tier larger than the free space is refused before a byte is taken, and the
// data file it would have created is gone (on a 16 MiB tmpfs made for the test).
TEST(DiskTier, RefusesATierLargerThanTheFreeSpace) {
  const std::string mnt = temp_dir("small-fs");
  std::filesystem::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=16m") != 0) {
    std::filesystem::remove_all(mnt);
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  }
  const std::string dir = mnt + "/tier";
  std::unique_ptr<DiskTier> t;
  std::vector<DiskTier::Recovered> rec;
  DiskTierOptions o;
  o.dir = dir;
  o.page_size = 1 << 20;
  o.capacity = 64ull << 20;
  EXPECT_EQ(DiskTier::open(o, {}, &rec, &t), Code::kFull);
  EXPECT_FALSE(std::filesystem::exists(dir + "/dpukv-data"));
  struct statvfs v {};
  ASSERT_EQ(::statvfs(mnt.c_str(), &v), 0);
  EXPECT_GT(static_cast<uint64_t>(v.f_bavail) * v.f_frsize, 15ull << 20);  // nothing taken
  // One that fits opens, and opens again (its own file's space counts as available).
  o.capacity = 8ull << 20;
  ASSERT_TRUE(DiskTier::open(o, {}, &rec, &t).ok());
  t.reset();
  ASSERT_TRUE(DiskTier::open(o, {}, &rec, &t).ok());
  t.reset();
  ASSERT_EQ(::umount(mnt.c_str()), 0);
  std::filesystem::remove_all(mnt);
}

// Two owners of one directory would hand out the same extents: the second is
// refused while the first lives, and takes over once it is gone.
TEST(DiskTier, OneOwnerPerDirectory) {
  const std::string dir = temp_dir("lock");
  DiskTierOptions o;
  o.dir = dir;
  o.page_size = 1 << 20;
  o.capacity = 4ull << 20;
  std::unique_ptr<DiskTier> a, b;
  std::vector<DiskTier::Recovered> rec;
  ASSERT_TRUE(DiskTier::open(o, {}, &rec, &a).ok());
  EXPECT_EQ(DiskTier::open(o, {}, &rec, &b), Code::kBadState);
  std::ifstream f(dir + "/dpukv.lock");
  pid_t owner = 0;
  f >> owner;
  EXPECT_EQ(owner, getpid());
  a.reset();
  EXPECT_TRUE(DiskTier::open(o, {}, &rec, &b).ok());
  b.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpukv
