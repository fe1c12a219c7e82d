// The cache's side of sharing chunks between agents: showing a chunk in place
// (locate), taking in a chunk another party wrote into the arena (ingest), and
// telling a listener which chunks are present. How bytes travel between agents
// (UCX, a PD push) lives in src/cluster; the cache never includes it.
#include "cache/cache_engine_internal.h"
#include "runtime/chunk_checksum.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

void CacheEngine::arena(void** base, uint64_t* len) const {
  *base = arena_->data();
  *len = arena_->size();
}

Status CacheEngine::locate(const ChunkKey& key, ChunkPlacement* out) {
  const int32_t e = find(key);
  if (e < 0) return Code::kNotFound;
  Entry& en = entries_[static_cast<size_t>(e)];
  if (!en.mem_ready) return en.on_disk ? Status(Code::kAgain) : Status(Code::kNotFound);
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
  if (find(key) >= 0) return Code::kBadState;
  int32_t e = insert(key);
  while (e < 0) {  // a full index is a capacity like any other
    const int32_t v = disk_ ? pick_index_victim() : pick_victim();
    if (v < 0) break;
    ++st_.evictions;
    drop_entry(v);
    e = insert(key);
  }
  uint64_t off = 0;
  if (e >= 0 && !make_room(p.stored, &off)) {
    erase(e);
    e = -1;
  }
  if (e < 0) {
    ++st_.ingest_rejects;
    return Code::kNoMemory;
  }
  Entry& en = entries_[static_cast<size_t>(e)];
  en.size = p.size;
  en.stored = p.stored;
  en.encoded = p.encoded;
  en.checksum = p.checksum;
  en.mem_off = off;
  en.in_mem = true;
  en.loading = true;  // not evictable, not yet present
  en.ingesting = true;
  *dst = static_cast<uint8_t*>(arena_->data()) + off;
  return Code::kSuccess;
}

Status CacheEngine::end_ingest(const ChunkKey& key, bool bytes_ok) {
  const int32_t e = find(key);
  if (e < 0 || !entries_[static_cast<size_t>(e)].ingesting) return Code::kBadState;
  Entry& en = entries_[static_cast<size_t>(e)];
  en.ingesting = false;
  en.loading = false;
  const bool same = bytes_ok && chunk_checksum(static_cast<uint8_t*>(arena_->data()) + en.mem_off,
                                               en.stored) == en.checksum;
  if (!same) {
    if (bytes_ok) {
      ++st_.checksum_failures;
      LOG_WARN(
          "cache: ingested chunk %016llx:%016llx (%llu bytes) does not match its checksum; "
          "dropped",
          static_cast<unsigned long long>(en.key.model),
          static_cast<unsigned long long>(en.key.prefix_hash),
          static_cast<unsigned long long>(en.stored));
    }
    ++st_.ingest_rejects;
    mem_alloc_.free(en.mem_off);
    en.in_mem = false;
    erase(e);
    retry_waiting();  // the room it held may be what a waiting store needs
    return bytes_ok ? Status(Code::kCorrupted) : Status(Code::kIoFailed);
  }
  en.mem_ready = true;
  en.replica_unread = true;
  policy_->insert_cold(e, en.key.hash(), en.stored);
  ++st_.ingests;
  st_.ingest_bytes += en.size;
  announce(e);
  return Code::kSuccess;
}

void CacheEngine::announce(int32_t e) {
  Entry& en = entries_[static_cast<size_t>(e)];
  en.announced = true;
  tell_residency(en.key, true);
}

void CacheEngine::tell_residency(const ChunkKey& key, bool present) {
  for (const auto& [cb, arg] : residency_) cb(arg, key, present);
}

void CacheEngine::add_residency_listener(ResidencyCb cb, void* arg, bool replay) {
  if (cb == nullptr) return;
  residency_.emplace_back(cb, arg);
  if (!replay) return;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& en = entries_[i];
    if (!en.used || !(en.mem_ready || en.on_disk)) continue;
    if (en.announced)
      cb(arg, en.key, true);  // the others know it already
    else
      announce(static_cast<int32_t>(i));
  }
}

void CacheEngine::remove_residency_listener(ResidencyCb cb, void* arg) {
  for (size_t i = 0; i < residency_.size(); ++i) {
    if (residency_[i].first != cb || residency_[i].second != arg) continue;
    residency_.erase(residency_.begin() + static_cast<long>(i));
    return;
  }
}

}  // namespace dpukv
