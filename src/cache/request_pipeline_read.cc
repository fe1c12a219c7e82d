// The request pipeline's reads (request_pipeline.h): retrieves and prefetches,
// with a reload from the disk tier first for a chunk only there, and the checks
// that a chunk's bytes are the bytes stored.
#include "cache/request_pipeline.h"

#include <cerrno>
#include <cstring>

#include "protocol/tenant_key.h"
#include "runtime/chunk_checksum.h"
#include "runtime/log.h"

namespace dpukv {

// ---------------------------------------------------------------- retrieve and prefetch

Status RequestPipeline::retrieve(const ChunkKey& key, Buf* dst, DoneCb cb, void* arg) {
  if (dst == nullptr) return Code::kInvalidValue;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(RequestKind::kRetrieve, key, dst, cb, arg, &r));
  uint64_t room = 0;  // over a scatter list (a paged cache's rows), all of its buffers'
  for (const Buf* b = dst; b != nullptr; b = b->next()) room += b->tail_room();
  begin_retrieve_request(r, room);
  return Code::kSuccess;
}

Status RequestPipeline::retrieve_device(const ChunkKey& key, const DeviceRange& dst, DoneCb cb,
                                        void* arg) {
  if (device_ == nullptr) return Code::kNotSupported;
  if (dst.bytes == 0) return Code::kInvalidValue;
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(RequestKind::kRetrieve, key, nullptr, cb, arg, &r));
  r->device = true;
  r->dev = dst;
  begin_retrieve_request(r, dst.bytes);
  return Code::kSuccess;
}

// A retrieve the pipeline accepted, with `room` bytes where the chunk goes: a miss,
// a chunk too big, or on to the copy (after a reload for a disk-only chunk).
void RequestPipeline::begin_retrieve_request(Request* r, uint64_t room) {
  const int32_t e = table_.find(r->key);
  if (e < 0 || !(table_.at(e).mem_ready() || table_.at(e).on_disk())) {
    ++st_->misses;
    finish(r, Code::kNotFound);
    return;
  }
  const ChunkEntry& en = table_.at(e);
  // The decoder writes one host buffer: not device memory, not a scatter list.
  if (en.encoded && (r->device || r->user->list_len() > 1)) {
    finish(r, Code::kNotSupported);
    return;
  }
  if (room < en.size) {
    finish(r, Code::kTooBig);
    return;
  }
  r->entry = e;
  placement_->count_hit(e);
  if (en.mem_ready()) {
    begin_read(r);
    return;
  }
  Status st = start_reload(r);
  if (!st.ok()) finish(r, st);
}

// Memory copy → the client's buffer: a DMA (checksummed) or, for an encoded chunk,
// a decode on the compress engine (which checks the original's checksum).
void RequestPipeline::begin_read(Request* r) {
  const ChunkEntry& en = table_.at(r->entry);
  placement_->begin_reading(r->entry);
  Status st;
  if (r->device) {
    // An encoded chunk is refused before; a reload cannot make one.
    st = en.encoded ? Status(Code::kNotSupported) : start_device_copy(r, true);
  } else {
    st = inv_->get_by_data(placement_->arena_map(), placement_->arena_at(en.mem_off), en.stored,
                           &r->arena_buf);
    if (st.ok())
      st = en.encoded ? start_codec(r, CompressTask::Op::kDecompress, r->arena_buf, r->user)
                      : start_dma(r, r->arena_buf, r->user);
  }
  if (!st.ok()) {
    placement_->end_reading(r->entry);
    if (wait_for_engine(r, st)) return;
    finish(r, st);
  }
}

Status RequestPipeline::prefetch(const ChunkKey& key, DoneCb cb, void* arg) {
  Request* r;
  DPUKV_RETURN_IF_ERROR(accept(RequestKind::kPrefetch, key, nullptr, cb, arg, &r));
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

Status RequestPipeline::start_reload(Request* r) {
  const ChunkEntry& en = table_.at(r->entry);
  if (en.filling() || en.writing()) {  // another request is moving it; try again later
    wait_for_room(r, 0);
    return Code::kSuccess;
  }
  uint64_t off;
  // A reload is the tenant's own chunk: its own coldest make room first where
  // they can (if they cannot, it lands over the quota and is trimmed back then).
  (void)placement_->fit_tenant_memory(key_tenant(en.key), en.stored, r->entry);
  if (!placement_->make_room(en.stored, room_wanted_bytes_, &off)) {
    if (room_may_come()) {
      wait_for_room(r, en.stored);
      return Code::kSuccess;
    }
    return Code::kNoMemory;
  }
  DPUKV_RETURN_IF_ERROR(placement_->begin_reload(r->entry, off, r->index));
  ++disk_reads_;
  set_state(r, RequestState::kDiskRead);
  return Code::kSuccess;
}

// The end of a DMA: a store's bytes are in the arena (state Dma, or Shrink after
// an encode), or a retrieve's are in the client's buffer.
void RequestPipeline::after_copy(Request* r, Status st, uint64_t cs) {
  const ChunkEntry& en = table_.at(r->entry);
  if (r->kind == RequestKind::kStore) {
    if (!st.ok() || stopping()) {
      placement_->drop_memory(r->entry);
      finish(r, st.ok() ? Status(Code::kShutdown) : st);
      return;
    }
    complete_store(r, cs);
    return;
  }
  // Retrieve: the bytes the DMA read must be the bytes that were stored.
  const bool mismatch = st.ok() && cs != en.checksum;
  if (mismatch && r->device &&
      chunk_checksum(placement_->arena_at(en.mem_off), en.stored) == en.checksum) {
    // A device copier that hashes where the bytes landed (the GPU's kernel) saw
    // other bytes than the cache holds, and the cache's copy is intact: the copy or
    // the destination changed them (a client may write its own memory). This
    // request fails; the chunk, which other clients may read, stays.
    placement_->end_reading(r->entry);
    ++st_->landed_mismatches;
    ++st_->misses;
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
void RequestPipeline::finish_read(Request* r, Status st, bool corrupted) {
  const int32_t e = r->entry;
  const ChunkEntry& en = table_.at(e);
  placement_->end_reading(e);
  if (corrupted) {
    ++st_->checksum_failures;
    LOG_WARN(
        "cache: chunk %s (%llu bytes, %s at offset %llu) failed its checksum "
        "on read; dropped, reported as a miss",
        key_text(en.key).c_str(), static_cast<unsigned long long>(en.stored),
        en.on_disk() ? "disk copy" : "memory",
        static_cast<unsigned long long>(en.on_disk() ? en.disk_off : en.mem_off));
    placement_->drop_corrupt(e);
    ++st_->misses;
    finish(r, Code::kNotFound);
    return;
  }
  if (!st.ok()) {
    finish(r, st);
    return;
  }
  ++st_->hits;
  ++st_->retrieves;
  st_->retrieve_bytes += en.size;
  placement_->read_done(e);
  finish(r, Code::kSuccess);
}

void RequestPipeline::reload_done(uint64_t tag, Status st, int err) {
  Request* r = &requests_[tag];
  r->result = st;
  r->result_errno = err;
  advance(r);
}

// A reload from disk landed: the chunk is in memory again; a retrieve goes on to
// copy it out, a prefetch checks it here.
void RequestPipeline::after_reload(Request* r, Status st) {
  --disk_reads_;
  const int32_t e = r->entry;
  const ChunkEntry& en = table_.at(e);
  if (!st.ok()) {
    ++st_->io_errors;
    LOG_ERR("cache: disk tier read of %llu bytes at offset %llu failed: %s",
            static_cast<unsigned long long>(en.stored),
            static_cast<unsigned long long>(en.disk_off),
            std::strerror(r->result_errno ? r->result_errno : EIO));
    placement_->fill_failed(e);
    finish(r, Code::kIoFailed);
    retry_waiting();
    return;
  }
  placement_->reload_landed(e);
  ++st_->reloads;
  retry_waiting();
  if (r->kind == RequestKind::kPrefetch) {
    // No DMA follows to check the bytes: hash them here.
    if (chunk_checksum(placement_->arena_at(en.mem_off), en.stored) != en.checksum) {
      ++st_->checksum_failures;
      LOG_WARN(
          "cache: chunk %s read back from disk offset %llu failed its checksum; "
          "dropped",
          key_text(en.key).c_str(), static_cast<unsigned long long>(en.disk_off));
      placement_->drop_entry(e);
      finish(r, Code::kNotFound);
    } else {
      finish(r, Code::kSuccess);
    }
    return;
  }
  begin_read(r);
}

}  // namespace dpukv
