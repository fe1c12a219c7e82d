#include "nvmf/bdev/bdev_kv.h"

#include <cstring>
#include <deque>

#include "cache/cache_engine.h"
#include "runtime/buf.h"
#include "runtime/log.h"
#include "runtime/mem_region.h"
#include "runtime/mmap.h"
#include "runtime/progress_engine.h"

namespace dpukv::nvme {
namespace {

// Copies between a request's iovecs (at byte offset `at`) and a flat buffer.
void iov_copy(const BdevIo* io, size_t at, uint8_t* buf, size_t len, bool to_iov) {
  for (int i = 0; i < io->iovcnt && len > 0; ++i) {
    size_t n = io->iov[i].iov_len;
    if (at >= n) {
      at -= n;
      continue;
    }
    size_t k = std::min(n - at, len);
    auto* p = static_cast<uint8_t*>(io->iov[i].iov_base) + at;
    if (to_iov)
      std::memcpy(p, buf, k);
    else
      std::memcpy(buf, p, k);
    buf += k;
    len -= k;
    at = 0;
  }
}

class KvBdev final : public Bdev {
 public:
  KvBdev(const std::string& name, const KvBdevOptions& o)
      : Bdev(name, o.block_size, o.num_blocks), o_(o) {}
  ~KvBdev() override {
    while (!queue_.empty()) poll();
    if (cache_ && cache_->state() != CtxState::kIdle) {
      (void)cache_->stop();
      while (cache_->state() != CtxState::kIdle) pe_->progress();
    }
    cache_.reset();
    if (map_) (void)map_->stop();
  }
  const char* kind() const override { return "kv"; }

  Status init() {
    if (Status st = ProgressEngine::create(&pe_); !st.ok()) return st;
    CacheOptions co;
    co.memory_bytes = o_.memory_bytes;
    co.max_chunk_bytes = o_.chunk_bytes;
    co.max_chunks = static_cast<uint32_t>(
        std::min<uint64_t>(1u << 20, num_blocks_ * block_size_ / o_.chunk_bytes + 16));
    co.max_requests = 16;
    co.disk_dir = o_.disk_dir;
    co.disk_bytes = o_.disk_bytes;
    co.dma.num_threads = 1;
    if (Status st = CacheEngine::create(pe_.get(), co, &cache_); !st.ok()) return st;
    if (Status st = cache_->start(); !st.ok()) return st;
    if (Status st = MemRegion::create(o_.chunk_bytes, MemRegionOptions{}, &staging_); !st.ok())
      return st;
    if (Status st = Mmap::create(staging_->data(), staging_->size(), kAccessLocalReadWrite,
                                 staging_->fd(), 0, &map_);
        !st.ok())
      return st;
    if (Status st = map_->start(); !st.ok()) return st;
    model_ = model_id("dpukv-nvme-kv:" + name_);
    return BufInventory::create(8, &inv_);
  }

  void submit(BdevIo* io) override {
    if (!in_range(*io)) {
      count(*io, Code::kInvalidValue);
      return io->done(io, Code::kInvalidValue);
    }
    queue_.push_back(io);
    if (queue_.size() == 1) start_io();
  }
  int poll() override {
    int before = completed_;
    pe_->progress();
    return completed_ - before;
  }
  uint32_t inflight() const override { return static_cast<uint32_t>(queue_.size()); }

 private:
  ChunkKey key(uint64_t chunk) const { return ChunkKey{model_, 1, 0, o_.chunk_bytes, chunk}; }
  uint8_t* staging() const { return static_cast<uint8_t*>(staging_->data()); }

  // The current request covers bytes [pos_, end_) of the namespace.
  void start_io() {
    BdevIo* io = queue_.front();
    pos_ = io->lba * block_size_;
    end_ = pos_ + io->nblocks * block_size_;
    if (io->op == BdevOp::kFlush) {
      Status st = cache_->sync();
      return finish(st.ok() ? Status(Code::kSuccess) : Status(Code::kIoFailed));
    }
    next_chunk();
  }

  void next_chunk() {
    BdevIo* io = queue_.front();
    if (pos_ >= end_) return finish(Code::kSuccess);
    chunk_ = pos_ / o_.chunk_bytes;
    off_ = pos_ % o_.chunk_bytes;
    len_ = std::min<uint64_t>(o_.chunk_bytes - off_, end_ - pos_);
    bool whole = off_ == 0 && len_ == o_.chunk_bytes;
    if (io->op == BdevOp::kRead || !whole)
      return fetch();  // reads, and the "read" of read-modify-write
    if (io->op == BdevOp::kWrite) {
      iov_copy(io, pos_ - io->lba * block_size_, staging(), len_, false);
      return replace();
    }
    Status st = cache_->remove(key(chunk_));  // whole chunk zeroed or deallocated
    if (!st.ok() && st.code() != Code::kNotFound) return finish(Code::kIoFailed);
    advance();
  }

  void advance() {
    pos_ += len_;
    next_chunk();
  }

  static void fetched(void* arg, Status st) {
    auto* b = static_cast<KvBdev*>(arg);
    (void)b->buf_->dec_refcount();
    b->buf_ = nullptr;
    if (st.code() == Code::kNotFound) {  // never written, evicted, or failed its checksum
      std::memset(b->staging(), 0, b->o_.chunk_bytes);
    } else if (!st.ok()) {
      return b->finish(Code::kIoFailed);
    }
    b->after_fetch();
  }

  void fetch() {
    Status st = inv_->get_by_addr(map_.get(), staging(), o_.chunk_bytes, &buf_);
    if (st.ok()) st = cache_->retrieve(key(chunk_), buf_, &KvBdev::fetched, this);
    if (st.code() == Code::kNotFound) {
      if (buf_ != nullptr) (void)buf_->dec_refcount();
      buf_ = nullptr;
      std::memset(staging(), 0, o_.chunk_bytes);
      return after_fetch();
    }
    if (!st.ok()) {
      if (buf_ != nullptr) (void)buf_->dec_refcount();
      buf_ = nullptr;
      finish(Code::kIoFailed);
    }
  }

  void after_fetch() {
    BdevIo* io = queue_.front();
    size_t at = pos_ - io->lba * block_size_;
    if (io->op == BdevOp::kRead) {
      iov_copy(io, at, staging() + off_, len_, true);
      return advance();
    }
    if (io->op == BdevOp::kWrite)
      iov_copy(io, at, staging() + off_, len_, false);
    else
      std::memset(staging() + off_, 0, len_);
    replace();
  }

  static void stored(void* arg, Status st) {
    auto* b = static_cast<KvBdev*>(arg);
    (void)b->buf_->dec_refcount();
    b->buf_ = nullptr;
    if (!st.ok()) return b->finish(Code::kIoFailed);
    b->advance();
  }

  // Chunks are immutable in the engine: a new version replaces the old one.
  void replace() {
    Status st = cache_->remove(key(chunk_));
    if (!st.ok() && st.code() != Code::kNotFound) return finish(Code::kIoFailed);
    st = inv_->get_by_data(map_.get(), staging(), o_.chunk_bytes, &buf_);
    if (st.ok()) st = cache_->store(key(chunk_), buf_, &KvBdev::stored, this);
    if (!st.ok()) {
      if (buf_ != nullptr) (void)buf_->dec_refcount();
      buf_ = nullptr;
      finish(Code::kIoFailed);
    }
  }

  void finish(Status st) {
    BdevIo* io = queue_.front();
    queue_.pop_front();
    ++completed_;
    count(*io, st);
    io->done(io, st);
    if (!queue_.empty()) start_io();
  }

  KvBdevOptions o_;
  std::unique_ptr<ProgressEngine> pe_;
  std::unique_ptr<CacheEngine> cache_;
  std::unique_ptr<MemRegion> staging_;
  std::unique_ptr<Mmap> map_;
  std::unique_ptr<BufInventory> inv_;
  uint64_t model_ = 0;
  std::deque<BdevIo*> queue_;
  Buf* buf_ = nullptr;
  uint64_t pos_ = 0, end_ = 0, chunk_ = 0, off_ = 0, len_ = 0;
  int completed_ = 0;
};

}  // namespace

Status create_kv_bdev(const std::string& name, const KvBdevOptions& o, std::unique_ptr<Bdev>* out) {
  if (!valid_block_size(o.block_size) || o.num_blocks == 0 || o.chunk_bytes < o.block_size ||
      o.chunk_bytes % o.block_size != 0 || (o.chunk_bytes & (o.chunk_bytes - 1)) != 0 ||
      o.chunk_bytes > (4u << 20) || o.memory_bytes < o.chunk_bytes)
    return Code::kInvalidValue;
  auto b = std::make_unique<KvBdev>(name, o);
  if (Status st = b->init(); !st.ok()) return st;
  *out = std::move(b);
  return Code::kSuccess;
}

}  // namespace dpukv::nvme
