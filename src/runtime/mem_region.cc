#include "runtime/mem_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
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

MemRegion::~MemRegion() {
  munmap(addr_, size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace dpukv
