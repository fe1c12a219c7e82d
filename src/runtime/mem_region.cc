#include "runtime/mem_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "runtime/log.h"

namespace dpukv {

size_t page_size() {
  static const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return kPage;
}

Status MemRegion::create(size_t size, const MemRegionOptions& opts,
                         std::unique_ptr<MemRegion>* out) {
  if (size == 0 || out == nullptr) return Code::kInvalidValue;
  const size_t pg = page_size();
  if (size > SIZE_MAX - pg) return Code::kTooBig;
  size = (size + pg - 1) & ~(pg - 1);

  int fd = -1;
  int flags = opts.prefault ? MAP_POPULATE : 0;
  if (opts.shared) {
    fd = memfd_create(opts.name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
      LOG_ERR("memfd_create: %s", std::strerror(errno));
      return Code::kDriver;
    }
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      LOG_ERR("ftruncate(%zu): %s", size, std::strerror(errno));
      ::close(fd);
      return Code::kNoMemory;
    }
    // Importers require a fixed size: a peer that could shrink the file could make
    // every process that mapped it take SIGBUS.
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      LOG_ERR("F_ADD_SEALS: %s", std::strerror(errno));
      ::close(fd);
      return Code::kDriver;
    }
    flags |= MAP_SHARED;
  } else {
    flags |= MAP_PRIVATE | MAP_ANONYMOUS;
  }
  // Huge-page advice must precede the faults, so populate after madvise when asked.
  const bool populate_late = opts.prefault && opts.huge_pages;
  if (populate_late) flags &= ~MAP_POPULATE;
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (addr == MAP_FAILED) {
    LOG_ERR("mmap(%zu): %s", size, std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return Code::kNoMemory;
  }
  if (opts.huge_pages) (void)madvise(addr, size, MADV_HUGEPAGE);
  if (populate_late) {
    // MADV_POPULATE_WRITE (Linux 5.14) faults writable pages without touching data.
    if (madvise(addr, size, 23 /* MADV_POPULATE_WRITE */) != 0) {
      auto* p = static_cast<volatile uint8_t*>(addr);
      for (size_t off = 0; off < size; off += pg) p[off] = 0;
    }
  }
  out->reset(new MemRegion(addr, size, fd));
  return Code::kSuccess;
}

Status MemRegion::share_in_place(void* addr, size_t size, const char* name,
                                 std::unique_ptr<MemRegion>* out) {
  const size_t pg = page_size();
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (out == nullptr || size == 0 || a % pg != 0 || size % pg != 0 || a > UINTPTR_MAX - size)
    return Code::kInvalidValue;
  MemRegionOptions o;
  o.name = name;
  std::unique_ptr<MemRegion> r;
  DPUKV_RETURN_IF_ERROR(create(size, o, &r));
  std::memcpy(r->addr_, addr, size);  // the bytes the memory holds now
  // The shared pages move onto the caller's addresses: the old pages are unmapped
  // and the new ones appear in one call, their page tables kept (no fault later).
  // The system call itself: UCX's libucm, loaded in a process of the cluster,
  // interposes mremap and loses MREMAP_FIXED's new address (EINVAL).
  const long got = syscall(SYS_mremap, r->addr_, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, addr);
  void* moved = got == -1 ? MAP_FAILED : reinterpret_cast<void*>(got);
  if (moved == MAP_FAILED) {
    LOG_ERR("mremap onto %p (%zu bytes): %s", addr, size, std::strerror(errno));
    return Code::kNoMemory;
  }
  r->addr_ = moved;
  r->owns_mapping_ = false;
  *out = std::move(r);
  return Code::kSuccess;
}

MemRegion::~MemRegion() {
  if (owns_mapping_) munmap(addr_, size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace dpukv
