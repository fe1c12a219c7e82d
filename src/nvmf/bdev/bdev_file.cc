// File block device: io_uring, O_DIRECT where the file system has it.
//
// Data moves through aligned bounce buffers: host memory named by PRPs starts at
// any dword, while O_DIRECT wants block-aligned addresses. Submissions are
// batched: submit() only prepares an SQE; poll() rings io_uring once for all of
// them, so a busy queue costs one syscall per poll, not per command.
#include "nvmf/bdev/bdev_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "runtime/log.h"

namespace dpukv::nvme {
namespace {

constexpr uint32_t kSlots = 64;
constexpr size_t kSlotBytes = 1u << 20;  // the controller's MDTS

class FileBdev final : public Bdev {
 public:
  FileBdev(const std::string& name, uint64_t blocks, uint32_t bs) : Bdev(name, bs, blocks) {}
  ~FileBdev() override {
    while (inflight_ > 0) poll_wait();
    if (ring_ok_) io_uring_queue_exit(&ring_);
    if (bounce_ != MAP_FAILED) munmap(bounce_, kSlots * kSlotBytes);
    if (zeroes_ != MAP_FAILED) munmap(zeroes_, kSlotBytes);
    if (fd_ >= 0) ::close(fd_);
  }
  const char* kind() const override { return "file"; }

  Status open(const std::string& path, uint64_t size_bytes) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0640);
    if (fd_ < 0 && errno == EINVAL) {
      fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
      LOG_WARN("bdev %s: no O_DIRECT on %s; using buffered I/O", name_.c_str(), path.c_str());
    }
    if (fd_ < 0) {
      LOG_ERR("bdev %s: open %s: %s", name_.c_str(), path.c_str(), strerror(errno));
      return Code::kIoFailed;
    }
    struct stat sb {};
    if (fstat(fd_, &sb) != 0) return Code::kIoFailed;
    if (static_cast<uint64_t>(sb.st_size) < size_bytes &&
        ftruncate(fd_, static_cast<off_t>(size_bytes)) != 0) {
      LOG_ERR("bdev %s: cannot size %s to %llu bytes: %s", name_.c_str(), path.c_str(),
              static_cast<unsigned long long>(size_bytes), strerror(errno));
      return Code::kIoFailed;
    }
    bounce_ = mmap(nullptr, kSlots * kSlotBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bounce_ == MAP_FAILED) return Code::kNoMemory;
    for (uint32_t i = 0; i < kSlots; ++i) free_.push_back(kSlots - 1 - i);
    slot_io_.assign(kSlots, nullptr);
    if (io_uring_queue_init(kSlots, &ring_, 0) != 0) return Code::kDriver;
    ring_ok_ = true;
    return Code::kSuccess;
  }

  void submit(BdevIo* io) override {
    if (!in_range(*io) || io->nblocks * block_size_ > kSlotBytes)
      return finish(io, Code::kInvalidValue);
    off_t off = static_cast<off_t>(io->lba * block_size_);
    off_t len = static_cast<off_t>(io->nblocks * block_size_);
    switch (io->op) {
      case BdevOp::kWriteZeroes:
      case BdevOp::kUnmap: {
        // Rare and small on this path: done inline rather than through the ring.
        int mode = io->op == BdevOp::kUnmap ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
                                            : FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE;
        if (fallocate(fd_, mode, off, len) != 0 && !zero_by_write(off, len))
          return finish(io, Code::kIoFailed);
        return finish(io, Code::kSuccess);
      }
      default:
        break;
    }
    if (free_.empty()) {  // every bounce buffer busy: wait in order
      io->next_waiting = nullptr;
      if (wait_tail_ != nullptr)
        wait_tail_->next_waiting = io;
      else
        wait_head_ = io;
      wait_tail_ = io;
      return;
    }
    start(io);
  }

  int poll() override {
    if (pending_submit_) {
      io_uring_submit(&ring_);
      pending_submit_ = false;
    }
    int n = 0;
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
      uint32_t slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      complete_slot(slot, res);
      ++n;
    }
    while (wait_head_ != nullptr && !free_.empty()) {
      BdevIo* io = wait_head_;
      wait_head_ = io->next_waiting;
      if (wait_head_ == nullptr) wait_tail_ = nullptr;
      start(io);
    }
    return n;
  }
  uint32_t inflight() const override {
    uint32_t waiting = 0;
    for (BdevIo* w = wait_head_; w != nullptr; w = w->next_waiting) ++waiting;
    return inflight_ + waiting;
  }

 private:
  uint8_t* slot_buf(uint32_t s) { return static_cast<uint8_t*>(bounce_) + size_t{s} * kSlotBytes; }

  void start(BdevIo* io) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return finish(io, Code::kAgain);
    }
    uint32_t slot = free_.back();
    free_.pop_back();
    slot_io_[slot] = io;
    size_t len = io->nblocks * block_size_;
    off_t off = static_cast<off_t>(io->lba * block_size_);
    if (io->op == BdevOp::kWrite) {
      gather(io, slot_buf(slot), len);
      io_uring_prep_write(sqe, fd_, slot_buf(slot), static_cast<unsigned>(len), off);
    } else if (io->op == BdevOp::kRead) {
      io_uring_prep_read(sqe, fd_, slot_buf(slot), static_cast<unsigned>(len), off);
    } else {
      io_uring_prep_fsync(sqe, fd_, IORING_FSYNC_DATASYNC);
    }
    io_uring_sqe_set_data64(sqe, slot);
    ++inflight_;
    pending_submit_ = true;
  }

  void complete_slot(uint32_t slot, int res) {
    BdevIo* io = slot_io_[slot];
    slot_io_[slot] = nullptr;
    free_.push_back(slot);
    --inflight_;
    size_t len = io->op == BdevOp::kFlush ? 0 : io->nblocks * block_size_;
    if (res < 0 || static_cast<size_t>(res) != len) {
      LOG_ERR("bdev %s: %s at block %llu failed: %s", name_.c_str(),
              io->op == BdevOp::kRead    ? "read"
              : io->op == BdevOp::kWrite ? "write"
                                         : "flush",
              static_cast<unsigned long long>(io->lba),
              res < 0 ? strerror(-res) : "short transfer");
      return finish(io, Code::kIoFailed);
    }
    if (io->op == BdevOp::kRead) scatter(io, slot_buf(slot), len);
    finish(io, Code::kSuccess);
  }

  static void gather(const BdevIo* io, uint8_t* dst, size_t len) {
    size_t done = 0;
    for (int i = 0; i < io->iovcnt && done < len; ++i) {
      size_t n = std::min(io->iov[i].iov_len, len - done);
      std::memcpy(dst + done, io->iov[i].iov_base, n);
      done += n;
    }
  }
  static void scatter(const BdevIo* io, const uint8_t* src, size_t len) {
    size_t done = 0;
    for (int i = 0; i < io->iovcnt && done < len; ++i) {
      size_t n = std::min(io->iov[i].iov_len, len - done);
      std::memcpy(io->iov[i].iov_base, src + done, n);
      done += n;
    }
  }

  // Fallback when the file system cannot fallocate: plain writes from a page-aligned
  // zero buffer (an anonymous mapping, never touched, so it costs no memory).
  bool zero_by_write(off_t off, off_t len) {
    if (zeroes_ == MAP_FAILED)
      zeroes_ = mmap(nullptr, kSlotBytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (zeroes_ == MAP_FAILED) return false;
    while (len > 0) {
      size_t n = static_cast<size_t>(std::min<off_t>(len, static_cast<off_t>(kSlotBytes)));
      if (pwrite(fd_, zeroes_, n, off) != static_cast<ssize_t>(n)) return false;
      off += static_cast<off_t>(n);
      len -= static_cast<off_t>(n);
    }
    return true;
  }

  void poll_wait() {
    io_uring_submit(&ring_);
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring_, &cqe) == 0) {
      uint32_t slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      complete_slot(slot, res);
    }
  }

  void finish(BdevIo* io, Status st) {
    count(*io, st);
    io->done(io, st);
  }

  int fd_ = -1;
  io_uring ring_{};
  bool ring_ok_ = false;
  bool pending_submit_ = false;
  void* bounce_ = MAP_FAILED;
  void* zeroes_ = MAP_FAILED;
  std::vector<uint32_t> free_;
  std::vector<BdevIo*> slot_io_;
  uint32_t inflight_ = 0;
  BdevIo* wait_head_ = nullptr;
  BdevIo* wait_tail_ = nullptr;
};

}  // namespace

Status create_file_bdev(const std::string& name, const std::string& path, uint64_t size_bytes,
                        uint32_t block_size, std::unique_ptr<Bdev>* out) {
  if (!valid_block_size(block_size)) return Code::kInvalidValue;
  uint64_t size = size_bytes;
  if (size == 0) {
    struct stat sb {};
    if (stat(path.c_str(), &sb) != 0) return Code::kNotFound;
    size = static_cast<uint64_t>(sb.st_size);
  }
  uint64_t blocks = size / block_size;
  if (blocks == 0) return Code::kInvalidValue;
  auto b = std::make_unique<FileBdev>(name, blocks, block_size);
  if (Status st = b->open(path, size_bytes); !st.ok()) return st;
  *out = std::move(b);
  return Code::kSuccess;
}

}  // namespace dpukv::nvme
