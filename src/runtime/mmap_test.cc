#include "runtime/mmap.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "runtime/fd_passing.h"
#include "runtime/mem_region.h"

namespace dpukv {
namespace {

struct Exported {
  std::unique_ptr<MemRegion> mem;
  std::unique_ptr<Mmap> map;
  ExportDescriptor desc{};
  int fd = -1;
};

void make_exported(size_t size, uint32_t access, Exported* e) {
  ASSERT_TRUE(MemRegion::create(size, MemRegionOptions{}, &e->mem).ok());
  ASSERT_TRUE(Mmap::create(e->mem->data(), e->mem->size(), access, e->mem->fd(), 0, &e->map).ok());
  ASSERT_TRUE(e->map->start().ok());
  ASSERT_TRUE(e->map->export_to(&e->desc, &e->fd).ok());
}

TEST(MemRegion, SharedRegionIsSealedAndPrefaulted) {
  std::unique_ptr<MemRegion> r;
  ASSERT_TRUE(MemRegion::create(1 << 20, MemRegionOptions{}, &r).ok());
  EXPECT_EQ(r->size(), 1u << 20);
  int seals = fcntl(r->fd(), F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  // Resident already: mincore reports every page present.
  std::vector<unsigned char> vec((1 << 20) / page_size());
  ASSERT_EQ(mincore(r->data(), r->size(), vec.data()), 0);
  for (unsigned char v : vec) ASSERT_TRUE(v & 1);
  EXPECT_EQ(MemRegion::create(0, MemRegionOptions{}, &r), Code::kInvalidValue);
}

TEST(Mmap, LocalMapRulesAndStates) {
  std::vector<uint8_t> mem(4096);
  std::unique_ptr<Mmap> m;
  EXPECT_EQ(Mmap::create(nullptr, 10, kAccessLocalRead, -1, 0, &m), Code::kInvalidValue);
  EXPECT_EQ(Mmap::create(mem.data(), 0, kAccessLocalRead, -1, 0, &m), Code::kInvalidValue);
  EXPECT_EQ(Mmap::create(mem.data(), 10, 0x100, -1, 0, &m), Code::kInvalidValue);
  // Exporting needs an fd a peer can map.
  EXPECT_EQ(Mmap::create(mem.data(), mem.size(), kAccessExportRead, -1, 0, &m),
            Code::kNotSupported);
  ASSERT_TRUE(Mmap::create(mem.data(), mem.size(), kAccessLocalReadWrite, -1, 0, &m).ok());
  EXPECT_TRUE(m->contains(mem.data(), 4096));
  EXPECT_FALSE(m->contains(mem.data() + 1, 4096));
  EXPECT_FALSE(m->contains(mem.data() - 1, 1));
  EXPECT_EQ(m->stop(), Code::kBadState);
  ASSERT_TRUE(m->start().ok());
  EXPECT_EQ(m->start(), Code::kBadState);
  ExportDescriptor d;
  int fd;
  EXPECT_EQ(m->export_to(&d, &fd), Code::kNotPermitted);
  EXPECT_TRUE(m->stop().ok());
}

TEST(Mmap, ExportImportSharesBytes) {
  Exported e;
  make_exported(1 << 20, kAccessLocalReadWrite | kAccessExportReadWrite, &e);
  std::unique_ptr<Mmap> imp;
  ASSERT_TRUE(Mmap::import(&e.desc, sizeof(e.desc), e.fd, &imp).ok());
  ASSERT_TRUE(imp->start().ok());
  EXPECT_TRUE(imp->imported());
  EXPECT_TRUE(imp->writable());
  EXPECT_EQ(imp->length(), e.map->length());
  EXPECT_EQ(imp->peer_map_id(), e.map->id());
  std::memcpy(imp->addr() + 100, "dpukv", 5);
  EXPECT_EQ(std::memcmp(e.map->addr() + 100, "dpukv", 5), 0);
  // Aliases: same backing identity.
  EXPECT_EQ(imp->backing().ino, e.map->backing().ino);
  EXPECT_EQ(imp->backing().offset, e.map->backing().offset);
  // No re-export of a peer's memory.
  ExportDescriptor d2;
  int fd2;
  EXPECT_EQ(imp->export_to(&d2, &fd2), Code::kNotPermitted);
}

// Issue 47: an importer that will write all of a map (loads into an engine's KV
// cache shared in place) faults it in ahead, but only a dense one: populating a
// sparse file would allocate all of it on the importer's side.
TEST(Mmap, OnlyADenseImportIsPopulated) {
  Exported e;  // MemRegion prefaults: every page of the file exists
  make_exported(4 << 20, kAccessLocalReadWrite | kAccessExportReadWrite, &e);
  std::unique_ptr<Mmap> imp;
  ASSERT_TRUE(Mmap::import(&e.desc, sizeof(e.desc), e.fd, &imp).ok());
  EXPECT_TRUE(imp->dense());
  EXPECT_FALSE(imp->populated());
  int steps = 0;
  while (!imp->populate_some(1 << 20)) ++steps;
  EXPECT_EQ(steps, 3);  // four 1 MiB steps, the last one says done
  EXPECT_TRUE(imp->populated());
  std::vector<unsigned char> vec((4 << 20) / page_size());
  ASSERT_EQ(mincore(imp->addr(), imp->length(), vec.data()), 0);
  for (unsigned char v : vec) ASSERT_TRUE(v & 1);

  // A sparse memfd: nothing to populate, nothing allocated.
  const int fd = memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4 << 20), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  ExportDescriptor d = e.desc;
  d.length = 4 << 20;
  d.page_delta = 0;
  d.fd_offset = 0;
  std::unique_ptr<Mmap> sparse;
  ASSERT_TRUE(Mmap::import(&d, sizeof(d), fd, &sparse).ok());
  EXPECT_FALSE(sparse->dense());
  EXPECT_TRUE(sparse->populated());
  EXPECT_TRUE(sparse->populate_some(4 << 20));
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_blocks, 0);
  sparse.reset();
  ::close(fd);
}

TEST(Mmap, ReadOnlyExportImportsReadOnly) {
  Exported e;
  make_exported(64 << 10, kAccessLocalReadWrite | kAccessExportRead, &e);
  std::unique_ptr<Mmap> imp;
  ASSERT_TRUE(Mmap::import(&e.desc, sizeof(e.desc), e.fd, &imp).ok());
  EXPECT_TRUE(imp->readable());
  EXPECT_FALSE(imp->writable());
}

TEST(Mmap, ImportRejectsBadDescriptors) {
  Exported e;
  make_exported(64 << 10, kAccessLocalReadWrite | kAccessExportReadWrite, &e);
  std::unique_ptr<Mmap> imp;
  auto try_import = [&](ExportDescriptor d) { return Mmap::import(&d, sizeof(d), e.fd, &imp); };
  ExportDescriptor d = e.desc;
  d.magic ^= 1;
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.version = 9;
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.access = kAccessLocalReadWrite;
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.length = e.desc.length + 1;  // larger than the fd
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.length = 0;
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.length = UINT64_MAX;
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.fd_offset = 100;  // not page aligned
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.fd_offset = UINT64_MAX & ~4095ull;
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.page_delta = 5000;
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  d = e.desc, d.reserved = 1;
  EXPECT_EQ(try_import(d), Code::kInvalidValue);
  EXPECT_EQ(Mmap::import(&e.desc, sizeof(e.desc) - 1, e.fd, &imp), Code::kInvalidValue);
  EXPECT_EQ(Mmap::import(&e.desc, sizeof(e.desc), -1, &imp), Code::kInvalidValue);
  // A pipe is not a memory file.
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  EXPECT_EQ(Mmap::import(&e.desc, sizeof(e.desc), p[0], &imp), Code::kInvalidValue);
  close(p[0]), close(p[1]);
}

TEST(Mmap, ImportRefusesUnsealedFile) {
  // A peer that can still shrink its file could make us take SIGBUS.
  int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  ExportDescriptor d{};
  d.magic = ExportDescriptor::kMagic;
  d.version = ExportDescriptor::kVersion;
  d.access = kAccessExportReadWrite;
  d.length = 8192;
  std::unique_ptr<Mmap> imp;
  EXPECT_EQ(Mmap::import(&d, sizeof(d), fd, &imp), Code::kNotPermitted);
  close(fd);
}

// A real child process allocates and exports memory; the parent imports it over a
// UNIX socket, writes a pattern, and the child checks it.
TEST(Mmap, CrossProcessExportImport) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    std::unique_ptr<MemRegion> mem;
    std::unique_ptr<Mmap> map;
    if (!MemRegion::create(2 << 20, MemRegionOptions{}, &mem).ok()) _exit(10);
    // Export a window that does not start on a page boundary.
    uint8_t* base = static_cast<uint8_t*>(mem->data()) + 4096 + 123;
    if (!Mmap::create(base, 1 << 20, kAccessLocalReadWrite | kAccessExportReadWrite, mem->fd(),
                      4096 + 123, &map)
             .ok() ||
        !map->start().ok())
      _exit(11);
    ExportDescriptor d;
    int fd;
    if (!map->export_to(&d, &fd).ok() || !send_with_fd(sv[1], &d, sizeof(d), fd).ok()) _exit(12);
    char c;
    if (read(sv[1], &c, 1) != 1) _exit(13);
    for (size_t i = 0; i < (1 << 20); ++i)
      if (base[i] != static_cast<uint8_t>(i * 7)) _exit(14);
    _exit(0);
  }
  close(sv[1]);
  ExportDescriptor d;
  size_t len = 0;
  int fd = -1;
  ASSERT_TRUE(recv_with_fd(sv[0], &d, sizeof(d), &len, &fd).ok());
  ASSERT_GE(fd, 0);
  std::unique_ptr<Mmap> imp;
  ASSERT_TRUE(Mmap::import(&d, len, fd, &imp).ok());
  close(fd);
  ASSERT_EQ(imp->length(), 1u << 20);
  for (size_t i = 0; i < (1 << 20); ++i) imp->addr()[i] = static_cast<uint8_t>(i * 7);
  ASSERT_EQ(write(sv[0], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  close(sv[0]);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(FdPassing, ExtraDescriptorsAreClosedAndEofIsReset) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  char buf[8];
  size_t len;
  int fd;
  ASSERT_TRUE(send_with_fd(sv[0], "abc", 3, -1).ok());
  ASSERT_TRUE(recv_with_fd(sv[1], buf, sizeof(buf), &len, &fd).ok());
  EXPECT_EQ(len, 3u);
  EXPECT_EQ(fd, -1);
  // A message longer than the buffer is refused, not silently cut.
  ASSERT_TRUE(send_with_fd(sv[0], "0123456789", 10, sv[0]).ok());
  EXPECT_EQ(recv_with_fd(sv[1], buf, sizeof(buf), &len, &fd), Code::kTooBig);
  EXPECT_EQ(fd, -1);
  close(sv[0]);
  EXPECT_EQ(recv_with_fd(sv[1], buf, sizeof(buf), &len, &fd), Code::kConnectionReset);
  close(sv[1]);
}

}  // namespace
}  // namespace dpukv
