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

// ---------------------------------------------------------------- index

int32_t CacheEngine::find(const ChunkKey& k) const {
  return index_.find(k);
}

int32_t CacheEngine::insert(const ChunkKey& k) {
  const int32_t e = index_.insert(k);
  if (e < 0) return -1;
  Entry& en = entries_[static_cast<size_t>(e)];
  en = Entry{};
  en.key = k;
  en.used = true;
  ++st_.chunks;
  return e;
}

void CacheEngine::erase(int32_t e) {
  Entry& en = entries_[static_cast<size_t>(e)];
  if (!en.used) {  // a second erase would corrupt the free list
    LOG_ERR("cache: entry %d erased twice (a bug); ignored", e);
    return;
  }
  if (en.announced) tell_residency(en.key, false);
  en.used = false;
  index_.erase(e, en.key);
  --st_.chunks;
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

}  // namespace dpukv
