// Where a disk tier's chunk bytes live: asynchronous reads and writes at byte
// offsets (multiples of 4 KiB; lengths are rounded up to 4 KiB on the device) and
// completions collected by poll(). The tier (disk_tier.h) owns the allocator and
// the index log; a store only moves bytes. Implementations: FileStore (one
// preallocated file, io_uring, O_DIRECT) and NvmeStore (a namespace of an NVMe/TCP
// target); a remote store (the cluster step) joins them here.
//
// Not thread safe: used from the cache engine's thread. event_fd() becomes
// readable when completions wait, so the engine's progress engine can sleep on it.
#pragma once

#include <cstdint>

#include "runtime/status.h"

namespace dpukv {

class ChunkStore {
 public:
  // One finished I/O: the caller's tag, its result and, on failure, the errno
  // behind it (EIO where the device gives none).
  struct Completion {
    uint64_t tag;
    Status status;
    int err = 0;
  };

  virtual ~ChunkStore() = default;
  // AGAIN when no more I/O can be queued now (retry after a completion).
  virtual Status write(uint64_t offset, const void* buf, uint64_t len, uint64_t tag) = 0;
  virtual Status read(uint64_t offset, void* buf, uint64_t len, uint64_t tag) = 0;
  virtual size_t poll(Completion* out, size_t max) = 0;
  virtual int event_fd() const = 0;
  virtual uint32_t inflight() const = 0;
  virtual const char* kind() const = 0;  // "file", "nvme-tcp": for messages
};

}  // namespace dpukv
