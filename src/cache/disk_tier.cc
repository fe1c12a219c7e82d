#include "cache/disk_tier.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "engines/compress/checksum.h"
#include "runtime/host_port.h"
#include "runtime/log.h"

namespace dpukv {
namespace {

struct LogRecord {
  static constexpr uint32_t kMagic = 0x474c4b44;  // "DKLG"
  uint32_t magic;
  uint16_t type;   // 1 put, 2 delete
  uint16_t flags;  // bit 0: the stored bytes are a KV-codec chunk
  ChunkKey key;
  uint64_t offset;
  uint64_t len;      // bytes stored
  uint64_t raw_len;  // bytes of the chunk as the client gave it
  uint64_t checksum;
  uint64_t seq;
  uint32_t pad;
  uint32_t crc;  // crc32c of everything before it
};
static_assert(sizeof(LogRecord) == 88);

struct KeyHash {
  size_t operator()(const ChunkKey& k) const { return k.hash(); }
};

uint64_t round_up(uint64_t v) {
  return (v + SlabAllocator::kAlign - 1) / SlabAllocator::kAlign * SlabAllocator::kAlign;
}

bool write_all(int fd, const void* p, size_t n) {
  auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

// Only one agent may own a disk tier: two would allocate the same extents and
// overwrite each other's chunks. The lock file holds the owner's pid so that the
// refusal can name it; the lock itself dies with the process (kill -9 included).
Status DiskTier::lock_dir(const std::string& dir) {
  const std::string path = dir + "/dpukv.lock";
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (lock_fd_ < 0) {
    LOG_ERR("disk tier: cannot open %s: %s", path.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(lock_fd_, pid, sizeof(pid) - 1, 0);
    if (n > 0) pid[n] = '\0';
    if (err == EWOULDBLOCK)
      LOG_ERR(
          "disk tier: %s is in use by another agent (pid %s); each agent needs its own "
          "--local-disk",
          dir.c_str(), n > 0 ? std::to_string(std::atol(pid)).c_str() : "unknown");
    else
      LOG_ERR("disk tier: cannot lock %s: %s", path.c_str(), std::strerror(err));
    return err == EWOULDBLOCK ? Code::kBadState : Code::kIoFailed;
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) < 0)
    LOG_WARN("disk tier: cannot record the pid in %s: %s", path.c_str(), std::strerror(errno));
  return Code::kSuccess;
}

// Reserves the data file's space up front, so a full disk shows at start and not
// mid-write, and never takes the filesystem's last free byte: the space still
// needed (beyond what the file already holds) must be free, else nothing is taken.
Status DiskTier::reserve_data(const std::string& path, bool created) {
  const uint64_t want = alloc_.capacity();
  struct stat sb {};
  struct statvfs vfs {};
  if (::fstat(data_fd_, &sb) != 0 || ::fstatvfs(data_fd_, &vfs) != 0) {
    LOG_ERR("disk tier: cannot stat %s: %s", path.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  const uint64_t held = static_cast<uint64_t>(sb.st_blocks) * 512;
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  auto refuse = [&](const char* why) {
    LOG_ERR(
        "disk tier: %s in %s: %.1f MiB asked, %.1f MiB free (+%.1f MiB its file already "
        "holds); lower max_local_disk_size or free space",
        why, dir_.c_str(), want / 1048576.0, free_bytes / 1048576.0, held / 1048576.0);
    if (created) ::unlink(path.c_str());
    return Status(Code::kFull);
  };
  if (want > held && want - held > free_bytes) return refuse("not enough free space");
  const int fr = posix_fallocate(data_fd_, 0, static_cast<off_t>(want));
  if (fr == ENOSPC || fr == EFBIG) return refuse("the filesystem refused the space");
  if (fr != 0) {
    LOG_ERR("disk tier: cannot reserve %llu bytes in %s: %s", static_cast<unsigned long long>(want),
            path.c_str(), std::strerror(fr));
    if (created) ::unlink(path.c_str());
    return Code::kIoFailed;
  }
  return Code::kSuccess;
}

Status DiskTier::open(const DiskTierOptions& o,
                      const std::vector<std::pair<void*, size_t>>& buffers,
                      std::vector<Recovered>* recovered, std::unique_ptr<DiskTier>* out) {
  std::unique_ptr<DiskTier> t(new DiskTier());
  t->dir_ = o.dir;
  if (::mkdir(o.dir.c_str(), 0750) != 0 && errno != EEXIST) {
    LOG_ERR("disk tier: mkdir %s: %s", o.dir.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  DPUKV_RETURN_IF_ERROR(t->lock_dir(o.dir));
  DPUKV_RETURN_IF_ERROR(t->alloc_.init(o.capacity, o.page_size));
  // The NVMe tier keeps no local data: the file exists only as a marker.
  const std::string data = o.dir + (o.nvme_address.empty() ? "/dpukv-data" : "/dpukv-data.nvme");
  const std::string log = o.dir + "/dpukv-index.log";
  const bool created = ::access(data.c_str(), F_OK) != 0;
  t->data_fd_ = ::open(data.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0640);
  if (t->data_fd_ < 0 && errno == EINVAL) {  // no O_DIRECT here (tmpfs): buffered I/O
    t->direct_ = false;
    t->data_fd_ = ::open(data.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  }
  if (t->data_fd_ < 0) {
    LOG_ERR("disk tier: cannot open %s: %s", data.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  if (!o.nvme_address.empty()) {
    DPUKV_RETURN_IF_ERROR(t->open_nvme(o));
  } else {
    DPUKV_RETURN_IF_ERROR(t->reserve_data(data, created));
  }

  // Replay the log.
  std::unordered_map<ChunkKey, Recovered, KeyHash> live;
  uint64_t records = 0, dropped = 0;
  int lfd = ::open(log.c_str(), O_RDONLY | O_CLOEXEC);
  if (lfd >= 0) {
    LogRecord r;
    for (;;) {
      ssize_t n = ::read(lfd, &r, sizeof(r));
      if (n != static_cast<ssize_t>(sizeof(r))) break;  // end, or a torn tail
      if (r.magic != LogRecord::kMagic || r.crc != crc32c(&r, offsetof(LogRecord, crc))) {
        ++dropped;
        break;  // nothing after a corrupt record is trusted
      }
      ++records;
      t->seq_ = std::max(t->seq_, r.seq + 1);
      if (r.type == 1)
        live[r.key] = Recovered{r.key, r.offset, r.len, r.checksum, r.raw_len, (r.flags & 1) != 0};
      else
        live.erase(r.key);
    }
    ::close(lfd);
  }
  for (auto& [k, r] : live) {
    if (t->alloc_.alloc_at(r.offset, r.len))
      recovered->push_back(r);
    else
      ++dropped;  // does not fit this configuration
  }
  // Compact: write the live set to a new log and rename it into place.
  const std::string tmp = log + ".tmp";
  int nfd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (nfd < 0) return Code::kIoFailed;
  for (const Recovered& r : *recovered) {
    LogRecord rec{};
    rec.magic = LogRecord::kMagic;
    rec.type = 1;
    rec.key = r.key;
    rec.offset = r.offset;
    rec.len = r.len;
    rec.raw_len = r.raw_len;
    rec.flags = r.encoded ? 1 : 0;
    rec.checksum = r.checksum;
    rec.seq = t->seq_++;
    rec.crc = crc32c(&rec, offsetof(LogRecord, crc));
    if (!write_all(nfd, &rec, sizeof(rec))) {
      ::close(nfd);
      return Code::kNoMemory;
    }
  }
  if (::fdatasync(nfd) != 0 || ::close(nfd) != 0 || ::rename(tmp.c_str(), log.c_str()) != 0)
    return Code::kIoFailed;
  t->log_fd_ = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (t->log_fd_ < 0) return Code::kIoFailed;
  t->log_size_ = recovered->size() * sizeof(LogRecord);
  if (records || dropped)
    LOG_INFO("disk tier %s: recovered %zu chunks from %llu log records (%llu dropped)",
             o.dir.c_str(), recovered->size(), static_cast<unsigned long long>(records),
             static_cast<unsigned long long>(dropped));

  if (io_uring_queue_init(o.queue_depth, &t->ring_, 0) != 0) return Code::kDriver;
  t->ring_ok_ = true;
  t->efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (t->efd_ < 0 || io_uring_register_eventfd(&t->ring_, t->efd_) != 0) return Code::kDriver;
  // Fixed buffers: the arena in pieces of at most 1 GiB (the kernel's limit per iovec).
  std::vector<iovec> iov;
  for (auto [p, n] : buffers) {
    auto* c = static_cast<uint8_t*>(p);
    for (size_t off = 0; off < n; off += (1ull << 30)) {
      const size_t len = std::min<size_t>(n - off, 1ull << 30);
      iov.push_back({c + off, len});
      t->bufs_.push_back({c + off, len});
    }
  }
  if (!iov.empty() &&
      io_uring_register_buffers(&t->ring_, iov.data(), static_cast<unsigned>(iov.size())) != 0) {
    LOG_WARN("disk tier: cannot register fixed buffers; using plain I/O");
    t->bufs_.clear();
  }
  *out = std::move(t);
  return Code::kSuccess;
}

DiskTier::~DiskTier() {
  if (ring_ok_) io_uring_queue_exit(&ring_);
  if (log_fd_ >= 0) {
    (void)::fdatasync(log_fd_);
    ::close(log_fd_);
  }
  if (data_fd_ >= 0) ::close(data_fd_);
  if (efd_ >= 0) ::close(efd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the directory
}

int DiskTier::buf_index(const void* p, uint64_t len) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (size_t i = 0; i < bufs_.size(); ++i) {
    auto b = reinterpret_cast<uintptr_t>(bufs_[i].first);
    if (a >= b && a + len <= b + bufs_[i].second) return static_cast<int>(i);
  }
  return -1;
}

Status DiskTier::write(uint64_t offset, const void* buf, uint64_t len, uint64_t tag) {
  if (nvme_) return nvme_io(true, offset, static_cast<uint8_t*>(const_cast<void*>(buf)), len, tag);
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return Code::kAgain;
  const uint64_t n = direct_ ? round_up(len) : len;
  const int bi = buf_index(buf, n);
  if (bi >= 0)
    io_uring_prep_write_fixed(sqe, data_fd_, buf, static_cast<unsigned>(n), offset, bi);
  else
    io_uring_prep_write(sqe, data_fd_, buf, static_cast<unsigned>(n), offset);
  io_uring_sqe_set_data64(sqe, tag);
  ++inflight_;
  return io_uring_submit(&ring_) >= 0 ? Status() : Status(Code::kIoFailed);
}

Status DiskTier::read(uint64_t offset, void* buf, uint64_t len, uint64_t tag) {
  if (nvme_) return nvme_io(false, offset, static_cast<uint8_t*>(buf), len, tag);
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return Code::kAgain;
  const uint64_t n = direct_ ? round_up(len) : len;
  const int bi = buf_index(buf, n);
  if (bi >= 0)
    io_uring_prep_read_fixed(sqe, data_fd_, buf, static_cast<unsigned>(n), offset, bi);
  else
    io_uring_prep_read(sqe, data_fd_, buf, static_cast<unsigned>(n), offset);
  io_uring_sqe_set_data64(sqe, tag);
  ++inflight_;
  return io_uring_submit(&ring_) >= 0 ? Status() : Status(Code::kIoFailed);
}

size_t DiskTier::poll(Completion* out, size_t max) {
  if (nvme_) return nvme_poll(out, max);
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

bool DiskTier::log_put(const ChunkKey& key, uint64_t offset, uint64_t len, uint64_t checksum,
                       uint64_t raw_len, bool encoded) {
  LogRecord rec{};
  rec.magic = LogRecord::kMagic;
  rec.type = 1;
  rec.flags = encoded ? 1 : 0;
  rec.key = key;
  rec.offset = offset;
  rec.len = len;
  rec.raw_len = raw_len;
  rec.checksum = checksum;
  rec.seq = seq_++;
  rec.crc = crc32c(&rec, offsetof(LogRecord, crc));
  return append(&rec);
}

bool DiskTier::append(const void* rec) {
  errno = 0;
  if (write_all(log_fd_, rec, sizeof(LogRecord))) {
    log_size_ += sizeof(LogRecord);
    return true;
  }
  last_log_errno_ = errno != 0 ? errno : EIO;
  // Cut a half-written record off, so later records are not behind a torn one.
  if (::ftruncate(log_fd_, static_cast<off_t>(log_size_)) != 0)
    LOG_ERR("disk tier: cannot trim the log");
  ++log_errors_;
  return false;
}

bool DiskTier::log_del(const ChunkKey& key) {
  LogRecord rec{};
  rec.magic = LogRecord::kMagic;
  rec.type = 2;
  rec.key = key;
  rec.seq = seq_++;
  rec.crc = crc32c(&rec, offsetof(LogRecord, crc));
  return append(&rec);
}

Status DiskTier::sync() {
  return ::fdatasync(log_fd_) == 0 ? Status() : Status(Code::kIoFailed);
}

// ---- the NVMe tier ----------------------------------------------------------

Status DiskTier::open_nvme(const DiskTierOptions& o) {
  nvme::TcpHostOptions h;
  if (!parse_host_port(o.nvme_address, &h.addr, &h.port)) {
    LOG_ERR("disk tier: the NVMe tier's address '%s' is not ADDR:PORT", o.nvme_address.c_str());
    return Code::kInvalidValue;
  }
  h.subnqn = o.nvme_nqn;
  h.queue_depth = static_cast<uint16_t>(std::min<uint32_t>(o.queue_depth + 1, 128));
  if (Status st = nvme::NvmeTcpHost::connect(h, &nvme_); !st.ok()) {
    LOG_ERR("disk tier: cannot connect to the NVMe/TCP target %s (%s): %s", o.nvme_address.c_str(),
            o.nvme_nqn.c_str(), std::string(st.name()).c_str());
    return Code::kIoFailed;
  }
  nvme_nsid_ = o.nvme_nsid;
  nvme_bs_ = nvme_->block_size(nvme_nsid_);
  if (nvme_bs_ == 0 || 4096 % nvme_bs_ != 0) {
    LOG_ERR("disk tier: namespace %u of %s is missing or has %u-byte blocks", nvme_nsid_,
            o.nvme_nqn.c_str(), nvme_bs_);
    return Code::kInvalidValue;
  }
  uint64_t bytes = nvme_->num_blocks(nvme_nsid_) * nvme_bs_;
  if (bytes < alloc_.capacity()) {
    LOG_ERR("disk tier: namespace %u holds %llu bytes, less than the tier's %llu", nvme_nsid_,
            static_cast<unsigned long long>(bytes),
            static_cast<unsigned long long>(alloc_.capacity()));
    return Code::kNoMemory;
  }
  nvme_max_ = nvme_->max_transfer();
  uint16_t depth = static_cast<uint16_t>(nvme_->queue_depth() - 1);
  nvme_slots_.assign(depth, Piece{});
  for (uint16_t i = depth; i-- > 0;) nvme_free_.push_back(i);
  LOG_INFO("disk tier: data on NVMe/TCP %s %s namespace %u (%llu bytes)", o.nvme_address.c_str(),
           o.nvme_nqn.c_str(), nvme_nsid_, static_cast<unsigned long long>(bytes));
  return Code::kSuccess;
}

Status DiskTier::nvme_io(bool write, uint64_t offset, uint8_t* buf, uint64_t len, uint64_t tag) {
  const uint64_t n = round_up(len);
  if (offset % nvme_bs_ != 0) return Code::kInvalidValue;
  TagState ts;
  for (uint64_t done = 0; done < n;) {
    uint64_t k = std::min<uint64_t>(n - done, nvme_max_);
    nvme_waiting_.push_back(Piece{tag, (offset + done) / nvme_bs_,
                                  static_cast<uint32_t>(k / nvme_bs_), buf + done, write});
    ++ts.remaining;
    done += k;
  }
  nvme_tags_.emplace_back(tag, ts);
  ++inflight_;
  nvme_submit();
  return Code::kSuccess;
}

void DiskTier::nvme_submit() {
  while (nvme_waiting_head_ < nvme_waiting_.size() && !nvme_free_.empty()) {
    Piece p = nvme_waiting_[nvme_waiting_head_++];
    uint16_t cid = nvme_free_.back();
    nvme_free_.pop_back();
    nvme_slots_[cid] = p;
    nvme::Sqe c{};
    c.opc = p.write ? nvme::kNvmWrite : nvme::kNvmRead;
    c.cid = cid;
    c.nsid = nvme_nsid_;
    c.cdw10 = static_cast<uint32_t>(p.lba);
    c.cdw11 = static_cast<uint32_t>(p.lba >> 32);
    c.cdw12 = p.nlb - 1;
    if (!nvme_->submit(0, c, p.buf, p.nlb * nvme_bs_, p.write).ok()) {
      for (auto& [t, s] : nvme_tags_)
        if (t == p.tag) s.failed = true;
    }
  }
  if (nvme_waiting_head_ == nvme_waiting_.size()) {
    nvme_waiting_.clear();
    nvme_waiting_head_ = 0;
  }
  (void)nvme_->flush_queue(0);  // the engine may sleep next: send what was queued
}

size_t DiskTier::nvme_poll(Completion* out, size_t max) {
  nvme::Cqe cqes[64];
  int got = nvme_->reap(0, cqes, 64);
  bool broken = got < 0;
  for (int i = 0; i < got; ++i) {
    uint16_t cid = cqes[i].cid;
    if (cid >= nvme_slots_.size()) continue;
    uint64_t tag = nvme_slots_[cid].tag;
    nvme_free_.push_back(cid);
    for (auto& [t, s] : nvme_tags_)
      if (t == tag) {
        --s.remaining;
        if (nvme::status_of_cqe(cqes[i].status) != nvme::kSuccess) s.failed = true;
        break;
      }
  }
  size_t n = 0;
  for (size_t i = 0; i < nvme_tags_.size() && n < max;) {
    TagState& s = nvme_tags_[i].second;
    if (s.remaining == 0 || broken) {
      const bool bad = s.failed || broken;
      out[n++] =
          Completion{nvme_tags_[i].first, bad ? Status(Code::kIoFailed) : Status(), bad ? EIO : 0};
      nvme_tags_.erase(nvme_tags_.begin() + static_cast<long>(i));
      --inflight_;
    } else {
      ++i;
    }
  }
  nvme_submit();
  return n;
}

}  // namespace dpukv
