#include "cache/cache_engine_internal.h"

#include <sys/epoll.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

CacheEngine::CacheEngine(ProgressEngine* pe, const CacheOptions& o) : Context(pe), opts_(o) {
  disk_watch_.owner = this;
}

uint64_t CacheEngine::slot_bytes(const CacheOptions& o) {
  if (!o.compress) return o.max_chunk_bytes;
  return std::max<uint64_t>(
      o.max_chunk_bytes,
      kv_encode_bound(KvCodecParams{KvCodec::kLossless, KvDtype::kBf16, {1, 1, 0}, 0},
                      o.max_chunk_bytes));
}

Status CacheEngine::create(ProgressEngine* pe, const CacheOptions& o,
                           std::unique_ptr<CacheEngine>* out) {
  if (pe == nullptr || out == nullptr || o.memory_bytes == 0 || o.max_chunk_bytes == 0 ||
      slot_bytes(o) > o.memory_bytes || o.max_chunks == 0 || o.max_requests == 0 ||
      (!o.disk_dir.empty() && o.disk_bytes < o.max_chunk_bytes) ||
      find_eviction_policy(o.policy) == nullptr)
    return Code::kInvalidValue;
  std::unique_ptr<CacheEngine> c(new CacheEngine(pe, o));
  DPUKV_RETURN_IF_ERROR(c->init());
  *out = std::move(c);
  return Code::kSuccess;
}

Status CacheEngine::init() {
  MemRegionOptions mo;
  mo.name = "dpukv-memory-tier";
  DPUKV_RETURN_IF_ERROR(MemRegion::create(opts_.memory_bytes, mo, &arena_));
  DPUKV_RETURN_IF_ERROR(Mmap::create(arena_->data(), arena_->size(),
                                     kAccessLocalReadWrite | kAccessExportReadWrite, arena_->fd(),
                                     0, &arena_map_));
  DPUKV_RETURN_IF_ERROR(arena_map_->start());
  // With compression a chunk first takes a slot of the codec's worst case, which is a
  // little above its raw size: pages must hold that.
  page_bytes_ = slot_bytes(opts_);
  DPUKV_RETURN_IF_ERROR(mem_alloc_.init(arena_->size(), page_bytes_));
  DPUKV_RETURN_IF_ERROR(BufInventory::create(2 * opts_.max_requests + 16, &inv_));
  DmaOptions dopt = opts_.dma;
  dopt.max_buf_size = std::max<uint64_t>(dopt.max_buf_size, opts_.max_chunk_bytes);
  DPUKV_RETURN_IF_ERROR(DmaEngine::create(pe(), dopt, &dma_));
  UserData ud;
  ud.ptr = this;
  DPUKV_RETURN_IF_ERROR(dma_->set_user_data(ud));
  DPUKV_RETURN_IF_ERROR(
      dma_->set_memcpy_conf(&CacheEngine::dma_done, &CacheEngine::dma_done, opts_.max_requests));

  if (opts_.compress) {
    CompressOptions co;
    co.num_threads = opts_.compress_threads;
    co.max_buf_size = kv_encode_bound(
        KvCodecParams{KvCodec::kLossless, KvDtype::kBf16, {1, 1, 0}, 0}, opts_.max_chunk_bytes);
    DPUKV_RETURN_IF_ERROR(CompressEngine::create(pe(), co, &codec_));
    UserData cud;
    cud.ptr = this;
    DPUKV_RETURN_IF_ERROR(codec_->set_user_data(cud));
    DPUKV_RETURN_IF_ERROR(
        codec_->set_conf(&CacheEngine::codec_done, &CacheEngine::codec_done, opts_.max_requests));
  }
  entries_.resize(opts_.max_chunks);
  index_.init(opts_.max_chunks);
  requests_.resize(opts_.max_requests);
  requests_per_state_[static_cast<size_t>(Request::State::kFree)] = opts_.max_requests;
  for (uint32_t i = 0; i < opts_.max_requests; ++i) {
    requests_[i].index = i;
    requests_[i].owner = this;
    free_requests_.push_back(&requests_[opts_.max_requests - 1 - i]);
  }
  waiting_.reserve(opts_.max_requests);
  retrying_.reserve(opts_.max_requests);
  policy_ =
      find_eviction_policy(opts_.policy)
          ->make({static_cast<uint32_t>(entries_.size()), mem_alloc_.capacity(), page_bytes_});
  st_.memory_capacity = mem_alloc_.capacity();

  if (!opts_.disk_dir.empty()) {
    DiskTierOptions dopts;
    dopts.dir = opts_.disk_dir;
    dopts.capacity = opts_.disk_bytes;
    dopts.nvme_address = opts_.nvme_address;
    dopts.nvme_nqn = opts_.nvme_nqn;
    dopts.page_size = page_bytes_;
    std::vector<DiskTier::Recovered> rec;
    DPUKV_RETURN_IF_ERROR(DiskTier::open(dopts, {{arena_->data(), arena_->size()}}, &rec, &disk_));
    for (const auto& r : rec) {
      int32_t e = insert(r.key);
      if (e < 0) break;
      Entry& en = entries_[static_cast<size_t>(e)];
      en.size = r.raw_len;
      en.stored = r.len;
      en.encoded = r.encoded;
      en.checksum = r.checksum;
      en.disk_off = r.offset;
      en.on_disk = true;
      d_push(e, true);  // log order: later records are more recent
    }
    st_.recovered = rec.size();
    st_.disk_capacity = disk_->allocator().capacity();
  }
  return Code::kSuccess;
}

CacheEngine::~CacheEngine() {
  if (disk_ && disk_watch_.owner != nullptr && state() != CtxState::kIdle)
    pe()->unwatch_fd(disk_->event_fd(), &disk_watch_);
  // Return every internal buffer before the map and inventory go.
  for (Request& r : requests_) {
    if (r.arena_buf != nullptr) (void)r.arena_buf->dec_refcount(), r.arena_buf = nullptr;
    if (r.arena_buf2 != nullptr) (void)r.arena_buf2->dec_refcount(), r.arena_buf2 = nullptr;
  }
  dma_.reset();
  codec_.reset();
  if (arena_map_) (void)arena_map_->stop();
}

Status CacheEngine::do_start() {
  DPUKV_RETURN_IF_ERROR(dma_->start());
  if (codec_) DPUKV_RETURN_IF_ERROR(codec_->start());
  if (disk_) DPUKV_RETURN_IF_ERROR(pe()->watch_fd(disk_->event_fd(), EPOLLIN, &disk_watch_));
  return Code::kSuccess;
}

void CacheEngine::do_stop() {
  for (Request* r : waiting_) finish(r, Code::kShutdown);
  waiting_.clear();
  room_wanted_bytes_ = 0;
  (void)dma_->stop();
  if (codec_) (void)codec_->stop();
}

bool CacheEngine::drained() {
  if (free_requests_.size() != requests_.size() || dma_->state() != CtxState::kIdle) return false;
  if (codec_ && codec_->state() != CtxState::kIdle) return false;
  if (disk_ && disk_->inflight() != 0) return false;
  if (disk_) {
    pe()->unwatch_fd(disk_->event_fd(), &disk_watch_);
    (void)disk_->sync();
  }
  return true;
}

// ---------------------------------------------------------------- queries

uint32_t CacheEngine::lookup(const ChunkKey* keys, uint32_t n, bool pin) {
  uint32_t i = 0;
  const uint64_t now = monotonic_ns();
  const uint64_t deadline = now + static_cast<uint64_t>(opts_.pin_timeout_ms) * 1000000ull;
  for (; i < n; ++i) {
    const int32_t e = find(keys[i]);
    if (e < 0) break;
    Entry& en = entries_[static_cast<size_t>(e)];
    if (!en.mem_ready && !en.on_disk) break;
    if (pin) {
      if (!en.pinned(now)) en.pins = 0;
      ++en.pins;
      en.pin_deadline = deadline;
    }
  }
  return i;
}

void CacheEngine::unpin(const ChunkKey* keys, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t e = find(keys[i]);
    if (e >= 0 && entries_[static_cast<size_t>(e)].pins > 0)
      --entries_[static_cast<size_t>(e)].pins;
  }
}

bool CacheEngine::contains(const ChunkKey& key) const {
  const int32_t e = find(key);
  return e >= 0 &&
         (entries_[static_cast<size_t>(e)].mem_ready || entries_[static_cast<size_t>(e)].on_disk);
}

uint64_t CacheEngine::chunk_size(const ChunkKey& key) const {
  const int32_t e = find(key);
  return e >= 0 ? entries_[static_cast<size_t>(e)].size : 0;
}

Status CacheEngine::remove(const ChunkKey& key) {
  const int32_t e = find(key);
  if (e < 0) return Code::kNotFound;
  const Entry& en = entries_[static_cast<size_t>(e)];
  if (en.readers || en.spilling || en.loading || en.pinned(monotonic_ns())) return Code::kBadState;
  drop_entry(e);
  return Code::kSuccess;
}

uint64_t CacheEngine::clear(uint64_t model) {
  uint64_t removed = 0;
  const uint64_t now = monotonic_ns();
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& en = entries_[i];
    if (!en.used || (model != 0 && en.key.model != model)) continue;
    if (en.readers || en.spilling || en.loading || en.pinned(now)) continue;
    drop_entry(static_cast<int32_t>(i));
    ++removed;
  }
  return removed;
}

CacheStats CacheEngine::stats() const {
  CacheStats s = st_;
  s.memory_used = mem_alloc_.used_bytes();
  s.memory_chunks = s.disk_chunks = 0;
  for (const Entry& en : entries_) {
    if (!en.used) continue;
    s.memory_chunks += en.mem_ready;
    s.disk_chunks += en.on_disk;
    s.both_chunks += en.mem_ready && en.on_disk;
  }
  if (disk_) {
    s.disk_used = disk_->allocator().used_bytes();
    s.disk_log_errors = disk_->log_errors();
    s.disk_ios_in_flight = disk_ios_;
  }
  for (size_t i = 0; i < kRequestStates; ++i)
    s.requests_in_state[i] =
        requests_per_state_[static_cast<size_t>(Request::State::kWaitRoom) + i];
  return s;
}

uint64_t CacheEngine::index_bytes_per_chunk() const {
  return sizeof(Entry) + index_.bytes_per_id() + policy_->bytes_per_chunk();
}

Status CacheEngine::sync() {
  return disk_ ? disk_->sync() : Status();
}

}  // namespace dpukv
