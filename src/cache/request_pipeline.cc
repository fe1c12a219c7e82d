#include "cache/request_pipeline.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engines/compress/kv_codec.h"
#include "protocol/tenant_key.h"
#include "runtime/chunk_checksum.h"
#include "runtime/log.h"

namespace dpukv {

RequestPipeline::RequestPipeline(Context* owner, const CacheOptions& o, Placement* placement,
                                 CacheStats* st)
    : owner_(owner), opts_(o), placement_(placement), table_(placement->table()), st_(st) {}

RequestPipeline::~RequestPipeline() {
  // Return every internal buffer before the engines and inventory go.
  for (Request& r : requests_) {
    if (r.arena_buf != nullptr) (void)r.arena_buf->dec_refcount(), r.arena_buf = nullptr;
    if (r.arena_buf2 != nullptr) (void)r.arena_buf2->dec_refcount(), r.arena_buf2 = nullptr;
  }
  dma_.reset();
  codec_.reset();
}

Status RequestPipeline::init(ProgressEngine* pe) {
  DPUKV_RETURN_IF_ERROR(BufInventory::create(2 * opts_.max_requests + 16, &inv_));
  DmaOptions dopt = opts_.dma;
  dopt.max_buf_size = std::max<uint64_t>(dopt.max_buf_size, opts_.max_chunk_bytes);
  DPUKV_RETURN_IF_ERROR(DmaEngine::create(pe, dopt, &dma_));
  UserData ud;
  ud.ptr = this;
  DPUKV_RETURN_IF_ERROR(dma_->set_user_data(ud));
  DPUKV_RETURN_IF_ERROR(dma_->set_memcpy_conf(&RequestPipeline::dma_done,
                                              &RequestPipeline::dma_done, opts_.max_requests));
  if (opts_.compress) {
    CompressOptions co;
    co.num_threads = opts_.compress_threads;
    co.max_buf_size = kv_encode_bound(
        KvCodecParams{KvCodec::kLossless, KvDtype::kBf16, {1, 1, 0}, 0}, opts_.max_chunk_bytes);
    DPUKV_RETURN_IF_ERROR(CompressEngine::create(pe, co, &codec_));
    DPUKV_RETURN_IF_ERROR(codec_->set_user_data(ud));
    DPUKV_RETURN_IF_ERROR(codec_->set_conf(&RequestPipeline::codec_done,
                                           &RequestPipeline::codec_done, opts_.max_requests));
  }
  requests_.resize(opts_.max_requests);
  per_state_[static_cast<size_t>(RequestState::kFree)] = opts_.max_requests;
  for (uint32_t i = 0; i < opts_.max_requests; ++i) {
    requests_[i].index = i;
    requests_[i].owner = this;
    free_requests_.push_back(&requests_[opts_.max_requests - 1 - i]);
  }
  waiting_.reserve(opts_.max_requests);
  retrying_.reserve(opts_.max_requests);
  return Code::kSuccess;
}

Status RequestPipeline::start() {
  DPUKV_RETURN_IF_ERROR(dma_->start());
  if (codec_) DPUKV_RETURN_IF_ERROR(codec_->start());
  return Code::kSuccess;
}

void RequestPipeline::stop() {
  for (Request* r : waiting_) finish(r, Code::kShutdown);
  waiting_.clear();
  room_wanted_bytes_ = 0;
  (void)dma_->stop();
  if (codec_) (void)codec_->stop();
}

bool RequestPipeline::idle() const {
  if (free_requests_.size() != requests_.size() || dma_->state() != CtxState::kIdle) return false;
  return !codec_ || codec_->state() == CtxState::kIdle;
}

// ---------------------------------------------------------------- the pool

void RequestPipeline::set_state(Request* r, RequestState state) {
  --per_state_[static_cast<size_t>(r->state)];
  ++per_state_[static_cast<size_t>(state)];
  r->state = state;
}

RequestPipeline::Request* RequestPipeline::new_request() {
  if (free_requests_.empty()) return nullptr;
  Request* r = free_requests_.back();
  free_requests_.pop_back();
  set_state(r, RequestState::kFree);
  r->entry = -1;
  r->user = r->arena_buf = r->arena_buf2 = nullptr;
  r->device = false;
  r->big_off = UINT64_MAX;
  r->tenant_charge = 0;
  r->cb = nullptr;
  r->arg = nullptr;
  return r;
}

// Takes a request for an operation; the pipeline holds a reference on the user's
// buffer (if any) until the request finishes.
Status RequestPipeline::accept(RequestKind kind, const ChunkKey& key, Buf* user, DoneCb cb,
                               void* arg, Request** out) {
  if (owner_->state() != CtxState::kRunning) return Code::kBadState;
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

void RequestPipeline::release_arena_bufs(Request* r) {
  for (Buf** b : {&r->arena_buf, &r->arena_buf2}) {
    if (*b != nullptr) {
      (void)(*b)->dec_refcount();
      *b = nullptr;
    }
  }
}

void RequestPipeline::release_tenant_charge(Request* r) {
  if (r->tenant_charge == 0) return;
  placement_->release_fill(key_tenant(r->key), r->tenant_charge);
  r->tenant_charge = 0;
}

void RequestPipeline::finish(Request* r, Status st) {
  release_arena_bufs(r);
  release_tenant_charge(r);
  if (r->big_off != UINT64_MAX) {  // an encode slot that was not needed in the end
    placement_->free_slot(r->big_off);
    r->big_off = UINT64_MAX;
  }
  if (r->user != nullptr) {  // the reference taken when the request was accepted
    (void)r->user->dec_refcount();
    r->user = nullptr;
  }
  set_state(r, RequestState::kDone);
  DoneCb cb = r->cb;
  void* arg = r->arg;
  free_requests_.push_back(r);
  if (cb != nullptr) cb(arg, st);
}

// A request that found no room waits while something in flight may still make
// some: a write-back landing, or a copy finishing (its chunk becomes evictable).
// Every such completion retries the waiters; with nothing in flight they fail.
void RequestPipeline::wait_for_room(Request* r, uint64_t bytes) {
  set_state(r, RequestState::kWaitRoom);
  waiting_.push_back(r);
  room_wanted_bytes_ += bytes;
}

// The DMA and compress engines answer AGAIN while their rings are full: a batch
// longer than a ring (the chunks of one long prompt) waits, as for room, until a
// copy in flight completes and retries the waiters, instead of failing entries
// the caller would have to send again.
bool RequestPipeline::wait_for_engine(Request* r, Status st) {
  if (st != Code::kAgain || engine_ops_ == 0) return false;
  release_arena_bufs(r);
  ++st_->engine_waits;
  wait_for_room(r, 0);
  return true;
}

bool RequestPipeline::room_may_come() const {
  return placement_->spills_in_flight() > 0 || disk_reads_ > 0 || engine_ops_ > 0;
}

void RequestPipeline::retry_waiting() {
  if (waiting_.empty()) return;
  // The two lists trade places (no allocation): requests that still cannot go
  // are queued again on the now empty waiting_.
  retrying_.swap(waiting_);
  room_wanted_bytes_ = 0;
  for (Request* r : retrying_) advance(r);
  retrying_.clear();
}

// ---------------------------------------------------------------- engines

Status RequestPipeline::start_dma(Request* r, Buf* src, Buf* dst) {
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
  set_state(r, RequestState::kDma);
  return Code::kSuccess;
}

void RequestPipeline::dma_done(DmaMemcpyTask* t, UserData task_ud, UserData ctx_ud) {
  auto* self = static_cast<RequestPipeline*>(ctx_ud.ptr);
  Request* r = &self->requests_[task_ud.u64];
  r->result = t->status();
  r->result_value = t->checksum();
  (void)self->dma_->free(t);
  --self->engine_ops_;
  self->advance(r);
  // A finished copy may have made a chunk evictable: requests waiting for room retry.
  self->retry_waiting();
}

Status RequestPipeline::start_codec(Request* r, CompressTask::Op op, Buf* src, Buf* dst) {
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
  set_state(r, op == CompressTask::Op::kCompress ? RequestState::kEncode : RequestState::kDecode);
  return Code::kSuccess;
}

void RequestPipeline::codec_done(CompressTask* t, UserData task_ud, UserData ctx_ud) {
  auto* self = static_cast<RequestPipeline*>(ctx_ud.ptr);
  Request* r = &self->requests_[task_ud.u64];
  r->result = t->status();
  r->result_value = t->result().out_len;
  (void)self->codec_->free(t);
  --self->engine_ops_;
  self->advance(r);
  self->retry_waiting();
}

// Arena <-> device memory on the copier. The checksum the cache keeps is of the
// arena's bytes, and the copier takes it as it copies (off this thread, as the DMA
// engine does): a store's once they landed, a retrieve's while the copy runs (the
// chunk cannot change under its reader). Device chunks are never encoded, so the
// bytes copied are the bytes stored.
Status RequestPipeline::start_device_copy(Request* r, bool to_device) {
  const ChunkEntry& en = table_.at(r->entry);
  if (en.stored != en.size) return Code::kNotSupported;
  DPUKV_RETURN_IF_ERROR(device_->copy(r->dev.region, r->dev.offset,
                                      placement_->arena_at(en.mem_off), en.size, to_device,
                                      &r->result_value, &RequestPipeline::device_done, r));
  ++engine_ops_;
  set_state(r, RequestState::kDma);
  return Code::kSuccess;
}

void RequestPipeline::device_done(void* arg, Status st) {
  auto* r = static_cast<Request*>(arg);
  RequestPipeline* self = r->owner;
  r->result = st;
  --self->engine_ops_;
  self->advance(r);
  self->retry_waiting();
}

// ---------------------------------------------------------------- store

Status RequestPipeline::store(const ChunkKey& key, Buf* src, DoneCb cb, void* arg) {
  if (src == nullptr || src->data_len() == 0) return Code::kInvalidValue;
  if (src->data_len() > opts_.max_chunk_bytes) return Code::kTooBig;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(RequestKind::kStore, key, src, cb, arg, &r));
  return begin_store_request(r, src->data_len());
}

Status RequestPipeline::store_device(const ChunkKey& key, const DeviceRange& src, DoneCb cb,
                                     void* arg) {
  if (device_ == nullptr) return Code::kNotSupported;
  if (src.bytes == 0) return Code::kInvalidValue;
  if (src.bytes > opts_.max_chunk_bytes) return Code::kTooBig;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(RequestKind::kStore, key, nullptr, cb, arg, &r));
  r->device = true;
  r->dev = src;
  return begin_store_request(r, src.bytes);
}

// A store the pipeline accepted: its entry, then room and the copy (begin_store).
Status RequestPipeline::begin_store_request(Request* r, uint64_t size) {
  const ChunkKey& key = r->key;
  const uint64_t hash = key.hash();
  const int32_t existing = table_.find(key, hash);
  if (existing >= 0) {  // chunks are immutable: an existing key is a success, and fresh again
    placement_->touch(existing);
    finish(r, Code::kSuccess);
    return Code::kSuccess;
  }
  // Encoded chunks first take a slot of the codec's worst case, then move to one
  // of their own size. Device bytes are not on the host for the codec to read.
  const uint64_t bound =
      codec_ && !r->device
          ? kv_encode_bound(KvCodecParams{KvCodec::kLossless, KvDtype::kBf16, {1, 1, 0}, 0}, size)
          : 0;
  const bool encoded = codec_ != nullptr && !r->device && bound <= placement_->page_bytes();
  const int32_t e = placement_->reserve(key, hash, size, encoded ? bound : size, encoded);
  if (e < 0) {
    ++st_->store_rejects;
    finish(r, Code::kNoMemory);
    return Code::kSuccess;
  }
  r->entry = e;
  begin_store(r);
  return Code::kSuccess;
}

void RequestPipeline::begin_store(Request* r) {
  const ChunkEntry& en = table_.at(r->entry);
  uint64_t off;
  // A tenant at its quota makes room from its own chunks first; while the rest of
  // its quota is in flight it waits for those fills to land (they become its
  // victims), and with nothing in flight its store is refused, never taken from
  // another tenant's share.
  const uint32_t tenant = key_tenant(en.key);
  if (!placement_->fit_tenant_memory(tenant, en.stored, r->entry)) {
    if (room_may_come()) {
      wait_for_room(r, 0);
      return;
    }
    placement_->abandon(r->entry);
    ++st_->store_rejects;
    finish(r, Code::kNoMemory);
    return;
  }
  if (!placement_->make_room(en.stored, room_wanted_bytes_, &off)) {
    if (room_may_come()) {
      wait_for_room(r, en.stored);
      return;
    }
    placement_->abandon(r->entry);
    ++st_->store_rejects;
    finish(r, Code::kNoMemory);
    return;
  }
  placement_->begin_fill(r->entry, off);
  if (placement_->has_memory_quota(tenant)) {
    placement_->charge_fill(tenant, en.stored);
    r->tenant_charge = en.stored;
  }
  Status st;
  if (r->device) {
    st = start_device_copy(r, false);
  } else {
    st = inv_->get_by_addr(placement_->arena_map(), placement_->arena_at(off), en.stored,
                           &r->arena_buf);
    if (st.ok())
      st = en.encoded ? start_codec(r, CompressTask::Op::kCompress, r->user, r->arena_buf)
                      : start_dma(r, r->user, r->arena_buf);
  }
  if (!st.ok()) {
    placement_->fill_failed(r->entry);
    release_tenant_charge(r);
    if (wait_for_engine(r, st)) {
      placement_->await_room(r->entry);  // held, as for room
      return;
    }
    placement_->abandon(r->entry);
    finish(r, st);
  }
}

// The chunk's bytes are encoded into its worst-case slot: move them to a slot of
// their own size (state Shrink) or, when none is smaller, keep that one.
void RequestPipeline::after_encode(Request* r, Status st, uint64_t out_len) {
  const int32_t e = r->entry;
  const ChunkEntry& en = table_.at(e);
  if (!st.ok() || stopping()) {
    placement_->drop_memory(e);
    finish(r, st.ok() ? Status(Code::kShutdown) : st);
    return;
  }
  st_->encoded_bytes_in += en.size;
  st_->encoded_bytes_out += out_len;
  const uint64_t big = en.mem_off;
  uint64_t small;
  if (placement_->smaller_slot(en.stored, out_len, &small)) {
    // Move to a slot of the encoded size; the DMA computes the checksum on the way.
    Status ds = inv_->get_by_addr(placement_->arena_map(), placement_->arena_at(small), out_len,
                                  &r->arena_buf2);
    if (ds.ok()) ds = start_dma(r, r->arena_buf, r->arena_buf2);
    if (ds.ok()) {
      r->big_off = big;
      placement_->encoded_into(e, small, out_len);
      set_state(r, RequestState::kShrink);
      return;
    }
    if (r->arena_buf2) (void)r->arena_buf2->dec_refcount(), r->arena_buf2 = nullptr;
    placement_->free_slot(small);
  }
  // Keep the encode slot.
  placement_->encoded_into(e, big, out_len);
  complete_store(r, chunk_checksum(placement_->arena_at(big), out_len));
}

void RequestPipeline::complete_store(Request* r, uint64_t cs) {
  const int32_t e = r->entry;
  release_tenant_charge(r);  // its bytes count as present from here
  placement_->store_landed(e, cs);
  ++st_->stores;
  st_->store_bytes += table_.at(e).size;
  finish(r, Code::kSuccess);  // also frees a finished shrink's encode slot
  if (opts_.write_through && table_.at(e).hits >= opts_.disk_admit_hits)
    placement_->write_through(e);
  placement_->clean_ahead();
}

// ---------------------------------------------------------------- moving on

// A request that waited for room (or for its chunk to stop moving) tries again.
void RequestPipeline::resume_waiting(Request* r) {
  if (r->kind == RequestKind::kStore) {
    begin_store(r);  // its entry is held (AwaitingRoom) while it waits
    return;
  }
  // A waiting read holds nothing: its chunk may have moved, or left the cache
  // and had its entry reused, meanwhile. Look it up again.
  const int32_t e = table_.find(r->key);
  if (e < 0 || !(table_.at(e).mem_ready() || table_.at(e).on_disk())) {
    if (r->kind == RequestKind::kRetrieve) ++st_->misses;
    finish(r, Code::kNotFound);
    return;
  }
  r->entry = e;
  if (table_.at(e).mem_ready()) {
    if (r->kind == RequestKind::kRetrieve)
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
void RequestPipeline::advance(Request* r) {
  using S = RequestState;
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
    case S::kFree:
    case S::kDone:
      break;
  }
  LOG_ERR("cache: a completion for request %u, which is not waiting for one (a bug); ignored",
          r->index);
}

}  // namespace dpukv
