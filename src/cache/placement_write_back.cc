// Placement's write-back (placement.h): memory copies written to the disk tier to
// make room ahead of need or through (write_through), paced, at most kMaxSpills in
// flight, stopped for a while after a disk error.
#include "cache/placement.h"

#include <cerrno>
#include <cstring>

#include "protocol/tenant_key.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

// ---------------------------------------------------------------- write-back

bool Placement::spilling_allowed() const {
  return spill_off_until_ns_ == 0 || monotonic_ns() >= spill_off_until_ns_;
}

// Frees disk space for `size` bytes by dropping copies from the back of the disk
// queue: a copy whose chunk is also in memory loses only that copy; a disk-only
// chunk leaves the cache. Chunks being read from disk, and pinned disk-only chunks,
// stay. False if nothing more can go.
bool Placement::make_disk_room(uint64_t size, uint64_t* off) {
  const uint64_t now = monotonic_ns();
  int32_t v = table_.disk_coldest();
  while (!disk_->alloc(size, off)) {
    v = disk_victim_from(v, now, 0, -1);
    if (v < 0) return false;
    const int32_t victim = v;
    v = table_.disk_warmer(v);
    evict_disk_copy(victim);
  }
  return true;
}

// From v toward the warmer end of the disk queue: the first disk copy that may go
// (not being filled, not a pinned disk-only chunk), of tenant `tag` (0: any) and
// not `keep`; -1 if none.
int32_t Placement::disk_victim_from(int32_t v, uint64_t now, uint32_t tag, int32_t keep) const {
  for (; v >= 0; v = table_.disk_warmer(v)) {
    const ChunkEntry& en = table_.at(v);
    if (v != keep && (tag == 0 || key_tenant(en.key) == tag) && !en.filling() &&
        !(en.pinned(now) && !en.mem_ready()))
      return v;
  }
  return -1;
}

// A chunk also in memory loses only its disk copy; a disk-only chunk leaves.
void Placement::evict_disk_copy(int32_t victim) {
  if (table_.at(victim).mem_ready()) {
    drop_disk_copy(victim);
  } else {
    ++st_->disk_evictions;
    drop_entry(victim);
  }
}

Placement::SpillStart Placement::start_spill(int32_t e) {
  ChunkEntry& en = table_.at(e);
  if (!disk_ || en.on_disk() || en.writing() || !en.mem_ready() || !spilling_allowed())
    return SpillStart::kRefused;
  if (spills_in_flight_ == kMaxSpills) return SpillStart::kBusy;
  uint64_t off;
  if (!fit_tenant_disk(key_tenant(en.key), en.stored, e)) return SpillStart::kRefused;
  if (!make_disk_room(en.stored, &off)) return SpillStart::kRefused;  // only pinned or busy
  const uint32_t slot = free_spills_[kMaxSpills - 1 - spills_in_flight_];
  Status st = disk_->write(off, arena_at(en.mem_off), en.stored, kSpillTag | slot);
  if (!st.ok()) {
    disk_->free(off);
    if (st == Code::kAgain) return SpillStart::kBusy;
    disk_failed("write could not be submitted", EIO);
    return SpillStart::kRefused;
  }
  ++spills_in_flight_;
  spills_[slot] = {e, off};
  en.disk = ChunkEntry::Disk::kWriting;
  ++en.readers;
  spill_bytes_ += en.stored;
  return SpillStart::kStarted;
}

void Placement::write_through(int32_t e) {
  if (!disk_) return;
  table_.write_queue_push(e);
  drain_write_queue();
}

// Oldest first; a chunk that cannot start for lack of a slot (or while a failed
// disk is paused) keeps its place at the front.
void Placement::drain_write_queue() {
  for (int32_t e = table_.write_queue_front();
       e >= 0 && spills_in_flight_ < kMaxSpills && spilling_allowed();
       e = table_.write_queue_front()) {
    if (start_spill(e) == SpillStart::kBusy) return;
    table_.write_queue_unlink(e);  // started, or the disk cannot take it (logged there)
  }
}

// Write-back is paced by a watermark: clean memory (chunks with a disk copy, which
// eviction drops at once) plus free memory is kept at about an eighth of the tier
// (at most 8 of the largest chunks), with at most kMaxSpills writes in flight. So
// a store rarely waits for a write, the memory tier stays full of hot chunks, and
// few chunks hold a slot in both tiers. Below the watermark nothing is written
// ahead of need.
void Placement::clean_ahead() {
  if (!disk_ || !spilling_allowed()) return;
  drain_write_queue();
  const uint64_t cap = mem_alloc_.capacity();
  const uint64_t target = std::min<uint64_t>(cap / 8, 8 * page_bytes_);
  uint64_t reserve = cap - mem_alloc_.used_bytes() + mem_clean_bytes_ + spill_bytes_;
  for (int32_t v = policy_->coldest(); v >= 0 && reserve < target && spills_in_flight_ < kMaxSpills;
       v = policy_->warmer(v)) {
    ChunkEntry& en = table_.at(v);
    if (en.on_disk() || en.writing() || !en.mem_ready() || en.hits < opts_.disk_admit_hits)
      continue;
    if (start_spill(v) != SpillStart::kStarted) break;
    reserve += en.stored;
  }
}

// A write-back landed (or failed): log it and keep the disk copy, or keep the
// chunk in memory only; drop its memory if a store was waiting for it.
void Placement::spill_done(uint64_t tag, Status st, int err) {
  const uint32_t slot = static_cast<uint32_t>(tag & ~kSpillTag);
  const Spill s = spills_[slot];
  free_spills_[kMaxSpills - spills_in_flight_] = slot;
  --spills_in_flight_;
  const int32_t e = s.entry;
  ChunkEntry& en = table_.at(e);
  en.disk = ChunkEntry::Disk::kNone;  // Ready below once the write is logged
  --en.readers;
  spill_bytes_ -= en.stored;
  const bool wrote = st.ok();
  if (!wrote) disk_failed("write failed", err ? err : EIO);
  if (wrote && disk_->log_put(en.key, s.disk_off, en.stored, en.checksum, en.size, en.encoded)) {
    en.disk = ChunkEntry::Disk::kReady;
    en.disk_off = s.disk_off;
    usage_of(en).disk_bytes += en.stored;
    mem_clean_bytes_ += en.stored;
    table_.disk_push_front(e);
    ++st_->spills;
  } else {
    if (wrote) disk_failed("index log cannot grow", disk_->last_log_errno());
    disk_->free(s.disk_off);
    // Write-through promised this chunk to the disk: it is tried again once the
    // failed disk's pause ends.
    if (opts_.write_through && en.mem_ready()) table_.write_queue_push(e);
  }
  if (en.evict_after_write) {
    en.evict_after_write = false;
    evict_pending_bytes_ -= en.stored;
    // Without a disk copy (the write failed) the chunk stays: memory is not
    // drained by a disk that cannot take data.
    if (en.on_disk() && evictable(e)) {
      ++st_->evictions;
      drop_memory(e);
    }
  }
  drain_write_queue();
  room_freed();
}

// A failed spill keeps the chunk in memory and stops writing back for a while, so
// that a disk that cannot take data (full, log cannot grow, device errors) leaves
// the memory tier exactly as full as it would be without a disk tier. Logged at
// most once a second, with the cause and how many were not logged.
void Placement::disk_failed(const char* what, int err) {
  ++st_->io_errors;
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
