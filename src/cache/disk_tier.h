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

#include "cache/chunk_key.h"
#include "cache/slab_allocator.h"
#include "runtime/status.h"

namespace dpukv {

struct DiskTierOptions {
  std::string dir;
  uint64_t capacity = 0;
  uint64_t page_size = 64ull << 20;  // largest chunk
  uint32_t queue_depth = 64;
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
  };

  // Opens or creates the files, replays the log, compacts it. recovered gets every
  // live chunk. `buffers` (page aligned) are registered for fixed I/O.
  static Status open(const DiskTierOptions& o, const std::vector<std::pair<void*, size_t>>& buffers,
                     std::vector<Recovered>* recovered, std::unique_ptr<DiskTier>* out);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  SlabAllocator& allocator() { return alloc_; }
  int event_fd() const { return efd_; }

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

 private:
  DiskTier() = default;
  int buf_index(const void* p, uint64_t len) const;
  bool append(const void* record);

  std::string dir_;
  int data_fd_ = -1, log_fd_ = -1, efd_ = -1;
  bool direct_ = true;
  io_uring ring_{};
  bool ring_ok_ = false;
  std::vector<std::pair<void*, size_t>> bufs_;
  SlabAllocator alloc_;
  uint64_t seq_ = 0;
  uint32_t inflight_ = 0;
  uint64_t log_errors_ = 0;
  uint64_t log_size_ = 0;
};

}  // namespace dpukv
