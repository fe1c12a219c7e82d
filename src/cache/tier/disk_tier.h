// Disk tier: the space allocator, a ChunkStore that holds the bytes (a local file
// or an NVMe/TCP namespace, chunk_store.h) and the index log (index_log.h), in a
// directory that one agent owns at a time.
//
// Crash safety: a chunk's log record is appended only after its data write has
// completed, and a removal appends a tombstone. Recovery replays the log up to the
// first torn or corrupt record and claims the recorded extents in the allocator;
// a record whose data did not reach the disk intact fails its checksum when read,
// is dropped and counted, and is reported as a miss.
//
// Not thread safe: owned by the cache engine's thread. Completions are collected
// by poll(); event_fd() is watched by the engine's progress engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/tier/chunk_store.h"
#include "cache/tier/index_log.h"
#include "cache/tier/slab_allocator.h"
#include "protocol/chunk_key.h"
#include "runtime/status.h"

namespace dpukv {

struct DiskTierOptions {
  std::string dir;
  uint64_t capacity = 0;
  uint64_t page_size = 64ull << 20;  // largest chunk
  uint32_t queue_depth = 64;
  // The most chunks recovery may hand back (the chunk table's room; 0: no bound).
  // Past it the oldest records are dropped and their space is free again.
  uint64_t max_chunks = 0;
  // The NVMe tier: chunk data on a namespace of an NVMe/TCP target ("ADDR:PORT",
  // subsystem NQN, namespace id) instead of the local data file; the index log
  // stays in dir. Empty address: the file.
  std::string nvme_address;
  std::string nvme_nqn;
  uint32_t nvme_nsid = 1;
};

class DiskTier {
 public:
  using Recovered = IndexLog::Record;
  using Completion = ChunkStore::Completion;

  // Takes the directory (flock on dir/dpukv.lock; BAD_STATE naming the owner's pid
  // if another agent holds it), opens the store, replays and compacts the log.
  // recovered gets the live chunks oldest first (at most o.max_chunks, the newest). `buffers` (page
  // aligned) are registered for fixed I/O where the store can use them.
  static Status open(const DiskTierOptions& o, const std::vector<std::pair<void*, size_t>>& buffers,
                     std::vector<Recovered>* recovered, std::unique_ptr<DiskTier>* out);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const SlabAllocator& allocator() const { return alloc_; }
  // Room on the disk for a chunk of size bytes (false: none without evicting), and
  // its return.
  bool alloc(uint64_t size, uint64_t* off) { return alloc_.alloc(size, off); }
  void free(uint64_t off) { alloc_.free(off); }
  int event_fd() const { return store_->event_fd(); }

  // Asynchronous I/O of len bytes between buf and the store at offset. AGAIN if
  // nothing more can be queued now.
  Status write(uint64_t offset, const void* buf, uint64_t len, uint64_t tag) {
    return store_->write(offset, buf, len, tag);
  }
  Status read(uint64_t offset, void* buf, uint64_t len, uint64_t tag) {
    return store_->read(offset, buf, len, tag);
  }
  size_t poll(Completion* out, size_t max) { return store_->poll(out, max); }
  uint32_t inflight() const { return store_->inflight(); }

  // Log records; false (and counted) if the log cannot be written (disk full).
  bool log_put(const ChunkKey& key, uint64_t offset, uint64_t len, uint64_t checksum,
               uint64_t raw_len, bool encoded) {
    return log_->put(key, offset, len, checksum, raw_len, encoded);
  }
  bool log_del(const ChunkKey& key) { return log_->del(key); }
  Status sync() { return log_->sync(); }  // clean shutdown, periodic
  uint64_t log_errors() const { return log_->errors(); }
  int last_log_errno() const { return log_->last_errno(); }  // cause of the last log failure

 private:
  DiskTier() = default;
  Status lock_dir(const std::string& dir);

  SlabAllocator alloc_;
  std::unique_ptr<ChunkStore> store_;
  std::unique_ptr<IndexLog> log_;
  int lock_fd_ = -1;  // flock on dir/dpukv.lock, held for the tier's life
};

}  // namespace dpukv
