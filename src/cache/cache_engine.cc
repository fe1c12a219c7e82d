#include "cache/cache_engine.h"

#include <sys/epoll.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

namespace {
constexpr int32_t kEmpty = -1, kTomb = -2;
}  // namespace

struct CacheEngine::Entry {
  ChunkKey key;
  uint64_t size = 0;      // bytes of the chunk as the client gave it
  uint64_t stored = 0;    // bytes it takes in the tiers (encoded size, or size)
  uint64_t checksum = 0;  // xxh3-64 of the stored bytes
  bool encoded = false;
  uint64_t mem_off = 0, disk_off = 0;
  uint64_t pin_deadline = 0;
  // Lookup pins hold until unpinned or their deadline passes.
  bool pinned(uint64_t now) const { return pins != 0 && now < pin_deadline; }
  int32_t dprev = -1, dnext = -1;  // disk queue links (on_disk only)
  uint32_t hits = 0;
  uint16_t pins = 0;     // lookup pins
  uint16_t readers = 0;  // DMA or disk writes reading the memory copy
  bool used = false;
  bool in_mem = false;     // holds memory (maybe still being filled)
  bool mem_ready = false;  // memory copy complete and valid
  bool on_disk = false;    // a complete copy is on disk and logged
  bool spilling = false, loading = false;
  bool evict_when_clean = false;  // drop the memory copy once the spill lands
};

// One store, retrieve, prefetch or spill in flight: an explicit state machine.
struct CacheEngine::Request {
  enum class Kind : uint8_t { kStore, kRetrieve, kPrefetch, kSpill };
  enum class State : uint8_t {
    kFree,
    kWaitRoom,   // waiting for a spill to free memory
    kDma,        // a DMA (with checksum) is moving the bytes
    kDiskRead,   // reloading from disk into the arena
    kDiskWrite,  // spilling from the arena to disk
    kEncode,     // the compress engine encodes the client's bytes into the arena
    kShrink,     // the DMA moves the encoded chunk to a slot of its own size
    kDecode,     // the compress engine decodes the arena copy into the client's buffer
    kDone,       // finished
  };
  Kind kind = Kind::kStore;
  State state = State::kFree;
  int32_t entry = -1;
  ChunkKey key;
  Buf* user = nullptr;
  Buf* arena_buf = nullptr;
  Buf* arena_buf2 = nullptr;      // the final slot while shrinking
  uint64_t big_off = UINT64_MAX;  // the encode slot while shrinking
  DoneCb cb = nullptr;
  void* arg = nullptr;
  uint64_t disk_off = 0;
  Status status;
  uint32_t index = 0;
};

CacheEngine::CacheEngine(ProgressEngine* pe, const CacheOptions& o) : Context(pe), opts_(o) {
  disk_watch_.owner = this;
}

Status CacheEngine::create(ProgressEngine* pe, const CacheOptions& o,
                           std::unique_ptr<CacheEngine>* out) {
  if (pe == nullptr || out == nullptr || o.memory_bytes == 0 || o.max_chunk_bytes == 0 ||
      o.max_chunk_bytes > o.memory_bytes || o.max_chunks == 0 || o.max_requests == 0 ||
      (!o.disk_dir.empty() && o.disk_bytes < o.max_chunk_bytes))
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
  page_bytes_ =
      opts_.compress
          ? std::max<uint64_t>(
                opts_.max_chunk_bytes,
                kv_encode_bound(KvCodecParams{KvCodec::kLossless, KvDtype::kBf16, {1, 1, 0}, 0},
                                opts_.max_chunk_bytes))
          : opts_.max_chunk_bytes;
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
  free_entries_.reserve(opts_.max_chunks);
  for (uint32_t i = opts_.max_chunks; i-- > 0;) free_entries_.push_back(static_cast<int32_t>(i));
  uint64_t tsize = 1;
  while (tsize < 2ull * opts_.max_chunks) tsize <<= 1;
  table_.assign(tsize, kEmpty);
  table_mask_ = tsize - 1;
  requests_.resize(opts_.max_requests);
  for (uint32_t i = 0; i < opts_.max_requests; ++i) {
    requests_[i].index = i;
    free_requests_.push_back(&requests_[opts_.max_requests - 1 - i]);
  }
  waiting_.reserve(opts_.max_requests);
  retrying_.reserve(opts_.max_requests);
  if (opts_.policy == CacheOptions::Policy::kS3Fifo) {
    // As many ghosts as the tier holds chunks of the largest size (at least 1024).
    const size_t ghosts = std::max<uint64_t>(mem_alloc_.capacity() / page_bytes_, 1024);
    policy_ =
        make_s3fifo_policy(static_cast<uint32_t>(entries_.size()), mem_alloc_.capacity(), ghosts);
  } else {
    policy_ = make_lru_policy(static_cast<uint32_t>(entries_.size()));
  }
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

// ---------------------------------------------------------------- index

int32_t CacheEngine::find(const ChunkKey& k) const {
  // Bounded by the table size; rebuilds keep empty slots, so a miss ends early.
  uint64_t i = k.hash() & table_mask_;
  for (uint64_t n = 0; n <= table_mask_; ++n, i = (i + 1) & table_mask_) {
    const int32_t e = table_[i];
    if (e == kEmpty) return -1;
    if (e >= 0 && entries_[static_cast<size_t>(e)].key == k) return e;
  }
  return -1;
}

int32_t CacheEngine::insert(const ChunkKey& k) {
  if (free_entries_.empty()) return -1;
  uint64_t i = k.hash() & table_mask_;
  while (table_[i] >= 0) i = (i + 1) & table_mask_;
  if (table_[i] == kTomb) --tombstones_;
  const int32_t e = free_entries_.back();
  free_entries_.pop_back();
  table_[i] = e;
  Entry& en = entries_[static_cast<size_t>(e)];
  en = Entry{};
  en.key = k;
  en.used = true;
  ++st_.chunks;
  return e;
}

void CacheEngine::erase(int32_t e) {
  if (!entries_[static_cast<size_t>(e)].used) {  // a second erase would corrupt the free list
    LOG_ERR("cache: entry %d erased twice (a bug); ignored", e);
    return;
  }
  const ChunkKey& k = entries_[static_cast<size_t>(e)].key;
  uint64_t i = k.hash() & table_mask_;
  for (uint64_t n = 0; n <= table_mask_; ++n, i = (i + 1) & table_mask_) {
    if (table_[i] == e) {
      table_[i] = kTomb;
      ++tombstones_;
      break;
    }
  }
  entries_[static_cast<size_t>(e)].used = false;
  free_entries_.push_back(e);
  --st_.chunks;
  // Tombstones lengthen every probe and, left alone, would fill the table: when
  // they reach a quarter of it, rebuild in place from the live entries.
  if (tombstones_ * 4 > table_.size()) {
    std::fill(table_.begin(), table_.end(), kEmpty);
    tombstones_ = 0;
    for (size_t x = 0; x < entries_.size(); ++x) {
      if (!entries_[x].used) continue;
      uint64_t j = entries_[x].key.hash() & table_mask_;
      while (table_[j] >= 0) j = (j + 1) & table_mask_;
      table_[j] = static_cast<int32_t>(x);
    }
  }
}

void CacheEngine::touch(int32_t e) {
  Entry& en = entries_[static_cast<size_t>(e)];
  if (!en.mem_ready) {
    if (en.on_disk && !en.in_mem) {  // used again while only on disk
      d_unlink(e);
      d_push(e, true);
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
  for (int32_t v = disk_q_.tail; v >= 0; v = entries_[static_cast<size_t>(v)].dprev) {
    const Entry& en = entries_[static_cast<size_t>(v)];
    if (!en.in_mem && !en.loading && !en.pinned(now)) return v;
  }
  return pick_victim();
}

bool CacheEngine::evictable(int32_t e) const {
  const Entry& en = entries_[static_cast<size_t>(e)];
  return en.in_mem && en.mem_ready && !en.pinned(monotonic_ns()) && en.readers == 0 &&
         !en.spilling && !en.loading;
}

void CacheEngine::drop_memory(int32_t e) {
  Entry& en = entries_[static_cast<size_t>(e)];
  if (en.in_mem) {
    if (en.on_disk && en.mem_ready) mem_clean_bytes_ -= en.stored;
    mem_alloc_.free(en.mem_off);
    policy_->remove(e);
    en.in_mem = en.mem_ready = false;
  }
  if (!en.on_disk) {
    erase(e);
    return;
  }
  // Now only on disk, and more recent than every other disk-only chunk.
  d_unlink(e);
  d_push(e, true);
}

void CacheEngine::drop_entry(int32_t e) {
  Entry& en = entries_[static_cast<size_t>(e)];
  drop_disk_copy(e);
  if (en.in_mem) {
    drop_memory(e);
  } else {
    erase(e);
  }
}

void CacheEngine::drop_disk_copy(int32_t e) {
  Entry& en = entries_[static_cast<size_t>(e)];
  if (!en.on_disk) return;
  if (en.in_mem && en.mem_ready) mem_clean_bytes_ -= en.stored;
  d_unlink(e);
  disk_->allocator().free(en.disk_off);
  (void)disk_->log_del(en.key);  // a lost tombstone only costs a checksum miss after restart
  en.on_disk = false;
}

// ---------------------------------------------------------------- disk queue
//
// Every chunk with a disk copy, most valuable first: disk-only chunks in recency
// order (a chunk joins at the front when its memory copy leaves), and copies of
// chunks that are also in memory after them, reloaded ones at the very end. The
// tier makes room from the back, so a redundant copy goes before any chunk that
// lives only on disk, and the hierarchy holds as many distinct chunks as it can.

void CacheEngine::d_push(int32_t e, bool front) {
  Entry& en = entries_[static_cast<size_t>(e)];
  if (front) {
    en.dprev = -1;
    en.dnext = disk_q_.head;
    if (disk_q_.head >= 0) entries_[static_cast<size_t>(disk_q_.head)].dprev = e;
    disk_q_.head = e;
    if (disk_q_.tail < 0) disk_q_.tail = e;
  } else {
    en.dnext = -1;
    en.dprev = disk_q_.tail;
    if (disk_q_.tail >= 0) entries_[static_cast<size_t>(disk_q_.tail)].dnext = e;
    disk_q_.tail = e;
    if (disk_q_.head < 0) disk_q_.head = e;
  }
  disk_q_.bytes += en.stored;
}

void CacheEngine::d_unlink(int32_t e) {
  Entry& en = entries_[static_cast<size_t>(e)];
  if (en.dprev >= 0)
    entries_[static_cast<size_t>(en.dprev)].dnext = en.dnext;
  else if (disk_q_.head == e)
    disk_q_.head = en.dnext;
  else
    return;  // not linked
  if (en.dnext >= 0)
    entries_[static_cast<size_t>(en.dnext)].dprev = en.dprev;
  else
    disk_q_.tail = en.dprev;
  en.dprev = en.dnext = -1;
  disk_q_.bytes -= en.stored;
}

// Frees disk space for `size` bytes by dropping copies from the back of the disk
// queue: a copy whose chunk is also in memory loses only that copy; a disk-only
// chunk leaves the cache. Chunks being read from disk, and pinned disk-only chunks,
// stay. False if nothing more can go.
bool CacheEngine::make_disk_room(uint64_t size, uint64_t* off) {
  const uint64_t now = monotonic_ns();
  int32_t v = disk_q_.tail;
  while (!disk_->allocator().alloc(size, off)) {
    while (v >= 0) {
      const Entry& en = entries_[static_cast<size_t>(v)];
      if (!en.loading && !(en.pinned(now) && !en.mem_ready)) break;
      v = en.dprev;
    }
    if (v < 0) return false;
    const int32_t victim = v;
    v = entries_[static_cast<size_t>(v)].dprev;
    if (entries_[static_cast<size_t>(victim)].mem_ready) {
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
    Entry& en = entries_[static_cast<size_t>(v)];
    if (en.on_disk || en.spilling || !en.mem_ready || en.hits < opts_.disk_admit_hits) continue;
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
    Entry& en = entries_[static_cast<size_t>(v)];
    if (disk_ && !en.on_disk && en.hits >= opts_.disk_admit_hits) {
      if (disk_ios_ >= kMaxSpills) return false;
      const SpillStart r = start_spill(v);
      if (r == SpillStart::kStarted) {
        en.evict_when_clean = true;
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
  r->state = Request::State::kWaitRoom;
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

// ---------------------------------------------------------------- requests

CacheEngine::Request* CacheEngine::new_request() {
  if (free_requests_.empty()) return nullptr;
  Request* r = free_requests_.back();
  free_requests_.pop_back();
  r->state = Request::State::kFree;
  r->entry = -1;
  r->user = r->arena_buf = r->arena_buf2 = nullptr;
  r->big_off = UINT64_MAX;
  r->cb = nullptr;
  r->arg = nullptr;
  r->status = Code::kSuccess;
  return r;
}

void CacheEngine::finish(Request* r, Status st) {
  for (Buf** b : {&r->arena_buf, &r->arena_buf2}) {
    if (*b != nullptr) {
      (void)(*b)->dec_refcount();
      *b = nullptr;
    }
  }
  if (r->big_off != UINT64_MAX) {  // an encode slot that was not needed in the end
    mem_alloc_.free(r->big_off);
    r->big_off = UINT64_MAX;
  }
  if (r->user != nullptr) {  // the reference taken when the request was accepted
    (void)r->user->dec_refcount();
    r->user = nullptr;
  }
  r->status = st;
  r->state = Request::State::kDone;
  DoneCb cb = r->cb;
  void* arg = r->arg;
  free_requests_.push_back(r);
  if (cb != nullptr) cb(arg, st);
}

Status CacheEngine::start_dma(Request* r, Buf* src, Buf* dst) {
  DmaMemcpyTask* t = nullptr;
  UserData ud;
  ud.u64 = r->index;
  DPUKV_RETURN_IF_ERROR(dma_->memcpy_alloc_init(src, dst, ud, &t));
  t->set_checksum(true);
  Status st = dma_->submit(t);
  if (!st.ok()) {
    (void)dma_->free(t);
    return st;
  }
  ++engine_ops_;
  r->state = Request::State::kDma;
  return Code::kSuccess;
}

void CacheEngine::dma_done(DmaMemcpyTask* t, UserData task_ud, UserData ctx_ud) {
  auto* self = static_cast<CacheEngine*>(ctx_ud.ptr);
  Request* r = &self->requests_[task_ud.u64];
  const Status st = t->status();
  const uint64_t cs = t->checksum();
  (void)self->dma_->free(t);
  --self->engine_ops_;
  self->after_dma(r, st, cs);
}

// Takes a request for an operation; the engine holds a reference on the user's
// buffer (if any) until the request finishes.
Status CacheEngine::accept(int kind, const ChunkKey& key, Buf* user, DoneCb cb, void* arg,
                           Request** out) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (user != nullptr && !user->inc_refcount().ok()) return Code::kInvalidValue;
  Request* r = new_request();
  if (r == nullptr) {
    if (user != nullptr) (void)user->dec_refcount();
    return Code::kAgain;
  }
  r->kind = static_cast<Request::Kind>(kind);
  r->key = key;
  r->user = user;
  r->cb = cb;
  r->arg = arg;
  *out = r;
  return Code::kSuccess;
}

Status CacheEngine::store(const ChunkKey& key, Buf* src, DoneCb cb, void* arg) {
  if (src == nullptr || src->data_len() == 0) return Code::kInvalidValue;
  if (src->data_len() > opts_.max_chunk_bytes) return Code::kTooBig;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(static_cast<int>(Request::Kind::kStore), key, src, cb, arg, &r));
  const int32_t existing = find(key);
  if (existing >= 0) {  // chunks are immutable: an existing key is a success, and fresh again
    touch(existing);
    finish(r, Code::kSuccess);
    return Code::kSuccess;
  }
  int32_t e = insert(key);
  // A full index is a capacity like any other: evict (from every tier) to make room.
  while (e < 0) {
    const int32_t v = disk_ ? pick_index_victim() : pick_victim();
    if (v < 0) {
      ++st_.store_rejects;
      finish(r, Code::kNoMemory);
      return Code::kSuccess;
    }
    ++st_.evictions;
    drop_entry(v);
    e = insert(key);
  }
  r->entry = e;
  Entry& en = entries_[static_cast<size_t>(e)];
  en.size = src->data_len();
  en.loading = true;  // not evictable, not yet present
  // Encoded chunks first take a slot of the codec's worst case, then move to one
  // of their own size.
  const uint64_t bound =
      codec_ ? kv_encode_bound(KvCodecParams{KvCodec::kLossless, KvDtype::kBf16, {1, 1, 0}, 0},
                               en.size)
             : 0;
  en.encoded = codec_ != nullptr && bound <= page_bytes_;
  en.stored = en.encoded ? bound : en.size;
  begin_store(r);
  return Code::kSuccess;
}

void CacheEngine::begin_store(Request* r) {
  Entry& en = entries_[static_cast<size_t>(r->entry)];
  uint64_t off;
  if (!make_room(en.stored, &off)) {
    if (room_may_come()) {
      wait_for_room(r, en.stored);
      return;
    }
    erase(r->entry);
    ++st_.store_rejects;
    finish(r, Code::kNoMemory);
    return;
  }
  en.mem_off = off;
  en.in_mem = true;
  Status st = inv_->get_by_addr(arena_map_.get(), static_cast<uint8_t*>(arena_->data()) + off,
                                en.stored, &r->arena_buf);
  if (st.ok())
    st = en.encoded ? start_codec(r, CompressTask::Op::kCompress, r->user, r->arena_buf)
                    : start_dma(r, r->user, r->arena_buf);
  if (!st.ok()) {
    mem_alloc_.free(off);
    en.in_mem = false;
    erase(r->entry);
    finish(r, st);
  }
}

Status CacheEngine::start_codec(Request* r, CompressTask::Op op, Buf* src, Buf* dst) {
  CompressTask* t = nullptr;
  UserData ud;
  ud.u64 = r->index;
  CodecParams p;
  p.dtype = KvDtype::kBf16;
  DPUKV_RETURN_IF_ERROR(
      codec_->task_alloc_init(op, CompressAlgo::kKvLossless, p, src, dst, ud, &t));
  Status st = codec_->submit(t);
  if (!st.ok()) {
    (void)codec_->free(t);
    return st;
  }
  ++engine_ops_;
  r->state = op == CompressTask::Op::kCompress ? Request::State::kEncode : Request::State::kDecode;
  return Code::kSuccess;
}

void CacheEngine::codec_done(CompressTask* t, UserData task_ud, UserData ctx_ud) {
  auto* self = static_cast<CacheEngine*>(ctx_ud.ptr);
  Request* r = &self->requests_[task_ud.u64];
  const Status st = t->status();
  const uint64_t out = t->result().out_len;
  (void)self->codec_->free(t);
  --self->engine_ops_;
  self->after_codec(r, st, out);
  self->retry_waiting();
}

void CacheEngine::after_codec(Request* r, Status st, uint64_t out_len) {
  const int32_t e = r->entry;
  Entry& en = entries_[static_cast<size_t>(e)];
  if (r->state == Request::State::kDecode) {
    // The decoder checks the original's xxh3-64 and answers CORRUPTED on a mismatch.
    finish_read(r, st, st == Code::kCorrupted);
    return;
  }
  // Encoded on store.
  if (!st.ok() || state() == CtxState::kStopping) {
    en.loading = false;
    drop_memory(e);
    finish(r, st.ok() ? Status(Code::kShutdown) : st);
    return;
  }
  st_.encoded_bytes_in += en.size;
  st_.encoded_bytes_out += out_len;
  const uint64_t big = en.mem_off;
  uint64_t small;
  if (mem_alloc_.class_size(out_len) < mem_alloc_.class_size(en.stored) &&
      mem_alloc_.alloc(out_len, &small)) {
    // Move to a slot of the encoded size; the DMA computes the checksum on the way.
    Status ds = inv_->get_by_addr(arena_map_.get(), static_cast<uint8_t*>(arena_->data()) + small,
                                  out_len, &r->arena_buf2);
    if (ds.ok()) ds = start_dma(r, r->arena_buf, r->arena_buf2);
    if (ds.ok()) {
      r->big_off = big;
      en.mem_off = small;
      en.stored = out_len;
      r->state = Request::State::kShrink;
      return;
    }
    if (r->arena_buf2) (void)r->arena_buf2->dec_refcount(), r->arena_buf2 = nullptr;
    mem_alloc_.free(small);
  }
  // Keep the encode slot.
  en.stored = out_len;
  complete_store(r, XXH3_64bits(static_cast<uint8_t*>(arena_->data()) + big, out_len));
}

void CacheEngine::complete_store(Request* r, uint64_t cs) {
  const int32_t e = r->entry;
  Entry& en = entries_[static_cast<size_t>(e)];
  en.loading = false;
  en.checksum = cs;
  en.mem_ready = true;
  policy_->insert(e, en.key.hash(), en.stored);
  ++st_.stores;
  st_.store_bytes += en.size;
  finish(r, Code::kSuccess);  // also frees a finished shrink's encode slot
  if (opts_.write_through && entries_[static_cast<size_t>(e)].hits >= opts_.disk_admit_hits)
    start_spill(e);
  clean_ahead();
}

Status CacheEngine::retrieve(const ChunkKey& key, Buf* dst, DoneCb cb, void* arg) {
  if (dst == nullptr) return Code::kInvalidValue;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(static_cast<int>(Request::Kind::kRetrieve), key, dst, cb, arg, &r));
  const int32_t e = find(key);
  if (e < 0 ||
      !(entries_[static_cast<size_t>(e)].mem_ready || entries_[static_cast<size_t>(e)].on_disk)) {
    ++st_.misses;
    finish(r, Code::kNotFound);
    return Code::kSuccess;
  }
  Entry& en = entries_[static_cast<size_t>(e)];
  if (dst->tail_room() < en.size) {
    finish(r, Code::kTooBig);
    return Code::kSuccess;
  }
  r->entry = e;
  ++en.hits;
  if (en.mem_ready) {
    begin_read(r);
    return Code::kSuccess;
  }
  Status st = start_reload(r);
  if (!st.ok()) finish(r, st);
  return Code::kSuccess;
}

// Memory copy → the client's buffer: a DMA (checksummed) or, for an encoded chunk,
// a decode on the compress engine (which checks the original's checksum).
void CacheEngine::begin_read(Request* r) {
  Entry& en = entries_[static_cast<size_t>(r->entry)];
  ++en.readers;
  Status st =
      inv_->get_by_data(arena_map_.get(), static_cast<uint8_t*>(arena_->data()) + en.mem_off,
                        en.stored, &r->arena_buf);
  if (st.ok())
    st = en.encoded ? start_codec(r, CompressTask::Op::kDecompress, r->arena_buf, r->user)
                    : start_dma(r, r->arena_buf, r->user);
  if (!st.ok()) {
    --en.readers;
    finish(r, st);
  }
}

Status CacheEngine::prefetch(const ChunkKey& key, DoneCb cb, void* arg) {
  Request* r;
  DPUKV_RETURN_IF_ERROR(
      accept(static_cast<int>(Request::Kind::kPrefetch), key, nullptr, cb, arg, &r));
  const int32_t e = find(key);
  if (e < 0 ||
      !(entries_[static_cast<size_t>(e)].mem_ready || entries_[static_cast<size_t>(e)].on_disk)) {
    finish(r, Code::kNotFound);
    return Code::kSuccess;
  }
  if (entries_[static_cast<size_t>(e)].mem_ready) {
    finish(r, Code::kSuccess);
    return Code::kSuccess;
  }
  r->entry = e;
  Status st = start_reload(r);
  if (!st.ok()) finish(r, st);
  return Code::kSuccess;
}

Status CacheEngine::start_reload(Request* r) {
  Entry& en = entries_[static_cast<size_t>(r->entry)];
  if (en.loading || en.spilling) {  // another request is moving it; try again later
    wait_for_room(r, 0);
    return Code::kSuccess;
  }
  uint64_t off;
  if (!make_room(en.stored, &off)) {
    if (room_may_come()) {
      wait_for_room(r, en.stored);
      return Code::kSuccess;
    }
    return Code::kNoMemory;
  }
  en.mem_off = off;
  en.in_mem = true;
  en.loading = true;
  Status st =
      disk_->read(en.disk_off, static_cast<uint8_t*>(arena_->data()) + off, en.stored, r->index);
  if (!st.ok()) {
    mem_alloc_.free(off);
    en.in_mem = en.loading = false;
    return st;
  }
  ++disk_ios_;
  r->state = Request::State::kDiskRead;
  return Code::kSuccess;
}

CacheEngine::SpillStart CacheEngine::start_spill(int32_t e) {
  Entry& en = entries_[static_cast<size_t>(e)];
  if (!disk_ || en.on_disk || en.spilling || !en.mem_ready || !spilling_allowed())
    return SpillStart::kRefused;
  Request* r = new_request();
  if (r == nullptr) return SpillStart::kBusy;
  uint64_t off;
  if (!make_disk_room(en.stored, &off)) {  // the tier holds only pinned or busy chunks
    free_requests_.push_back(r);
    return SpillStart::kRefused;
  }
  r->kind = Request::Kind::kSpill;
  r->entry = e;
  r->key = en.key;
  r->disk_off = off;
  Status st =
      disk_->write(off, static_cast<uint8_t*>(arena_->data()) + en.mem_off, en.stored, r->index);
  if (!st.ok()) {
    disk_->allocator().free(off);
    free_requests_.push_back(r);
    if (st == Code::kAgain) return SpillStart::kBusy;
    disk_failed("write could not be submitted", EIO);
    return SpillStart::kRefused;
  }
  en.spilling = true;
  ++en.readers;
  ++disk_ios_;
  spill_bytes_ += en.stored;
  r->state = Request::State::kDiskWrite;
  return SpillStart::kStarted;
}

void CacheEngine::after_dma(Request* r, Status st, uint64_t cs) {
  after_dma_step(r, st, cs);
  // A finished copy may have made a chunk evictable: requests waiting for room retry.
  retry_waiting();
}

void CacheEngine::after_dma_step(Request* r, Status st, uint64_t cs) {
  Entry& en = entries_[static_cast<size_t>(r->entry)];
  if (r->kind == Request::Kind::kStore) {
    if (!st.ok() || state() == CtxState::kStopping) {
      en.loading = false;
      drop_memory(r->entry);
      finish(r, st.ok() ? Status(Code::kShutdown) : st);
      return;
    }
    complete_store(r, cs);
    return;
  }
  // Retrieve: the bytes the DMA read must be the bytes that were stored.
  finish_read(r, st, st.ok() && cs != en.checksum);
}

// The end of a retrieve's copy (DMA or decode) into the client's buffer. A chunk
// whose bytes failed their check is dropped and reported as a miss.
void CacheEngine::finish_read(Request* r, Status st, bool corrupted) {
  const int32_t e = r->entry;
  Entry& en = entries_[static_cast<size_t>(e)];
  --en.readers;
  if (corrupted) {
    ++st_.checksum_failures;
    LOG_WARN(
        "cache: chunk %016llx:%016llx (%llu bytes, %s at offset %llu) failed its checksum "
        "on read; dropped, reported as a miss",
        static_cast<unsigned long long>(en.key.model),
        static_cast<unsigned long long>(en.key.prefix_hash),
        static_cast<unsigned long long>(en.stored), en.on_disk ? "disk copy" : "memory",
        static_cast<unsigned long long>(en.on_disk ? en.disk_off : en.mem_off));
    if (en.readers == 0 && !en.spilling && !en.loading) drop_entry(e);
    ++st_.misses;
    finish(r, Code::kNotFound);
    return;
  }
  if (!st.ok()) {
    finish(r, st);
    return;
  }
  ++st_.hits;
  ++st_.retrieves;
  st_.retrieve_bytes += en.size;
  touch(e);
  finish(r, Code::kSuccess);
}

void CacheEngine::after_io(Request* r, Status st) {
  --disk_ios_;
  const int32_t e = r->entry;
  Entry& en = entries_[static_cast<size_t>(e)];
  if (r->kind == Request::Kind::kSpill) {
    en.spilling = false;
    --en.readers;
    spill_bytes_ -= en.stored;
    const bool wrote = st.ok();
    if (!wrote) disk_failed("write failed", last_io_errno_ ? last_io_errno_ : EIO);
    if (wrote && disk_->log_put(en.key, r->disk_off, en.stored, en.checksum, en.size, en.encoded)) {
      en.on_disk = true;
      en.disk_off = r->disk_off;
      mem_clean_bytes_ += en.stored;
      d_push(e, true);
      ++st_.spills;
    } else {
      if (wrote) disk_failed("index log cannot grow", disk_->last_log_errno());
      disk_->allocator().free(r->disk_off);
    }
    r->state = Request::State::kDone;
    free_requests_.push_back(r);
    if (en.evict_when_clean) {
      en.evict_when_clean = false;
      evict_pending_bytes_ -= en.stored;
      // Without a disk copy (the write failed) the chunk stays: memory is not
      // drained by a disk that cannot take data.
      if (en.on_disk && evictable(e)) {
        ++st_.evictions;
        drop_memory(e);
      }
    }
    retry_waiting();
    return;
  }
  // Reload finished.
  en.loading = false;
  if (!st.ok()) {
    ++st_.io_errors;
    LOG_ERR("cache: disk tier read of %llu bytes at offset %llu failed: %s",
            static_cast<unsigned long long>(en.stored),
            static_cast<unsigned long long>(en.disk_off),
            std::strerror(last_io_errno_ ? last_io_errno_ : EIO));
    mem_alloc_.free(en.mem_off);
    en.in_mem = false;
    finish(r, Code::kIoFailed);
    retry_waiting();
    return;
  }
  en.mem_ready = true;
  policy_->insert(e, en.key.hash(), en.stored);
  // The disk copy is now redundant: first to go when the disk tier needs room.
  mem_clean_bytes_ += en.stored;
  d_unlink(e);
  d_push(e, false);
  ++st_.reloads;
  retry_waiting();
  if (r->kind == Request::Kind::kPrefetch) {
    // No DMA follows to check the bytes: hash them here.
    if (XXH3_64bits(static_cast<uint8_t*>(arena_->data()) + en.mem_off, en.stored) != en.checksum) {
      ++st_.checksum_failures;
      LOG_WARN(
          "cache: chunk %016llx:%016llx read back from disk offset %llu failed its checksum; "
          "dropped",
          static_cast<unsigned long long>(en.key.model),
          static_cast<unsigned long long>(en.key.prefix_hash),
          static_cast<unsigned long long>(en.disk_off));
      drop_entry(e);
      finish(r, Code::kNotFound);
    } else {
      finish(r, Code::kSuccess);
    }
    return;
  }
  begin_read(r);
}

void CacheEngine::retry_waiting() {
  if (waiting_.empty()) return;
  // The two lists trade places (no allocation): requests that still cannot go
  // are queued again on the now empty waiting_.
  retrying_.swap(waiting_);
  room_wanted_bytes_ = 0;
  for (Request* r : retrying_) {
    if (r->kind == Request::Kind::kStore) {
      begin_store(r);  // its entry is held (loading) while it waits
      continue;
    }
    // A waiting read holds nothing: its chunk may have moved, or left the cache
    // and had its entry reused, meanwhile. Look it up again.
    const int32_t e = find(r->key);
    if (e < 0 ||
        !(entries_[static_cast<size_t>(e)].mem_ready || entries_[static_cast<size_t>(e)].on_disk)) {
      if (r->kind == Request::Kind::kRetrieve) ++st_.misses;
      finish(r, Code::kNotFound);
      continue;
    }
    r->entry = e;
    if (entries_[static_cast<size_t>(e)].mem_ready) {
      if (r->kind == Request::Kind::kRetrieve)
        begin_read(r);
      else
        finish(r, Code::kSuccess);
      continue;
    }
    Status st = start_reload(r);
    if (!st.ok()) finish(r, st);
  }
  retrying_.clear();
}

size_t CacheEngine::poll() {
  if (!disk_) return 0;
  DiskTier::Completion c[32];
  size_t n = disk_->poll(c, 32);
  for (size_t i = 0; i < n; ++i) {
    last_io_errno_ = c[i].err;
    after_io(&requests_[c[i].tag], c[i].status);
  }
  return n;
}

bool CacheEngine::arm_notification() {
  return false;
}  // the ring's eventfd is watched

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
  return s;
}

uint64_t CacheEngine::index_bytes_per_chunk() const {
  return sizeof(Entry) + sizeof(int32_t) * table_.size() / entries_.size() + sizeof(int32_t) +
         policy_->bytes_per_chunk();
}

Status CacheEngine::sync() {
  return disk_ ? disk_->sync() : Status();
}

}  // namespace dpukv
