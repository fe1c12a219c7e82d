// Block devices behind NVMe namespaces (the bdev layer of SPDK, reduced to what a
// namespace needs): fixed-size blocks, vectored I/O, completion by callback.
//
// A request completes exactly once through io->done, either inside submit() (RAM
// and null devices) or from poll() (the file device's io_uring). The caller has
// checked the block range; devices check it again and fail with INVALID_VALUE,
// because a device must not trust its caller with another device's memory.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/status.h"

namespace dpukv::nvme {

enum class BdevOp : uint8_t { kRead, kWrite, kFlush, kWriteZeroes, kUnmap };

struct BdevIo {
  BdevOp op = BdevOp::kRead;
  uint64_t lba = 0;
  uint64_t nblocks = 0;
  const iovec* iov = nullptr;  // read/write only; total length = nblocks * block size
  int iovcnt = 0;
  void (*done)(BdevIo* io, Status status) = nullptr;
  void* ctx = nullptr;
  BdevIo* next_waiting = nullptr;  // owned by the device while the request waits
};

struct BdevStats {
  uint64_t reads = 0, writes = 0, bytes_read = 0, bytes_written = 0, errors = 0;
};

class Bdev {
 public:
  virtual ~Bdev() = default;
  const std::string& name() const { return name_; }
  uint32_t block_size() const { return block_size_; }
  uint64_t num_blocks() const { return num_blocks_; }
  const BdevStats& stats() const { return stats_; }
  virtual const char* kind() const = 0;

  virtual void submit(BdevIo* io) = 0;
  // Reaps completions of asynchronous devices; returns how many completed.
  virtual int poll() { return 0; }
  // Requests submitted and not yet completed.
  virtual uint32_t inflight() const { return 0; }

 protected:
  Bdev(std::string name, uint32_t block_size, uint64_t num_blocks)
      : name_(std::move(name)), block_size_(block_size), num_blocks_(num_blocks) {}
  bool in_range(const BdevIo& io) const {
    return io.nblocks <= num_blocks_ && io.lba <= num_blocks_ - io.nblocks;
  }
  void count(const BdevIo& io, Status st) {
    if (!st.ok()) {
      ++stats_.errors;
    } else if (io.op == BdevOp::kRead) {
      ++stats_.reads;
      stats_.bytes_read += io.nblocks * block_size_;
    } else if (io.op == BdevOp::kWrite) {
      ++stats_.writes;
      stats_.bytes_written += io.nblocks * block_size_;
    }
  }

  std::string name_;
  uint32_t block_size_;
  uint64_t num_blocks_;
  BdevStats stats_;
};

inline bool valid_block_size(uint32_t bs) {
  return bs == 512 || bs == 4096;
}

}  // namespace dpukv::nvme
