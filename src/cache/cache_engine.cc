#include "cache/cache_engine.h"

#include <sys/epoll.h>

#include <algorithm>
#include <iterator>

#include "cache/eviction_policies.h"

namespace dpukv {

CacheEngine::CacheEngine(ProgressEngine* pe, const CacheOptions& o)
    : Context(pe), opts_(o), placement_(o, &st_), pipeline_(this, o, &placement_, &st_) {
  placement_.set_room_listener(&CacheEngine::room_freed, this);
}

uint64_t CacheEngine::slot_bytes(const CacheOptions& o) {
  return Placement::slot_bytes(o);
}

Status CacheEngine::create(ProgressEngine* pe, const CacheOptions& o,
                           std::unique_ptr<CacheEngine>* out) {
  if (pe == nullptr || out == nullptr || o.memory_bytes == 0 || o.max_chunk_bytes == 0 ||
      slot_bytes(o) > o.memory_bytes || o.max_chunks == 0 || o.max_requests == 0 ||
      (!o.disk_dir.empty() && o.disk_bytes < o.max_chunk_bytes) ||
      find_eviction_policy(o.policy) == nullptr)
    return Code::kInvalidValue;
  std::unique_ptr<CacheEngine> c(new CacheEngine(pe, o));
  DPUKV_RETURN_IF_ERROR(c->placement_.init());
  DPUKV_RETURN_IF_ERROR(c->pipeline_.init(pe));
  *out = std::move(c);
  return Code::kSuccess;
}

CacheEngine::~CacheEngine() {
  if (disk_watched_) pe()->unwatch_fd(placement_.disk_event_fd(), &disk_watch_);
}

Status CacheEngine::do_start() {
  DPUKV_RETURN_IF_ERROR(pipeline_.start());
  if (placement_.disk() != nullptr) {
    DPUKV_RETURN_IF_ERROR(pe()->watch_fd(placement_.disk_event_fd(), EPOLLIN, &disk_watch_));
    disk_watched_ = true;
  }
  return Code::kSuccess;
}

void CacheEngine::do_stop() {
  pipeline_.stop();
}

bool CacheEngine::drained() {
  if (!pipeline_.idle()) return false;
  if (placement_.disk() == nullptr) return true;
  if (placement_.disk_inflight() != 0) return false;
  if (disk_watched_) {
    pe()->unwatch_fd(placement_.disk_event_fd(), &disk_watch_);
    disk_watched_ = false;
  }
  (void)placement_.sync_disk();
  return true;
}

// One io_uring ring carries the write-backs (placement's) and the reloads (the
// pipeline's); the tag says whose.
size_t CacheEngine::poll() {
  DiskTier::Completion c[32];
  const size_t n = placement_.poll_disk(c, 32);
  for (size_t i = 0; i < n; ++i) {
    if ((c[i].tag & Placement::kSpillTag) != 0)
      placement_.spill_done(c[i].tag, c[i].status, c[i].err);
    else
      pipeline_.reload_done(c[i].tag, c[i].status, c[i].err);
  }
  return n;
}

bool CacheEngine::arm_notification() {
  return false;  // the ring's eventfd is watched
}

void CacheEngine::room_freed(void* self) {
  static_cast<CacheEngine*>(self)->pipeline_.retry_waiting();
}

// ---------------------------------------------------------------- requests

Status CacheEngine::store(const ChunkKey& key, Buf* src, DoneCb cb, void* arg) {
  return pipeline_.store(key, src, cb, arg);
}

Status CacheEngine::store_device(const ChunkKey& key, const DeviceRange& src, DoneCb cb,
                                 void* arg) {
  return pipeline_.store_device(key, src, cb, arg);
}

Status CacheEngine::retrieve(const ChunkKey& key, Buf* dst, DoneCb cb, void* arg) {
  return pipeline_.retrieve(key, dst, cb, arg);
}

Status CacheEngine::retrieve_device(const ChunkKey& key, const DeviceRange& dst, DoneCb cb,
                                    void* arg) {
  return pipeline_.retrieve_device(key, dst, cb, arg);
}

Status CacheEngine::prefetch(const ChunkKey& key, DoneCb cb, void* arg) {
  return pipeline_.prefetch(key, cb, arg);
}

// ---------------------------------------------------------------- queries

uint32_t CacheEngine::lookup(const ChunkKey* keys, uint32_t n, bool pin) {
  return placement_.lookup(keys, n, pin);
}

void CacheEngine::unpin(const ChunkKey* keys, uint32_t n) {
  placement_.unpin(keys, n);
}

bool CacheEngine::contains(const ChunkKey& key) const {
  return placement_.contains(key);
}

uint64_t CacheEngine::chunk_size(const ChunkKey& key) const {
  return placement_.chunk_size(key);
}

Status CacheEngine::remove(const ChunkKey& key) {
  return placement_.remove(key);
}

uint64_t CacheEngine::clear(uint64_t model, uint32_t tenant) {
  return placement_.clear(model, tenant);
}

CacheStats CacheEngine::stats() const {
  CacheStats s = st_;
  s.memory_used = placement_.memory().used_bytes();
  const ChunkTable::Counts c = placement_.table().counts();
  s.chunks = c.chunks;
  s.memory_chunks = c.memory;
  s.disk_chunks = c.disk;
  s.both_chunks = c.both;
  if (const DiskTier* d = placement_.disk()) {
    s.disk_used = d->allocator().used_bytes();
    s.disk_log_errors = d->log_errors();
    s.disk_ios_in_flight = placement_.spills_in_flight() + pipeline_.disk_reads();
    s.writes_waiting = placement_.writes_waiting();
  }
  // In the order of kRequestStateNames. Disk writes are placement's write-backs, not
  // requests of the pipeline.
  const uint64_t in_state[] = {
      pipeline_.in_state(RequestState::kWaitRoom), pipeline_.in_state(RequestState::kDma),
      pipeline_.in_state(RequestState::kDiskRead), placement_.spills_in_flight(),
      pipeline_.in_state(RequestState::kEncode),   pipeline_.in_state(RequestState::kShrink),
      pipeline_.in_state(RequestState::kDecode)};
  static_assert(sizeof(in_state) / sizeof(in_state[0]) == kRequestStates);
  std::copy(std::begin(in_state), std::end(in_state), s.requests_in_state);
  return s;
}

uint64_t CacheEngine::index_bytes_per_chunk() const {
  return placement_.index_bytes_per_chunk();
}

Status CacheEngine::sync() {
  return placement_.sync_disk();
}

// ---------------------------------------------------------------- sharing

void CacheEngine::arena(void** base, uint64_t* len) const {
  placement_.arena(base, len);
}

Status CacheEngine::locate(const ChunkKey& key, ChunkPlacement* out) {
  return placement_.locate(key, out);
}

Status CacheEngine::begin_ingest(const ChunkKey& key, const ChunkPlacement& p, uint8_t** dst) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  return placement_.begin_ingest(key, p, pipeline_.has_codec(), pipeline_.room_wanted(), dst);
}

Status CacheEngine::end_ingest(const ChunkKey& key, bool bytes_ok) {
  return placement_.end_ingest(key, bytes_ok);
}

void CacheEngine::add_residency_listener(ResidencyCb cb, void* arg, bool replay) {
  placement_.add_residency_listener(cb, arg, replay);
}

void CacheEngine::remove_residency_listener(ResidencyCb cb, void* arg) {
  placement_.remove_residency_listener(cb, arg);
}

}  // namespace dpukv
