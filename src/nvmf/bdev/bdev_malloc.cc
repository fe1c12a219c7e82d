// RAM and null block devices: complete inside submit(), no threads, no locks.
#include "nvmf/bdev/bdev_malloc.h"

#include <cstring>

#include "runtime/mem_region.h"

namespace dpukv::nvme {
namespace {

class MallocBdev final : public Bdev {
 public:
  MallocBdev(const std::string& name, uint64_t blocks, uint32_t bs, std::unique_ptr<MemRegion> mem)
      : Bdev(name, bs, blocks), mem_(std::move(mem)), base_(static_cast<uint8_t*>(mem_->data())) {}
  const char* kind() const override { return "malloc"; }

  void submit(BdevIo* io) override {
    Status st = Code::kSuccess;
    if (!in_range(*io)) {
      st = Code::kInvalidValue;
    } else {
      uint8_t* p = base_ + io->lba * block_size_;
      size_t len = io->nblocks * block_size_;
      switch (io->op) {
        case BdevOp::kRead:
        case BdevOp::kWrite:
          st = copy(io, p, len);
          break;
        case BdevOp::kWriteZeroes:
        case BdevOp::kUnmap:  // deallocated blocks read as zeroes (DLFEAT = 001b)
          std::memset(p, 0, len);
          break;
        case BdevOp::kFlush:
          break;
      }
    }
    count(*io, st);
    io->done(io, st);
  }

 private:
  Status copy(BdevIo* io, uint8_t* p, size_t len) {
    size_t done = 0;
    for (int i = 0; i < io->iovcnt; ++i) {
      size_t n = io->iov[i].iov_len;
      if (n > len - done) return Code::kInvalidValue;
      if (io->op == BdevOp::kRead)
        std::memcpy(io->iov[i].iov_base, p + done, n);
      else
        std::memcpy(p + done, io->iov[i].iov_base, n);
      done += n;
    }
    return done == len ? Status(Code::kSuccess) : Status(Code::kInvalidValue);
  }

  std::unique_ptr<MemRegion> mem_;
  uint8_t* base_;
};

class NullBdev final : public Bdev {
 public:
  NullBdev(const std::string& name, uint64_t blocks, uint32_t bs) : Bdev(name, bs, blocks) {}
  const char* kind() const override { return "null"; }
  void submit(BdevIo* io) override {
    Status st = in_range(*io) ? Status(Code::kSuccess) : Status(Code::kInvalidValue);
    if (st.ok() && io->op == BdevOp::kRead)
      for (int i = 0; i < io->iovcnt; ++i) std::memset(io->iov[i].iov_base, 0, io->iov[i].iov_len);
    count(*io, st);
    io->done(io, st);
  }
};

Status check_geometry(uint64_t num_blocks, uint32_t block_size) {
  if (!valid_block_size(block_size) || num_blocks == 0) return Code::kInvalidValue;
  if (num_blocks > (uint64_t{1} << 40) / block_size) return Code::kTooBig;  // 1 TiB
  return Code::kSuccess;
}

}  // namespace

Status create_malloc_bdev(const std::string& name, uint64_t num_blocks, uint32_t block_size,
                          std::unique_ptr<Bdev>* out) {
  if (Status st = check_geometry(num_blocks, block_size); !st.ok()) return st;
  MemRegionOptions o;
  o.shared = false;
  o.name = "dpukv-bdev";
  std::unique_ptr<MemRegion> mem;
  if (Status st = MemRegion::create(num_blocks * block_size, o, &mem); !st.ok()) return st;
  *out = std::make_unique<MallocBdev>(name, num_blocks, block_size, std::move(mem));
  return Code::kSuccess;
}

Status create_null_bdev(const std::string& name, uint64_t num_blocks, uint32_t block_size,
                        std::unique_ptr<Bdev>* out) {
  if (Status st = check_geometry(num_blocks, block_size); !st.ok()) return st;
  *out = std::make_unique<NullBdev>(name, num_blocks, block_size);
  return Code::kSuccess;
}

}  // namespace dpukv::nvme
