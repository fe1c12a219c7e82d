#include "cache/chunk_table.h"

#include "runtime/log.h"

namespace dpukv {

void ChunkTable::init(uint32_t capacity) {
  entries_.assign(capacity, ChunkEntry{});
  index_.init(capacity);
  disk_q_ = {};
  used_ = 0;
}

int32_t ChunkTable::insert(const ChunkKey& k, uint64_t hash) {
  const int32_t e = index_.insert(hash);
  if (e < 0) return -1;
  ChunkEntry& en = at(e);
  en = ChunkEntry{};
  en.key = k;
  en.key_hash = hash;
  en.used = true;
  ++used_;
  return e;
}

void ChunkTable::erase(int32_t e) {
  ChunkEntry& en = at(e);
  if (!en.used) {  // a second erase would corrupt the free list
    LOG_ERR("cache: entry %d erased twice (a bug); ignored", e);
    return;
  }
  disk_unlink(e);
  write_queue_unlink(e);
  if (en.announced) tell(en.key, false);
  en.used = false;
  index_.erase(e, en.key_hash);
  --used_;
}

// Disk-only chunks sit in recency order (a chunk joins at the front when its
// memory copy leaves), and copies of chunks also in memory after them, reloaded
// ones at the very end: the tier makes room from the back, so a redundant copy
// goes before any chunk that lives only on disk.
void ChunkTable::disk_push_front(int32_t e) {
  ChunkEntry& en = at(e);
  en.dprev = -1;
  en.dnext = disk_q_.head;
  if (disk_q_.head >= 0) at(disk_q_.head).dprev = e;
  disk_q_.head = e;
  if (disk_q_.tail < 0) disk_q_.tail = e;
  disk_q_.bytes += en.stored;
}

void ChunkTable::disk_push_back(int32_t e) {
  ChunkEntry& en = at(e);
  en.dnext = -1;
  en.dprev = disk_q_.tail;
  if (disk_q_.tail >= 0) at(disk_q_.tail).dnext = e;
  disk_q_.tail = e;
  if (disk_q_.head < 0) disk_q_.head = e;
  disk_q_.bytes += en.stored;
}

void ChunkTable::write_queue_push(int32_t e) {
  ChunkEntry& en = at(e);
  if (en.write_queued) return;
  en.write_queued = true;
  en.wnext = -1;
  en.wprev = write_q_.tail;
  if (write_q_.tail >= 0) at(write_q_.tail).wnext = e;
  write_q_.tail = e;
  if (write_q_.head < 0) write_q_.head = e;
  ++write_q_.length;
}

void ChunkTable::write_queue_unlink(int32_t e) {
  ChunkEntry& en = at(e);
  if (!en.write_queued) return;
  if (en.wprev >= 0)
    at(en.wprev).wnext = en.wnext;
  else
    write_q_.head = en.wnext;
  if (en.wnext >= 0)
    at(en.wnext).wprev = en.wprev;
  else
    write_q_.tail = en.wprev;
  en.wprev = en.wnext = -1;
  en.write_queued = false;
  --write_q_.length;
}

void ChunkTable::disk_unlink(int32_t e) {
  ChunkEntry& en = at(e);
  if (en.dprev >= 0)
    at(en.dprev).dnext = en.dnext;
  else if (disk_q_.head == e)
    disk_q_.head = en.dnext;
  else
    return;  // not linked
  if (en.dnext >= 0)
    at(en.dnext).dprev = en.dprev;
  else
    disk_q_.tail = en.dprev;
  en.dprev = en.dnext = -1;
  disk_q_.bytes -= en.stored;
}

void ChunkTable::announce(int32_t e) {
  ChunkEntry& en = at(e);
  en.announced = true;
  tell(en.key, true);
}

void ChunkTable::tell(const ChunkKey& key, bool present) {
  for (const auto& [cb, arg] : listeners_) cb(arg, key, present);
}

void ChunkTable::add_listener(ResidencyCb cb, void* arg, bool replay) {
  if (cb == nullptr) return;
  listeners_.emplace_back(cb, arg);
  if (!replay) return;
  for (int32_t e = 0; e < static_cast<int32_t>(entries_.size()); ++e) {
    const ChunkEntry& en = at(e);
    if (!en.used || !en.present()) continue;
    if (en.announced)
      cb(arg, en.key, true);  // the others know it already
    else
      announce(e);
  }
}

void ChunkTable::remove_listener(ResidencyCb cb, void* arg) {
  for (size_t i = 0; i < listeners_.size(); ++i) {
    if (listeners_[i].first != cb || listeners_[i].second != arg) continue;
    listeners_.erase(listeners_.begin() + static_cast<long>(i));
    return;
  }
}

ChunkTable::Counts ChunkTable::counts() const {
  Counts c;
  c.chunks = used_;
  for (const ChunkEntry& en : entries_) {
    if (!en.used) continue;
    c.memory += en.mem_ready();
    c.disk += en.on_disk();
    c.both += en.mem_ready() && en.on_disk();
  }
  return c;
}

}  // namespace dpukv
