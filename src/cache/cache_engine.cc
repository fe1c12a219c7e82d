#include "cache/cache_requests.h"

#include <sys/epoll.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "runtime/chunk_checksum.h"
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
  table_.init(opts_.max_chunks);
  requests_.resize(opts_.max_requests);
  requests_per_state_[static_cast<size_t>(Request::State::kFree)] = opts_.max_requests;
  for (uint32_t i = 0; i < opts_.max_requests; ++i) {
    requests_[i].index = i;
    requests_[i].owner = this;
    free_requests_.push_back(&requests_[opts_.max_requests - 1 - i]);
  }
  waiting_.reserve(opts_.max_requests);
  retrying_.reserve(opts_.max_requests);
  policy_ = find_eviction_policy(opts_.policy)
                ->make({table_.capacity(), mem_alloc_.capacity(), page_bytes_});
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
      int32_t e = table_.insert(r.key);
      if (e < 0) break;
      ChunkEntry& en = table_.at(e);
      en.size = r.raw_len;
      en.stored = r.len;
      en.encoded = r.encoded;
      en.checksum = r.checksum;
      en.disk_off = r.offset;
      en.disk = ChunkEntry::Disk::kReady;
      table_.disk_push_front(e);  // log order: later records are more recent
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
    const int32_t e = table_.find(keys[i]);
    if (e < 0) break;
    ChunkEntry& en = table_.at(e);
    if (!en.mem_ready() && !en.on_disk()) break;
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
    const int32_t e = table_.find(keys[i]);
    if (e >= 0 && table_.at(e).pins > 0) --table_.at(e).pins;
  }
}

bool CacheEngine::contains(const ChunkKey& key) const {
  const int32_t e = table_.find(key);
  return e >= 0 && (table_.at(e).mem_ready() || table_.at(e).on_disk());
}

uint64_t CacheEngine::chunk_size(const ChunkKey& key) const {
  const int32_t e = table_.find(key);
  return e >= 0 ? table_.at(e).size : 0;
}

Status CacheEngine::remove(const ChunkKey& key) {
  const int32_t e = table_.find(key);
  if (e < 0) return Code::kNotFound;
  const ChunkEntry& en = table_.at(e);
  if (en.busy(monotonic_ns())) return Code::kBadState;
  drop_entry(e);
  return Code::kSuccess;
}

uint64_t CacheEngine::clear(uint64_t model) {
  uint64_t removed = 0;
  const uint64_t now = monotonic_ns();
  for (int32_t e = 0; e < static_cast<int32_t>(table_.capacity()); ++e) {
    const ChunkEntry& en = table_.at(e);
    if (!en.used || (model != 0 && en.key.model != model)) continue;
    if (en.busy(now)) continue;
    drop_entry(e);
    ++removed;
  }
  return removed;
}

CacheStats CacheEngine::stats() const {
  CacheStats s = st_;
  s.memory_used = mem_alloc_.used_bytes();
  const ChunkTable::Counts c = table_.counts();
  s.chunks = c.chunks;
  s.memory_chunks = c.memory;
  s.disk_chunks = c.disk;
  s.both_chunks = c.both;
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
  return table_.bytes_per_chunk() + policy_->bytes_per_chunk();
}

Status CacheEngine::sync() {
  return disk_ ? disk_->sync() : Status();
}

// ---------------------------------------------------------------- placement

void CacheEngine::touch(int32_t e) {
  ChunkEntry& en = table_.at(e);
  if (!en.mem_ready()) {
    if (en.on_disk() && !en.has_memory()) {  // used again while only on disk
      table_.disk_unlink(e);
      table_.disk_push_front(e);
    }
    return;
  }
  policy_->access(e);
}

int32_t CacheEngine::pick_victim() {
  return policy_->victim(
      [](const void* self, int32_t v) {
        return static_cast<const CacheEngine*>(self)->evictable(v);
      },
      this);
}

// With a disk tier the least valuable chunk of the whole cache is the disk queue's
// last disk-only chunk; memory's victim only when the disk holds none.
int32_t CacheEngine::pick_index_victim() {
  const uint64_t now = monotonic_ns();
  for (int32_t v = table_.disk_coldest(); v >= 0; v = table_.disk_warmer(v)) {
    const ChunkEntry& en = table_.at(v);
    if (en.memory == ChunkEntry::Memory::kNone && !en.pinned(now)) return v;
  }
  return pick_victim();
}

bool CacheEngine::evictable(int32_t e) const {
  const ChunkEntry& en = table_.at(e);
  return en.has_memory() && en.mem_ready() && !en.pinned(monotonic_ns()) && en.readers == 0 &&
         !en.writing() && !en.filling();
}

void CacheEngine::drop_memory(int32_t e) {
  ChunkEntry& en = table_.at(e);
  if (en.has_memory()) {
    if (en.on_disk() && en.mem_ready()) mem_clean_bytes_ -= en.stored;
    mem_alloc_.free(en.mem_off);
    policy_->remove(e);
    en.memory = ChunkEntry::Memory::kNone;
  }
  if (!en.on_disk()) {
    table_.erase(e);
    return;
  }
  // Now only on disk, and more recent than every other disk-only chunk.
  table_.disk_unlink(e);
  table_.disk_push_front(e);
}

void CacheEngine::drop_entry(int32_t e) {
  ChunkEntry& en = table_.at(e);
  drop_disk_copy(e);
  if (en.has_memory()) {
    drop_memory(e);
  } else {
    table_.erase(e);
  }
}

void CacheEngine::drop_disk_copy(int32_t e) {
  ChunkEntry& en = table_.at(e);
  if (!en.on_disk()) return;
  if (en.has_memory() && en.mem_ready()) mem_clean_bytes_ -= en.stored;
  table_.disk_unlink(e);
  disk_->allocator().free(en.disk_off);
  (void)disk_->log_del(en.key);  // a lost tombstone only costs a checksum miss after restart
  en.disk = ChunkEntry::Disk::kNone;
}

// ---------------------------------------------------------------- disk room

// Frees disk space for `size` bytes by dropping copies from the back of the disk
// queue: a copy whose chunk is also in memory loses only that copy; a disk-only
// chunk leaves the cache. Chunks being read from disk, and pinned disk-only chunks,
// stay. False if nothing more can go.
bool CacheEngine::make_disk_room(uint64_t size, uint64_t* off) {
  const uint64_t now = monotonic_ns();
  int32_t v = table_.disk_coldest();
  while (!disk_->allocator().alloc(size, off)) {
    while (v >= 0) {
      const ChunkEntry& en = table_.at(v);
      if (!en.filling() && !(en.pinned(now) && !en.mem_ready())) break;
      v = table_.disk_warmer(v);
    }
    if (v < 0) return false;
    const int32_t victim = v;
    v = table_.disk_warmer(v);
    if (table_.at(victim).mem_ready()) {
      drop_disk_copy(victim);
    } else {
      ++st_.disk_evictions;
      drop_entry(victim);
    }
  }
  return true;
}

// Write-back is paced by a watermark: clean memory (chunks with a disk copy, which
// eviction drops at once) plus free memory is kept at about an eighth of the tier
// (at most 8 of the largest chunks), with at most kMaxSpills writes in flight. So
// a store rarely waits for a write, the memory tier stays full of hot chunks, and
// few chunks hold a slot in both tiers. Below the watermark nothing is written
// ahead of need.
void CacheEngine::clean_ahead() {
  if (!disk_ || !spilling_allowed()) return;
  const uint64_t cap = mem_alloc_.capacity();
  const uint64_t target = std::min<uint64_t>(cap / 8, 8 * page_bytes_);
  uint64_t reserve = cap - mem_alloc_.used_bytes() + mem_clean_bytes_ + spill_bytes_;
  for (int32_t v = policy_->coldest(); v >= 0 && reserve < target && disk_ios_ < kMaxSpills;
       v = policy_->warmer(v)) {
    ChunkEntry& en = table_.at(v);
    if (en.on_disk() || en.writing() || !en.mem_ready() || en.hits < opts_.disk_admit_hits)
      continue;
    if (start_spill(v) != SpillStart::kStarted) break;
    reserve += en.stored;
  }
}

// Frees memory for `size` bytes. A victim without a disk copy is written back
// first (its memory goes when the write lands); while writes already under way
// will free enough, or kMaxSpills are in flight, no more start: false, and the
// caller waits for a completion. A victim the disk cannot take (tier full of
// pinned chunks, writes stopped after errors) is evicted outright, as it would be
// without a disk tier.
bool CacheEngine::make_room(uint64_t size, uint64_t* off) {
  for (;;) {
    if (mem_alloc_.alloc(size, off)) return true;
    // Room already coming covers the requests queued before this one first: each
    // waiter has its own write-back under way, so N waiters keep N writes in flight.
    if (evict_pending_bytes_ >= room_wanted_bytes_ + size) return false;
    const int32_t v = pick_victim();
    if (v < 0) return false;
    ChunkEntry& en = table_.at(v);
    if (disk_ && !en.on_disk() && en.hits >= opts_.disk_admit_hits) {
      if (disk_ios_ >= kMaxSpills) return false;
      const SpillStart r = start_spill(v);
      if (r == SpillStart::kStarted) {
        en.evict_after_write = true;
        evict_pending_bytes_ += en.stored;
        continue;
      }
      if (r == SpillStart::kBusy) return false;
    }
    ++st_.evictions;
    drop_memory(v);
  }
}

// A request that found no room waits while something in flight may still make
// some: a write-back landing, or a copy finishing (its chunk becomes evictable).
// Every such completion retries the waiters; with nothing in flight they fail.
void CacheEngine::wait_for_room(Request* r, uint64_t bytes) {
  set_state(r, Request::State::kWaitRoom);
  waiting_.push_back(r);
  room_wanted_bytes_ += bytes;
}

bool CacheEngine::room_may_come() const {
  return disk_ios_ > 0 || engine_ops_ > 0;
}

bool CacheEngine::spilling_allowed() const {
  return spill_off_until_ns_ == 0 || monotonic_ns() >= spill_off_until_ns_;
}

// A failed spill keeps the chunk in memory and stops writing back for a while, so
// that a disk that cannot take data (full, log cannot grow, device errors) leaves
// the memory tier exactly as full as it would be without a disk tier. Logged at
// most once a second, with the cause and how many were not logged.
void CacheEngine::disk_failed(const char* what, int err) {
  ++st_.io_errors;
  spill_off_until_ns_ = monotonic_ns() + kSpillBackoffNs;
  const uint64_t now = monotonic_ns();
  if (now - last_disk_log_ns_ >= 1000000000ull || last_disk_log_ns_ == 0) {
    LOG_ERR(
        "cache: disk tier %s: %s (%llu more since the last message); writing back stops "
        "for 1 s, chunks stay in memory",
        what, std::strerror(err), static_cast<unsigned long long>(disk_errors_unlogged_));
    last_disk_log_ns_ = now;
    disk_errors_unlogged_ = 0;
  } else {
    ++disk_errors_unlogged_;
  }
}

// ---------------------------------------------------------------- sharing
//
// The cache's side of sharing chunks between agents: showing a chunk in place
// (locate), taking in a chunk another party wrote into the arena (ingest), and
// telling listeners which chunks are present. How bytes travel between agents
// (UCX, a PD push) lives in src/cluster; the cache never includes it.

void CacheEngine::arena(void** base, uint64_t* len) const {
  *base = arena_->data();
  *len = arena_->size();
}

Status CacheEngine::locate(const ChunkKey& key, ChunkPlacement* out) {
  const int32_t e = table_.find(key);
  if (e < 0) return Code::kNotFound;
  ChunkEntry& en = table_.at(e);
  if (!en.mem_ready()) return en.on_disk() ? Status(Code::kAgain) : Status(Code::kNotFound);
  const uint64_t now = monotonic_ns();
  if (!en.pinned(now)) en.pins = 0;
  ++en.pins;
  en.pin_deadline = now + static_cast<uint64_t>(opts_.pin_timeout_ms) * 1000000ull;
  ++en.hits;
  touch(e);
  out->offset = en.mem_off;
  out->stored = en.stored;
  out->size = en.size;
  out->checksum = en.checksum;
  out->encoded = en.encoded;
  ++st_.located;
  return Code::kSuccess;
}

Status CacheEngine::begin_ingest(const ChunkKey& key, const ChunkPlacement& p, uint8_t** dst) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (p.stored == 0 || p.size == 0 || dst == nullptr) return Code::kInvalidValue;
  if (p.stored > page_bytes_ || p.size > opts_.max_chunk_bytes) return Code::kTooBig;
  if (p.encoded != (codec_ != nullptr)) return Code::kNotSupported;  // stored as this cache stores
  if (!p.encoded && p.stored != p.size) return Code::kInvalidValue;
  if (table_.find(key) >= 0) return Code::kBadState;
  int32_t e = table_.insert(key);
  while (e < 0) {  // a full index is a capacity like any other
    const int32_t v = disk_ ? pick_index_victim() : pick_victim();
    if (v < 0) break;
    ++st_.evictions;
    drop_entry(v);
    e = table_.insert(key);
  }
  uint64_t off = 0;
  if (e >= 0 && !make_room(p.stored, &off)) {
    table_.erase(e);
    e = -1;
  }
  if (e < 0) {
    ++st_.ingest_rejects;
    return Code::kNoMemory;
  }
  ChunkEntry& en = table_.at(e);
  en.size = p.size;
  en.stored = p.stored;
  en.encoded = p.encoded;
  en.checksum = p.checksum;
  en.mem_off = off;
  en.memory = ChunkEntry::Memory::kIngesting;  // not evictable, not yet present
  *dst = static_cast<uint8_t*>(arena_->data()) + off;
  return Code::kSuccess;
}

Status CacheEngine::end_ingest(const ChunkKey& key, bool bytes_ok) {
  const int32_t e = table_.find(key);
  if (e < 0 || table_.at(e).memory != ChunkEntry::Memory::kIngesting) return Code::kBadState;
  ChunkEntry& en = table_.at(e);
  const bool same = bytes_ok && chunk_checksum(static_cast<uint8_t*>(arena_->data()) + en.mem_off,
                                               en.stored) == en.checksum;
  if (!same) {
    if (bytes_ok) {
      ++st_.checksum_failures;
      LOG_WARN(
          "cache: ingested chunk %s (%llu bytes) does not match its checksum; "
          "dropped",
          key_text(en.key).c_str(), static_cast<unsigned long long>(en.stored));
    }
    ++st_.ingest_rejects;
    mem_alloc_.free(en.mem_off);
    en.memory = ChunkEntry::Memory::kNone;
    table_.erase(e);
    retry_waiting();  // the room it held may be what a waiting store needs
    return bytes_ok ? Status(Code::kCorrupted) : Status(Code::kIoFailed);
  }
  en.memory = ChunkEntry::Memory::kReady;
  en.replica_unread = true;
  policy_->insert_cold(e, en.key_hash, en.stored);
  ++st_.ingests;
  st_.ingest_bytes += en.size;
  table_.announce(e);
  return Code::kSuccess;
}

void CacheEngine::add_residency_listener(ResidencyCb cb, void* arg, bool replay) {
  table_.add_listener(cb, arg, replay);
}

void CacheEngine::remove_residency_listener(ResidencyCb cb, void* arg) {
  table_.remove_listener(cb, arg);
}

}  // namespace dpukv
