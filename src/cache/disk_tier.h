// Disk tier: one preallocated data file driven by io_uring (O_DIRECT, the memory
// arena registered as fixed buffers) and an append-only index log.
//
// Crash safety: a chunk's log record (key, offset, length, xxh3-64, sequence, CRC)
// is appended only after its data write has completed, and a removal appends a
// tombstone. Recovery replays the log up to the first torn or corrupt record and
// claims the recorded extents in the allocator; a record whose data did not reach
// the disk intact fails its checksum when read, is dropped and counted, and is
// reported as a miss. Recovery then writes a compacted log (live records only)
// and renames it over the old one.
//
// Not thread safe: owned by the cache engine's thread. Completions are collected
// by poll(); the ring's eventfd is watched by the engine's progress engine.
#pragma once

#include <liburing.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/slab_allocator.h"
#include "nvme/tcp_host.h"
#include "protocol/chunk_key.h"
#include "runtime/status.h"

namespace dpukv {

struct DiskTierOptions {
  std::string dir;
  uint64_t capacity = 0;
  uint64_t page_size = 64ull << 20;  // largest chunk
  uint32_t queue_depth = 64;
  // The NVMe tier: chunk data on a namespace of an NVMe/TCP target ("ADDR:PORT",
  // subsystem NQN, namespace id) instead of the local data file; the index log
  // stays in dir. Empty address: the file.
  std::string nvme_address;
  std::string nvme_nqn;
  uint32_t nvme_nsid = 1;
};

class DiskTier {
 public:
  struct Recovered {
    ChunkKey key;
    uint64_t offset, len, checksum;
    uint64_t raw_len;
    bool encoded;
  };
  // One completed I/O: the caller's tag and its result.
  struct Completion {
    uint64_t tag;
    Status status;
    int err = 0;  // the errno behind a failure (EIO where the device gives none)
  };

  // Opens or creates the files, replays the log, compacts it. recovered gets every
  // live chunk. `buffers` (page aligned) are registered for fixed I/O.
  static Status open(const DiskTierOptions& o, const std::vector<std::pair<void*, size_t>>& buffers,
                     std::vector<Recovered>* recovered, std::unique_ptr<DiskTier>* out);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  SlabAllocator& allocator() { return alloc_; }
  // Readable when completions are waiting (the ring's eventfd, or the NVMe queue's socket).
  int event_fd() const { return nvme_ ? nvme_->queue_fd(0) : efd_; }
  bool on_nvme() const { return nvme_ != nullptr; }

  // Asynchronous I/O of len bytes (rounded up to 4 KiB on the device) between buf
  // and the data file at offset. AGAIN if the ring is full.
  Status write(uint64_t offset, const void* buf, uint64_t len, uint64_t tag);
  Status read(uint64_t offset, void* buf, uint64_t len, uint64_t tag);
  // Collects up to max completions.
  size_t poll(Completion* out, size_t max);
  uint32_t inflight() const { return inflight_; }

  // Log records; false (and counted) if the log cannot be written (disk full).
  bool log_put(const ChunkKey& key, uint64_t offset, uint64_t len, uint64_t checksum,
               uint64_t raw_len, bool encoded);
  bool log_del(const ChunkKey& key);
  // Flushes the log to stable storage (clean shutdown, periodic).
  Status sync();

  uint64_t log_errors() const { return log_errors_; }
  int last_log_errno() const { return last_log_errno_; }  // cause of the last log failure

 private:
  DiskTier() = default;
  int buf_index(const void* p, uint64_t len) const;
  bool append(const void* record);
  Status lock_dir(const std::string& dir);
  Status reserve_data(const std::string& path, bool created);
  Status open_nvme(const DiskTierOptions& o);
  Status nvme_io(bool write, uint64_t offset, uint8_t* buf, uint64_t len, uint64_t tag);
  void nvme_submit();
  size_t nvme_poll(Completion* out, size_t max);

  // NVMe tier: chunk I/O cut into commands of at most the transfer limit, sent as
  // queue slots free up; a chunk completes when its last command does.
  struct Piece {
    uint64_t tag, lba;
    uint32_t nlb;
    uint8_t* buf;
    bool write;
  };
  struct TagState {
    uint32_t remaining = 0;
    bool failed = false;
  };
  std::unique_ptr<nvme::NvmeTcpHost> nvme_;
  uint32_t nvme_nsid_ = 1, nvme_bs_ = 4096, nvme_max_ = 0;
  std::vector<Piece> nvme_slots_;    // by command id
  std::vector<uint16_t> nvme_free_;  // free command ids
  std::vector<Piece> nvme_waiting_;  // FIFO of pieces not yet sent
  size_t nvme_waiting_head_ = 0;
  std::vector<std::pair<uint64_t, TagState>> nvme_tags_;  // chunks in flight (few)

  std::string dir_;
  int data_fd_ = -1, log_fd_ = -1, efd_ = -1;
  int lock_fd_ = -1;  // flock on dir/dpukv.lock, held for the tier's life
  bool direct_ = true;
  io_uring ring_{};
  bool ring_ok_ = false;
  std::vector<std::pair<void*, size_t>> bufs_;
  SlabAllocator alloc_;
  uint64_t seq_ = 0;
  uint32_t inflight_ = 0;
  uint64_t log_errors_ = 0;
  int last_log_errno_ = 0;
  uint64_t log_size_ = 0;
};

}  // namespace dpukv
