#include "runtime/mmap.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "runtime/log.h"
#include "runtime/mem_region.h"

namespace dpukv {
namespace {

std::atomic<uint64_t> g_next_map_id{1};

// Largest map an import accepts; bounds any arithmetic a hostile descriptor drives.
constexpr uint64_t kMaxImportLen = 1ull << 40;

bool valid_access(uint32_t access) {
  constexpr uint32_t kAll =
      kAccessLocalRead | kAccessLocalReadWrite | kAccessExportRead | kAccessExportReadWrite;
  return access != 0 && (access & ~kAll) == 0;
}

Status fill_backing(int fd, uint64_t offset, Mmap::Backing* b) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return Code::kDriver;
  b->dev = static_cast<uint64_t>(st.st_dev);
  b->ino = static_cast<uint64_t>(st.st_ino);
  b->offset = offset;
  return Code::kSuccess;
}

}  // namespace

Status Mmap::create(void* addr, size_t len, uint32_t access, int fd, uint64_t fd_offset,
                    std::unique_ptr<Mmap>* out) {
  if (addr == nullptr || len == 0 || out == nullptr || !valid_access(access))
    return Code::kInvalidValue;
  if (reinterpret_cast<uintptr_t>(addr) > UINTPTR_MAX - len) return Code::kInvalidValue;
  std::unique_ptr<Mmap> m(new Mmap());
  m->addr_ = static_cast<uint8_t*>(addr);
  m->len_ = len;
  m->access_ = access;
  m->id_ = g_next_map_id.fetch_add(1, std::memory_order_relaxed);
  if (fd >= 0) {
    m->fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (m->fd_ < 0) return Code::kDriver;
    m->fd_offset_ = fd_offset;
    DPUKV_RETURN_IF_ERROR(fill_backing(m->fd_, fd_offset, &m->backing_));
  } else if ((access & (kAccessExportRead | kAccessExportReadWrite)) != 0) {
    return Code::kNotSupported;  // exporting needs memory a peer can map
  }
  *out = std::move(m);
  return Code::kSuccess;
}

Status Mmap::import(const void* desc_bytes, size_t desc_len, int fd, std::unique_ptr<Mmap>* out) {
  if (desc_bytes == nullptr || out == nullptr || fd < 0) return Code::kInvalidValue;
  if (desc_len != sizeof(ExportDescriptor)) return Code::kInvalidValue;
  ExportDescriptor d;
  std::memcpy(&d, desc_bytes, sizeof(d));
  const uint64_t pg = page_size();
  if (d.magic != ExportDescriptor::kMagic || d.version != ExportDescriptor::kVersion ||
      d.reserved != 0) {
    LOG_WARN("import: bad magic/version");
    return Code::kInvalidValue;
  }
  if (d.access != kAccessExportRead && d.access != kAccessExportReadWrite) {
    LOG_WARN("import: bad access 0x%x", d.access);
    return Code::kInvalidValue;
  }
  if (d.length == 0 || d.length > kMaxImportLen || d.page_delta >= pg || d.fd_offset % pg != 0 ||
      d.fd_offset > kMaxImportLen) {
    LOG_WARN("import: bad geometry len=%llu off=%llu delta=%u",
             static_cast<unsigned long long>(d.length),
             static_cast<unsigned long long>(d.fd_offset), d.page_delta);
    return Code::kInvalidValue;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return Code::kInvalidValue;
  const uint64_t map_len = ((d.page_delta + d.length + pg - 1) / pg) * pg;
  if (static_cast<uint64_t>(st.st_size) < d.fd_offset + d.page_delta + d.length) {
    LOG_WARN("import: fd is smaller than the descriptor claims");
    return Code::kInvalidValue;
  }
  // A file the peer could still shrink would turn our accesses into SIGBUS.
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    LOG_WARN("import: fd is not sealed against shrinking");
    return Code::kNotPermitted;
  }
  const bool rw = d.access == kAccessExportReadWrite;
  // Not populated here: the exporter may hand over a sparse file, and populating it
  // would allocate all of it, at once on the importer's (the agent's progress)
  // thread. A page is faulted in where it is first copied, or ahead by
  // populate_some if the file is dense.
  void* p = mmap(nullptr, map_len, rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd,
                 static_cast<off_t>(d.fd_offset));
  if (p == MAP_FAILED) {
    LOG_WARN("import: mmap: %s", std::strerror(errno));
    return Code::kNoMemory;
  }
  std::unique_ptr<Mmap> m(new Mmap());
  m->mapping_ = p;
  m->mapping_len_ = map_len;
  m->addr_ = static_cast<uint8_t*>(p) + d.page_delta;
  m->len_ = d.length;
  m->access_ = rw ? kAccessLocalReadWrite : kAccessLocalRead;
  m->imported_ = true;
  m->id_ = g_next_map_id.fetch_add(1, std::memory_order_relaxed);
  m->peer_map_id_ = d.map_id;
  m->backing_.dev = static_cast<uint64_t>(st.st_dev);
  m->backing_.ino = static_cast<uint64_t>(st.st_ino);
  m->backing_.offset = d.fd_offset + d.page_delta;
  // No hole from the mapped range's start to the file's end (memfds answer
  // SEEK_HOLE; an error counts as sparse).
  const off_t hole = lseek(fd, static_cast<off_t>(d.fd_offset), SEEK_HOLE);
  m->dense_ = hole >= 0 && static_cast<uint64_t>(hole) >= d.fd_offset + map_len;
  *out = std::move(m);
  return Code::kSuccess;
}

bool Mmap::populate_some(size_t step) {
  if (!imported_ || !dense_ || populated_ >= mapping_len_) return true;
  const size_t n = std::min(step, mapping_len_ - populated_);
  // MADV_POPULATE_WRITE / _READ (Linux 5.14); an older kernel says EINVAL: done.
  const int advice = writable() ? 23 : 22;
  if (madvise(static_cast<uint8_t*>(mapping_) + populated_, n, advice) != 0) {
    populated_ = mapping_len_;
    return true;
  }
  populated_ += n;
  return populated_ >= mapping_len_;
}

Mmap::~Mmap() {
  if (live_bufs_ != 0)
    LOG_CRIT("map %llu destroyed with %zu live buffers", static_cast<unsigned long long>(id_),
             live_bufs_);
  if (mapping_ != nullptr) munmap(mapping_, mapping_len_);
  if (fd_ >= 0) ::close(fd_);
}

Status Mmap::start() {
  if (started_) return Code::kBadState;
  started_ = true;
  return Code::kSuccess;
}

Status Mmap::stop() {
  if (!started_ || live_bufs_ != 0) return Code::kBadState;
  started_ = false;
  return Code::kSuccess;
}

Status Mmap::export_to(ExportDescriptor* desc, int* fd_out) const {
  if (desc == nullptr || fd_out == nullptr) return Code::kInvalidValue;
  if (!started_) return Code::kBadState;
  if (imported_) return Code::kNotPermitted;  // no re-export of a peer's memory
  const uint32_t exp = access_ & (kAccessExportRead | kAccessExportReadWrite);
  if (exp == 0) return Code::kNotPermitted;
  if (fd_ < 0) return Code::kNotSupported;
  const uint64_t pg = page_size();
  std::memset(desc, 0, sizeof(*desc));
  desc->magic = ExportDescriptor::kMagic;
  desc->version = ExportDescriptor::kVersion;
  desc->access = (exp & kAccessExportReadWrite) ? kAccessExportReadWrite : kAccessExportRead;
  desc->map_id = id_;
  desc->fd_offset = fd_offset_ & ~(pg - 1);
  desc->page_delta = static_cast<uint32_t>(fd_offset_ & (pg - 1));
  desc->length = len_;
  *fd_out = fd_;
  return Code::kSuccess;
}

}  // namespace dpukv
