#include "cache/tier/file_store.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cache/tier/slab_allocator.h"
#include "runtime/log.h"

namespace dpukv {

namespace {
uint64_t round_up(uint64_t v) {
  return (v + SlabAllocator::kAlign - 1) / SlabAllocator::kAlign * SlabAllocator::kAlign;
}
std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}
}  // namespace

Status FileStore::open(const std::string& path, uint64_t capacity, uint32_t queue_depth,
                       const std::vector<std::pair<void*, size_t>>& buffers,
                       std::unique_ptr<ChunkStore>* out) {
  std::unique_ptr<FileStore> s(new FileStore());
  const bool created = ::access(path.c_str(), F_OK) != 0;
  s->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0640);
  if (s->fd_ < 0 && errno == EINVAL) {  // no O_DIRECT here (tmpfs): buffered I/O
    s->direct_ = false;
    s->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  }
  if (s->fd_ < 0) {
    LOG_ERR("disk tier: cannot open %s: %s", path.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  DPUKV_RETURN_IF_ERROR(s->reserve(path, capacity, created));
  if (io_uring_queue_init(queue_depth, &s->ring_, 0) != 0) return Code::kDriver;
  s->ring_ok_ = true;
  s->efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->efd_ < 0 || io_uring_register_eventfd(&s->ring_, s->efd_) != 0) return Code::kDriver;
  // Fixed buffers: the arena in pieces of at most 1 GiB (the kernel's limit per iovec).
  std::vector<iovec> iov;
  for (auto [p, n] : buffers) {
    auto* c = static_cast<uint8_t*>(p);
    for (size_t off = 0; off < n; off += (1ull << 30)) {
      const size_t len = std::min<size_t>(n - off, 1ull << 30);
      iov.push_back({c + off, len});
      s->bufs_.push_back({c + off, len});
    }
  }
  if (!iov.empty() &&
      io_uring_register_buffers(&s->ring_, iov.data(), static_cast<unsigned>(iov.size())) != 0) {
    LOG_WARN("disk tier: cannot register fixed buffers; using plain I/O");
    s->bufs_.clear();
  }
  *out = std::move(s);
  return Code::kSuccess;
}

// Reserves the file's space up front, so a full disk shows at start and not
// mid-write, and never takes the filesystem's last free byte: the space still
// needed (beyond what the file already holds) must be free, else nothing is taken.
Status FileStore::reserve(const std::string& path, uint64_t want, bool created) {
  struct stat sb {};
  struct statvfs vfs {};
  if (::fstat(fd_, &sb) != 0 || ::fstatvfs(fd_, &vfs) != 0) {
    LOG_ERR("disk tier: cannot stat %s: %s", path.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  const uint64_t held = static_cast<uint64_t>(sb.st_blocks) * 512;
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  auto refuse = [&](const char* why) {
    LOG_ERR(
        "disk tier: %s in %s: %.1f MiB asked, %.1f MiB free (+%.1f MiB its file already "
        "holds); lower max_local_disk_size or free space",
        why, dir_of(path).c_str(), want / 1048576.0, free_bytes / 1048576.0, held / 1048576.0);
    if (created) ::unlink(path.c_str());
    return Status(Code::kFull);
  };
  if (want > held && want - held > free_bytes) return refuse("not enough free space");
  const int fr = posix_fallocate(fd_, 0, static_cast<off_t>(want));
  if (fr == ENOSPC || fr == EFBIG) return refuse("the filesystem refused the space");
  if (fr != 0) {
    LOG_ERR("disk tier: cannot reserve %llu bytes in %s: %s", static_cast<unsigned long long>(want),
            path.c_str(), std::strerror(fr));
    if (created) ::unlink(path.c_str());
    return Code::kIoFailed;
  }
  return Code::kSuccess;
}

FileStore::~FileStore() {
  if (ring_ok_) io_uring_queue_exit(&ring_);
  if (fd_ >= 0) ::close(fd_);
  if (efd_ >= 0) ::close(efd_);
}

int FileStore::buf_index(const void* p, uint64_t len) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (size_t i = 0; i < bufs_.size(); ++i) {
    auto b = reinterpret_cast<uintptr_t>(bufs_[i].first);
    if (a >= b && a + len <= b + bufs_[i].second) return static_cast<int>(i);
  }
  return -1;
}

Status FileStore::submit(bool write, uint64_t offset, void* buf, uint64_t len, uint64_t tag) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return Code::kAgain;
  const uint64_t n = direct_ ? round_up(len) : len;
  const int bi = buf_index(buf, n);
  const auto bytes = static_cast<unsigned>(n);
  if (write && bi >= 0)
    io_uring_prep_write_fixed(sqe, fd_, buf, bytes, offset, bi);
  else if (write)
    io_uring_prep_write(sqe, fd_, buf, bytes, offset);
  else if (bi >= 0)
    io_uring_prep_read_fixed(sqe, fd_, buf, bytes, offset, bi);
  else
    io_uring_prep_read(sqe, fd_, buf, bytes, offset);
  io_uring_sqe_set_data64(sqe, tag);
  ++inflight_;
  return io_uring_submit(&ring_) >= 0 ? Status() : Status(Code::kIoFailed);
}

Status FileStore::write(uint64_t offset, const void* buf, uint64_t len, uint64_t tag) {
  return submit(true, offset, const_cast<void*>(buf), len, tag);
}

Status FileStore::read(uint64_t offset, void* buf, uint64_t len, uint64_t tag) {
  return submit(false, offset, buf, len, tag);
}

size_t FileStore::poll(Completion* out, size_t max) {
  size_t n = 0;
  io_uring_cqe* cqe;
  while (n < max && io_uring_peek_cqe(&ring_, &cqe) == 0) {
    out[n].tag = io_uring_cqe_get_data64(cqe);
    // A short transfer is a failure too: the chunk is not whole on the device.
    out[n].status =
        cqe->res < 0
            ? Status(cqe->res == -ENOSPC || cqe->res == -EFBIG ? Code::kNoMemory : Code::kIoFailed)
            : Status();
    out[n].err = cqe->res < 0 ? -cqe->res : 0;
    io_uring_cqe_seen(&ring_, cqe);
    --inflight_;
    ++n;
  }
  if (n) {
    uint64_t v;
    ssize_t r = ::read(efd_, &v, sizeof(v));
    (void)r;
  }
  return n;
}

}  // namespace dpukv
