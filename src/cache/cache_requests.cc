#include "cache/cache_requests.h"

#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "runtime/chunk_checksum.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

// ---------------------------------------------------------------- requests

void CacheEngine::set_state(Request* r, RequestState state) {
  --requests_per_state_[static_cast<size_t>(r->state)];
  ++requests_per_state_[static_cast<size_t>(state)];
  r->state = state;
}

CacheEngine::Request* CacheEngine::new_request() {
  if (free_requests_.empty()) return nullptr;
  Request* r = free_requests_.back();
  free_requests_.pop_back();
  set_state(r, Request::State::kFree);
  r->entry = -1;
  r->user = r->arena_buf = r->arena_buf2 = nullptr;
  r->device = false;
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
  set_state(r, Request::State::kDone);
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
  set_state(r, Request::State::kDma);
  return Code::kSuccess;
}

void CacheEngine::dma_done(DmaMemcpyTask* t, UserData task_ud, UserData ctx_ud) {
  auto* self = static_cast<CacheEngine*>(ctx_ud.ptr);
  Request* r = &self->requests_[task_ud.u64];
  r->result = t->status();
  r->result_value = t->checksum();
  (void)self->dma_->free(t);
  --self->engine_ops_;
  self->advance(r);
  // A finished copy may have made a chunk evictable: requests waiting for room retry.
  self->retry_waiting();
}

// Takes a request for an operation; the engine holds a reference on the user's
// buffer (if any) until the request finishes.
Status CacheEngine::accept(RequestKind kind, const ChunkKey& key, Buf* user, DoneCb cb, void* arg,
                           Request** out) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (user != nullptr && !user->inc_refcount().ok()) return Code::kInvalidValue;
  Request* r = new_request();
  if (r == nullptr) {
    if (user != nullptr) (void)user->dec_refcount();
    return Code::kAgain;
  }
  r->kind = kind;
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
  DPUKV_RETURN_IF_ERROR(accept(Request::Kind::kStore, key, src, cb, arg, &r));
  return begin_store_request(r, src->data_len());
}

Status CacheEngine::store_device(const ChunkKey& key, const DeviceRange& src, DoneCb cb,
                                 void* arg) {
  if (device_ == nullptr) return Code::kNotSupported;
  if (src.bytes == 0) return Code::kInvalidValue;
  if (src.bytes > opts_.max_chunk_bytes) return Code::kTooBig;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(Request::Kind::kStore, key, nullptr, cb, arg, &r));
  r->device = true;
  r->dev = src;
  return begin_store_request(r, src.bytes);
}

// A store the engine accepted: its entry, then room and the copy (begin_store).
Status CacheEngine::begin_store_request(Request* r, uint64_t size) {
  const ChunkKey& key = r->key;
  const uint64_t hash = key.hash();
  const int32_t existing = table_.find(key, hash);
  if (existing >= 0) {  // chunks are immutable: an existing key is a success, and fresh again
    touch(existing);
    finish(r, Code::kSuccess);
    return Code::kSuccess;
  }
  int32_t e = table_.insert(key, hash);
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
    e = table_.insert(key, hash);
  }
  r->entry = e;
  ChunkEntry& en = table_.at(e);
  en.size = size;
  en.memory = ChunkEntry::Memory::kAwaitingRoom;  // not evictable, not yet present
  // Encoded chunks first take a slot of the codec's worst case, then move to one
  // of their own size. Device bytes are not on the host for the codec to read.
  const uint64_t bound =
      codec_ && !r->device
          ? kv_encode_bound(KvCodecParams{KvCodec::kLossless, KvDtype::kBf16, {1, 1, 0}, 0},
                            en.size)
          : 0;
  en.encoded = codec_ != nullptr && !r->device && bound <= page_bytes_;
  en.stored = en.encoded ? bound : en.size;
  begin_store(r);
  return Code::kSuccess;
}

void CacheEngine::begin_store(Request* r) {
  ChunkEntry& en = table_.at(r->entry);
  uint64_t off;
  if (!make_room(en.stored, &off)) {
    if (room_may_come()) {
      wait_for_room(r, en.stored);
      return;
    }
    table_.erase(r->entry);
    ++st_.store_rejects;
    finish(r, Code::kNoMemory);
    return;
  }
  en.mem_off = off;
  en.memory = ChunkEntry::Memory::kFilling;
  Status st;
  if (r->device) {
    st = start_device_copy(r, false);
  } else {
    st = inv_->get_by_addr(arena_map_.get(), static_cast<uint8_t*>(arena_->data()) + off, en.stored,
                           &r->arena_buf);
    if (st.ok())
      st = en.encoded ? start_codec(r, CompressTask::Op::kCompress, r->user, r->arena_buf)
                      : start_dma(r, r->user, r->arena_buf);
  }
  if (!st.ok()) {
    mem_alloc_.free(off);
    en.memory = ChunkEntry::Memory::kNone;
    table_.erase(r->entry);
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
  set_state(r,
            op == CompressTask::Op::kCompress ? Request::State::kEncode : Request::State::kDecode);
  return Code::kSuccess;
}

void CacheEngine::codec_done(CompressTask* t, UserData task_ud, UserData ctx_ud) {
  auto* self = static_cast<CacheEngine*>(ctx_ud.ptr);
  Request* r = &self->requests_[task_ud.u64];
  r->result = t->status();
  r->result_value = t->result().out_len;
  (void)self->codec_->free(t);
  --self->engine_ops_;
  self->advance(r);
  self->retry_waiting();
}

// The chunk's bytes are encoded into its worst-case slot: move them to a slot of
// their own size (state Shrink) or, when none is smaller, keep that one.
void CacheEngine::after_encode(Request* r, Status st, uint64_t out_len) {
  const int32_t e = r->entry;
  ChunkEntry& en = table_.at(e);
  if (!st.ok() || state() == CtxState::kStopping) {
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
      set_state(r, Request::State::kShrink);
      return;
    }
    if (r->arena_buf2) (void)r->arena_buf2->dec_refcount(), r->arena_buf2 = nullptr;
    mem_alloc_.free(small);
  }
  // Keep the encode slot.
  en.stored = out_len;
  complete_store(r, chunk_checksum(static_cast<uint8_t*>(arena_->data()) + big, out_len));
}

void CacheEngine::complete_store(Request* r, uint64_t cs) {
  const int32_t e = r->entry;
  ChunkEntry& en = table_.at(e);
  en.checksum = cs;
  en.memory = ChunkEntry::Memory::kReady;
  policy_->insert(e, en.key_hash, en.stored);
  table_.announce(e);
  ++st_.stores;
  st_.store_bytes += en.size;
  finish(r, Code::kSuccess);  // also frees a finished shrink's encode slot
  if (opts_.write_through && table_.at(e).hits >= opts_.disk_admit_hits) start_spill(e);
  clean_ahead();
}

Status CacheEngine::retrieve(const ChunkKey& key, Buf* dst, DoneCb cb, void* arg) {
  if (dst == nullptr) return Code::kInvalidValue;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(Request::Kind::kRetrieve, key, dst, cb, arg, &r));
  begin_retrieve_request(r, dst->tail_room());
  return Code::kSuccess;
}

Status CacheEngine::retrieve_device(const ChunkKey& key, const DeviceRange& dst, DoneCb cb,
                                    void* arg) {
  if (device_ == nullptr) return Code::kNotSupported;
  if (dst.bytes == 0) return Code::kInvalidValue;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(Request::Kind::kRetrieve, key, nullptr, cb, arg, &r));
  r->device = true;
  r->dev = dst;
  begin_retrieve_request(r, dst.bytes);
  return Code::kSuccess;
}

// A retrieve the engine accepted, with `room` bytes where the chunk goes: a miss,
// a chunk too big, or on to the copy (after a reload for a disk-only chunk).
void CacheEngine::begin_retrieve_request(Request* r, uint64_t room) {
  const int32_t e = table_.find(r->key);
  if (e < 0 || !(table_.at(e).mem_ready() || table_.at(e).on_disk())) {
    ++st_.misses;
    finish(r, Code::kNotFound);
    return;
  }
  ChunkEntry& en = table_.at(e);
  if (r->device && en.encoded) {  // the decoder writes host memory only
    finish(r, Code::kNotSupported);
    return;
  }
  if (room < en.size) {
    finish(r, Code::kTooBig);
    return;
  }
  r->entry = e;
  ++en.hits;
  if (en.mem_ready()) {
    begin_read(r);
    return;
  }
  Status st = start_reload(r);
  if (!st.ok()) finish(r, st);
}

// Arena <-> device memory on the copier. The checksum the cache keeps is of the
// arena's bytes, and the copier takes it as it copies (off this thread, as the DMA
// engine does): a store's once they landed, a retrieve's while the copy runs (the
// chunk cannot change under its reader). Device chunks are never encoded, so the
// bytes copied are the bytes stored.
Status CacheEngine::start_device_copy(Request* r, bool to_device) {
  ChunkEntry& en = table_.at(r->entry);
  if (en.stored != en.size) return Code::kNotSupported;
  uint8_t* host = static_cast<uint8_t*>(arena_->data()) + en.mem_off;
  DPUKV_RETURN_IF_ERROR(device_->copy(r->dev.region, r->dev.offset, host, en.size, to_device,
                                      &r->result_value, &CacheEngine::device_done, r));
  ++engine_ops_;
  set_state(r, Request::State::kDma);
  return Code::kSuccess;
}

void CacheEngine::device_done(void* arg, Status st) {
  auto* r = static_cast<Request*>(arg);
  CacheEngine* self = r->owner;
  r->result = st;
  --self->engine_ops_;
  self->advance(r);
  self->retry_waiting();
}

// Memory copy → the client's buffer: a DMA (checksummed) or, for an encoded chunk,
// a decode on the compress engine (which checks the original's checksum).
void CacheEngine::begin_read(Request* r) {
  ChunkEntry& en = table_.at(r->entry);
  ++en.readers;
  Status st;
  if (r->device) {
    // An encoded chunk is refused before; a reload cannot make one.
    st = en.encoded ? Status(Code::kNotSupported) : start_device_copy(r, true);
  } else {
    st = inv_->get_by_data(arena_map_.get(), static_cast<uint8_t*>(arena_->data()) + en.mem_off,
                           en.stored, &r->arena_buf);
    if (st.ok())
      st = en.encoded ? start_codec(r, CompressTask::Op::kDecompress, r->arena_buf, r->user)
                      : start_dma(r, r->arena_buf, r->user);
  }
  if (!st.ok()) {
    --en.readers;
    finish(r, st);
  }
}

Status CacheEngine::prefetch(const ChunkKey& key, DoneCb cb, void* arg) {
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(Request::Kind::kPrefetch, key, nullptr, cb, arg, &r));
  const int32_t e = table_.find(key);
  if (e < 0 || !(table_.at(e).mem_ready() || table_.at(e).on_disk())) {
    finish(r, Code::kNotFound);
    return Code::kSuccess;
  }
  if (table_.at(e).mem_ready()) {
    finish(r, Code::kSuccess);
    return Code::kSuccess;
  }
  r->entry = e;
  Status st = start_reload(r);
  if (!st.ok()) finish(r, st);
  return Code::kSuccess;
}

Status CacheEngine::start_reload(Request* r) {
  ChunkEntry& en = table_.at(r->entry);
  if (en.filling() || en.writing()) {  // another request is moving it; try again later
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
  en.memory = ChunkEntry::Memory::kFilling;
  Status st =
      disk_->read(en.disk_off, static_cast<uint8_t*>(arena_->data()) + off, en.stored, r->index);
  if (!st.ok()) {
    mem_alloc_.free(off);
    en.memory = ChunkEntry::Memory::kNone;
    return st;
  }
  ++disk_ios_;
  set_state(r, Request::State::kDiskRead);
  return Code::kSuccess;
}

CacheEngine::SpillStart CacheEngine::start_spill(int32_t e) {
  ChunkEntry& en = table_.at(e);
  if (!disk_ || en.on_disk() || en.writing() || !en.mem_ready() || !spilling_allowed())
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
  en.disk = ChunkEntry::Disk::kWriting;
  ++en.readers;
  ++disk_ios_;
  spill_bytes_ += en.stored;
  set_state(r, Request::State::kDiskWrite);
  return SpillStart::kStarted;
}

// The end of a DMA: a store's bytes are in the arena (state Dma, or Shrink after
// an encode), or a retrieve's are in the client's buffer.
void CacheEngine::after_copy(Request* r, Status st, uint64_t cs) {
  ChunkEntry& en = table_.at(r->entry);
  if (r->kind == Request::Kind::kStore) {
    if (!st.ok() || state() == CtxState::kStopping) {
      drop_memory(r->entry);
      finish(r, st.ok() ? Status(Code::kShutdown) : st);
      return;
    }
    complete_store(r, cs);
    return;
  }
  // Retrieve: the bytes the DMA read must be the bytes that were stored.
  const bool mismatch = st.ok() && cs != en.checksum;
  if (mismatch && r->device &&
      chunk_checksum(static_cast<uint8_t*>(arena_->data()) + en.mem_off, en.stored) ==
          en.checksum) {
    // A device copier that hashes where the bytes landed (the GPU's kernel) saw
    // other bytes than the cache holds, and the cache's copy is intact: the copy or
    // the destination changed them (a client may write its own memory). This
    // request fails; the chunk, which other clients may read, stays.
    --en.readers;
    ++st_.landed_mismatches;
    ++st_.misses;
    LOG_WARN(
        "cache: chunk %s landed in device memory as other bytes than the "
        "cache holds (its copy here is intact); reported as a miss to this request",
        key_text(en.key).c_str());
    finish(r, Code::kNotFound);
    return;
  }
  finish_read(r, st, mismatch);
}

// The end of a retrieve's copy (DMA or decode) into the client's buffer. A chunk
// whose bytes failed their check is dropped and reported as a miss.
void CacheEngine::finish_read(Request* r, Status st, bool corrupted) {
  const int32_t e = r->entry;
  ChunkEntry& en = table_.at(e);
  --en.readers;
  if (corrupted) {
    ++st_.checksum_failures;
    LOG_WARN(
        "cache: chunk %s (%llu bytes, %s at offset %llu) failed its checksum "
        "on read; dropped, reported as a miss",
        key_text(en.key).c_str(), static_cast<unsigned long long>(en.stored),
        en.on_disk() ? "disk copy" : "memory",
        static_cast<unsigned long long>(en.on_disk() ? en.disk_off : en.mem_off));
    if (en.readers == 0 && !en.writing() && !en.filling()) drop_entry(e);
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
  if (en.replica_unread)
    en.replica_unread = false;
  else
    touch(e);
  finish(r, Code::kSuccess);
}

// A write-back landed (or failed): log it and keep the disk copy, or keep the
// chunk in memory only; drop its memory if a store was waiting for it.
void CacheEngine::after_spill(Request* r, Status st) {
  --disk_ios_;
  const int32_t e = r->entry;
  ChunkEntry& en = table_.at(e);
  en.disk = ChunkEntry::Disk::kNone;  // Ready below once the write is logged
  --en.readers;
  spill_bytes_ -= en.stored;
  const bool wrote = st.ok();
  if (!wrote) disk_failed("write failed", last_io_errno_ ? last_io_errno_ : EIO);
  if (wrote && disk_->log_put(en.key, r->disk_off, en.stored, en.checksum, en.size, en.encoded)) {
    en.disk = ChunkEntry::Disk::kReady;
    en.disk_off = r->disk_off;
    mem_clean_bytes_ += en.stored;
    table_.disk_push_front(e);
    ++st_.spills;
  } else {
    if (wrote) disk_failed("index log cannot grow", disk_->last_log_errno());
    disk_->allocator().free(r->disk_off);
  }
  set_state(r, Request::State::kDone);
  free_requests_.push_back(r);
  if (en.evict_after_write) {
    en.evict_after_write = false;
    evict_pending_bytes_ -= en.stored;
    // Without a disk copy (the write failed) the chunk stays: memory is not
    // drained by a disk that cannot take data.
    if (en.on_disk() && evictable(e)) {
      ++st_.evictions;
      drop_memory(e);
    }
  }
  retry_waiting();
}

// A reload from disk landed: the chunk is in memory again; a retrieve goes on to
// copy it out, a prefetch checks it here.
void CacheEngine::after_reload(Request* r, Status st) {
  --disk_ios_;
  const int32_t e = r->entry;
  ChunkEntry& en = table_.at(e);
  if (!st.ok()) {
    ++st_.io_errors;
    LOG_ERR("cache: disk tier read of %llu bytes at offset %llu failed: %s",
            static_cast<unsigned long long>(en.stored),
            static_cast<unsigned long long>(en.disk_off),
            std::strerror(last_io_errno_ ? last_io_errno_ : EIO));
    mem_alloc_.free(en.mem_off);
    en.memory = ChunkEntry::Memory::kNone;
    finish(r, Code::kIoFailed);
    retry_waiting();
    return;
  }
  en.memory = ChunkEntry::Memory::kReady;
  policy_->insert(e, en.key_hash, en.stored);
  // The disk copy is now redundant: first to go when the disk tier needs room.
  mem_clean_bytes_ += en.stored;
  table_.disk_unlink(e);
  table_.disk_push_back(e);
  ++st_.reloads;
  retry_waiting();
  if (r->kind == Request::Kind::kPrefetch) {
    // No DMA follows to check the bytes: hash them here.
    if (chunk_checksum(static_cast<uint8_t*>(arena_->data()) + en.mem_off, en.stored) !=
        en.checksum) {
      ++st_.checksum_failures;
      LOG_WARN(
          "cache: chunk %s read back from disk offset %llu failed its checksum; "
          "dropped",
          key_text(en.key).c_str(), static_cast<unsigned long long>(en.disk_off));
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
  for (Request* r : retrying_) advance(r);
  retrying_.clear();
}

// A request that waited for room (or for its chunk to stop moving) tries again.
void CacheEngine::resume_waiting(Request* r) {
  if (r->kind == Request::Kind::kStore) {
    begin_store(r);  // its entry is held (AwaitingRoom) while it waits
    return;
  }
  // A waiting read holds nothing: its chunk may have moved, or left the cache
  // and had its entry reused, meanwhile. Look it up again.
  const int32_t e = table_.find(r->key);
  if (e < 0 || !(table_.at(e).mem_ready() || table_.at(e).on_disk())) {
    if (r->kind == Request::Kind::kRetrieve) ++st_.misses;
    finish(r, Code::kNotFound);
    return;
  }
  r->entry = e;
  if (table_.at(e).mem_ready()) {
    if (r->kind == Request::Kind::kRetrieve)
      begin_read(r);
    else
      finish(r, Code::kSuccess);
    return;
  }
  Status st = start_reload(r);
  if (!st.ok()) finish(r, st);
}

// The one place a request moves on. Each completion (DMA, codec, disk) leaves its
// result in the request, and retry_waiting() hands back the waiters; the state
// says what the request was waiting for, and so what comes next.
void CacheEngine::advance(Request* r) {
  using S = Request::State;
  switch (r->state) {
    case S::kWaitRoom:
      resume_waiting(r);
      return;
    case S::kDma:
    case S::kShrink:
      after_copy(r, r->result, r->result_value);
      return;
    case S::kEncode:
      after_encode(r, r->result, r->result_value);
      return;
    case S::kDecode:
      // The decoder checks the original's xxh3-64 and answers CORRUPTED on a mismatch.
      finish_read(r, r->result, r->result == Code::kCorrupted);
      return;
    case S::kDiskRead:
      after_reload(r, r->result);
      return;
    case S::kDiskWrite:
      after_spill(r, r->result);
      return;
    case S::kFree:
    case S::kDone:
      break;
  }
  LOG_ERR("cache: a completion for request %u, which is not waiting for one (a bug); ignored",
          r->index);
}

size_t CacheEngine::poll() {
  if (!disk_) return 0;
  DiskTier::Completion c[32];
  size_t n = disk_->poll(c, 32);
  for (size_t i = 0; i < n; ++i) {
    last_io_errno_ = c[i].err;
    Request* r = &requests_[c[i].tag];
    r->result = c[i].status;
    advance(r);
  }
  return n;
}

bool CacheEngine::arm_notification() {
  return false;
}  // the ring's eventfd is watched

}  // namespace dpukv
