#include "cache/placement.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cache/eviction_policies.h"
#include "engines/compress/kv_codec.h"
#include "protocol/tenant_key.h"
#include "runtime/chunk_checksum.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

uint64_t Placement::slot_bytes(const CacheOptions& o) {
  if (!o.compress) return o.max_chunk_bytes;
  return std::max<uint64_t>(
      o.max_chunk_bytes,
      kv_encode_bound(KvCodecParams{KvCodec::kLossless, KvDtype::kBf16, {1, 1, 0}, 0},
                      o.max_chunk_bytes));
}

Placement::Placement(const CacheOptions& o, CacheStats* st) : opts_(o), st_(st) {
  for (uint32_t i = 0; i < kMaxSpills; ++i) free_spills_[i] = kMaxSpills - 1 - i;
}

Placement::~Placement() {
  if (arena_map_) (void)arena_map_->stop();
}

Status Placement::init() {
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
  table_.init(opts_.max_chunks);
  policy_ = find_eviction_policy(opts_.policy)
                ->make({table_.capacity(), mem_alloc_.capacity(), page_bytes_});
  st_->memory_capacity = mem_alloc_.capacity();
  if (opts_.disk_dir.empty()) return Code::kSuccess;

  DiskTierOptions dopts;
  dopts.dir = opts_.disk_dir;
  dopts.capacity = opts_.disk_bytes;
  dopts.nvme_address = opts_.nvme_address;
  dopts.nvme_nqn = opts_.nvme_nqn;
  dopts.page_size = page_bytes_;
  dopts.max_chunks = table_.capacity();
  std::vector<DiskTier::Recovered> rec;
  DPUKV_RETURN_IF_ERROR(DiskTier::open(dopts, {{arena_->data(), arena_->size()}}, &rec, &disk_));
  for (const auto& r : rec) {
    int32_t e = table_.insert(r.key);
    if (e < 0) {  // the tier hands back at most the table's room
      LOG_ERR("cache: the chunk table cannot take a recovered chunk (a bug)");
      return Code::kBadState;
    }
    ChunkEntry& en = table_.at(e);
    en.size = r.raw_len;
    en.stored = r.len;
    en.encoded = r.encoded;
    en.checksum = r.checksum;
    en.disk_off = r.offset;
    en.disk = ChunkEntry::Disk::kReady;
    usage_of(en).disk_bytes += en.stored;
    ++usage_of(en).chunks;
    table_.disk_push_front(e);  // log order: later records are more recent
  }
  st_->recovered = rec.size();
  st_->disk_capacity = disk_->allocator().capacity();
  return Code::kSuccess;
}

void Placement::arena(void** base, uint64_t* len) const {
  *base = arena_->data();
  *len = arena_->size();
}

// ---------------------------------------------------------------- chunks leaving and coming

void Placement::touch(int32_t e) {
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

int32_t Placement::pick_victim() {
  return policy_->victim(
      [](const void* self, int32_t v) { return static_cast<const Placement*>(self)->evictable(v); },
      this);
}

// With a disk tier the least valuable chunk of the whole cache is the disk queue's
// last disk-only chunk; memory's victim only when the disk holds none.
int32_t Placement::pick_index_victim() {
  const uint64_t now = monotonic_ns();
  for (int32_t v = table_.disk_coldest(); v >= 0; v = table_.disk_warmer(v)) {
    const ChunkEntry& en = table_.at(v);
    if (en.memory == ChunkEntry::Memory::kNone && !en.pinned(now)) return v;
  }
  return pick_victim();
}

// A full index is a capacity like any other: evict (from every tier) to make room.
int32_t Placement::insert_entry(const ChunkKey& key, uint64_t hash) {
  int32_t e = table_.insert(key, hash);
  while (e < 0) {
    const int32_t v = disk_ ? pick_index_victim() : pick_victim();
    if (v < 0) return -1;
    ++st_->evictions;
    drop_entry(v);
    e = table_.insert(key, hash);
  }
  return e;
}

bool Placement::evictable(int32_t e) const {
  const ChunkEntry& en = table_.at(e);
  return en.has_memory() && en.mem_ready() && !en.pinned(monotonic_ns()) && en.readers == 0 &&
         !en.writing() && !en.filling();
}

void Placement::drop_memory(int32_t e) {
  ChunkEntry& en = table_.at(e);
  if (en.has_memory()) {
    if (en.mem_ready()) {
      TenantUsage& u = usage_of(en);
      u.memory_bytes -= en.stored;
      if (!en.on_disk()) --u.chunks;
    }
    if (en.on_disk() && en.mem_ready()) mem_clean_bytes_ -= en.stored;
    mem_alloc_.free(en.mem_off);
    policy_->remove(e);
    en.memory = ChunkEntry::Memory::kNone;
    table_.write_queue_unlink(e);  // nothing left to write
  }
  if (!en.on_disk()) {
    table_.erase(e);
    return;
  }
  // Now only on disk, and more recent than every other disk-only chunk.
  table_.disk_unlink(e);
  table_.disk_push_front(e);
}

void Placement::drop_entry(int32_t e) {
  ChunkEntry& en = table_.at(e);
  drop_disk_copy(e);
  if (en.has_memory()) {
    drop_memory(e);
  } else {
    table_.erase(e);
  }
}

void Placement::drop_disk_copy(int32_t e) {
  ChunkEntry& en = table_.at(e);
  if (!en.on_disk()) return;
  TenantUsage& u = usage_of(en);
  u.disk_bytes -= en.stored;
  if (!en.mem_ready()) --u.chunks;
  if (en.has_memory() && en.mem_ready()) mem_clean_bytes_ -= en.stored;
  table_.disk_unlink(e);
  disk_->free(en.disk_off);
  (void)disk_->log_del(en.key);  // a lost tombstone only costs a checksum miss after restart
  en.disk = ChunkEntry::Disk::kNone;
}

// Frees memory for `size` bytes. A victim without a disk copy is written back
// first (its memory goes when the write lands); while writes already under way
// will free enough, or kMaxSpills are in flight, no more start: false, and the
// caller waits for a completion. A victim the disk cannot take (tier full of
// pinned chunks, writes stopped after errors) is evicted outright, as it would be
// without a disk tier.
bool Placement::make_room(uint64_t size, uint64_t queued, uint64_t* off) {
  for (;;) {
    if (mem_alloc_.alloc(size, off)) return true;
    // Room already coming covers the requests queued before this one first: each
    // waiter has its own write-back under way, so N waiters keep N writes in flight.
    if (evict_pending_bytes_ >= queued + size) return false;
    const int32_t v = pick_victim();
    if (v < 0) return false;
    ChunkEntry& en = table_.at(v);
    if (disk_ && !en.on_disk() && en.hits >= opts_.disk_admit_hits) {
      if (spills_in_flight_ >= kMaxSpills) return false;
      const SpillStart r = start_spill(v);
      if (r == SpillStart::kStarted) {
        en.evict_after_write = true;
        evict_pending_bytes_ += en.stored;
        continue;
      }
      if (r == SpillStart::kBusy) return false;
    }
    ++st_->evictions;
    drop_memory(v);
  }
}

// A reload or a peer's push lands without a charge taken beforehand: the tenant's
// quota is checked again here.
void Placement::memory_present(int32_t e) {
  ChunkEntry& en = table_.at(e);
  TenantUsage& u = usage_of(en);
  u.memory_bytes += en.stored;
  if (!en.on_disk()) ++u.chunks;
  // (Room freed here serves waiting stores at the next room event: this runs inside
  // a completion, where the pipeline is not to be re-entered.)
  if (u.memory_quota != 0 && u.memory_bytes + u.memory_filling > u.memory_quota)
    (void)fit_tenant_memory(key_tenant(en.key), 0, e);
}

void Placement::store_landed(int32_t e, uint64_t checksum) {
  ChunkEntry& en = table_.at(e);
  en.checksum = checksum;
  en.memory = ChunkEntry::Memory::kReady;
  policy_->insert(e, en.key_hash, en.stored);
  memory_present(e);
  table_.announce(e);
}

void Placement::reload_landed(int32_t e) {
  ChunkEntry& en = table_.at(e);
  en.memory = ChunkEntry::Memory::kReady;
  policy_->insert(e, en.key_hash, en.stored);
  memory_present(e);
  // The disk copy is now redundant: first to go when the disk tier needs room.
  mem_clean_bytes_ += en.stored;
  table_.disk_unlink(e);
  table_.disk_push_back(e);
}

void Placement::fill_failed(int32_t e) {
  ChunkEntry& en = table_.at(e);
  mem_alloc_.free(en.mem_off);
  en.memory = ChunkEntry::Memory::kNone;
}

int32_t Placement::reserve(const ChunkKey& key, uint64_t hash, uint64_t size, uint64_t stored,
                           bool encoded) {
  const int32_t e = insert_entry(key, hash);
  if (e < 0) return -1;
  ChunkEntry& en = table_.at(e);
  en.size = size;
  en.stored = stored;
  en.encoded = encoded;
  en.memory = ChunkEntry::Memory::kAwaitingRoom;  // not evictable, not yet present
  return e;
}

void Placement::free_slot(uint64_t off) {
  mem_alloc_.free(off);
}

void Placement::begin_fill(int32_t e, uint64_t off) {
  ChunkEntry& en = table_.at(e);
  en.mem_off = off;
  en.memory = ChunkEntry::Memory::kFilling;
}

void Placement::await_room(int32_t e) {
  table_.at(e).memory = ChunkEntry::Memory::kAwaitingRoom;
}

void Placement::abandon(int32_t e) {
  table_.erase(e);
}

bool Placement::smaller_slot(uint64_t stored, uint64_t len, uint64_t* off) {
  return mem_alloc_.class_size(len) < mem_alloc_.class_size(stored) && mem_alloc_.alloc(len, off);
}

void Placement::encoded_into(int32_t e, uint64_t off, uint64_t len) {
  ChunkEntry& en = table_.at(e);
  en.mem_off = off;
  en.stored = len;
}

Status Placement::begin_reload(int32_t e, uint64_t off, uint64_t tag) {
  if ((tag & kSpillTag) != 0 || !disk_) {
    mem_alloc_.free(off);
    return Code::kInvalidValue;
  }
  begin_fill(e, off);
  const ChunkEntry& en = table_.at(e);
  Status st = disk_->read(en.disk_off, arena_at(off), en.stored, tag);
  if (!st.ok()) fill_failed(e);
  return st;
}

void Placement::count_hit(int32_t e) {
  ++table_.at(e).hits;
}

void Placement::begin_reading(int32_t e) {
  ++table_.at(e).readers;
}

void Placement::end_reading(int32_t e) {
  --table_.at(e).readers;
}

void Placement::read_done(int32_t e) {
  ChunkEntry& en = table_.at(e);
  if (en.replica_unread)
    en.replica_unread = false;
  else
    touch(e);
}

void Placement::drop_corrupt(int32_t e) {
  const ChunkEntry& en = table_.at(e);
  if (en.readers == 0 && !en.writing() && !en.filling()) drop_entry(e);
}

// ---------------------------------------------------------------- queries

uint32_t Placement::lookup(const ChunkKey* keys, uint32_t n, bool pin) {
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

void Placement::unpin(const ChunkKey* keys, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t e = table_.find(keys[i]);
    if (e >= 0 && table_.at(e).pins > 0) --table_.at(e).pins;
  }
}

bool Placement::contains(const ChunkKey& key) const {
  const int32_t e = table_.find(key);
  return e >= 0 && (table_.at(e).mem_ready() || table_.at(e).on_disk());
}

uint64_t Placement::chunk_size(const ChunkKey& key) const {
  const int32_t e = table_.find(key);
  return e >= 0 ? table_.at(e).size : 0;
}

Status Placement::remove(const ChunkKey& key) {
  const int32_t e = table_.find(key);
  if (e < 0) return Code::kNotFound;
  const ChunkEntry& en = table_.at(e);
  if (en.busy(monotonic_ns())) return Code::kBadState;
  drop_entry(e);
  return Code::kSuccess;
}

uint64_t Placement::clear(uint64_t model, uint32_t tenant) {
  uint64_t removed = 0;
  const uint64_t now = monotonic_ns();
  for (int32_t e = 0; e < static_cast<int32_t>(table_.capacity()); ++e) {
    const ChunkEntry& en = table_.at(e);
    if (!en.used || (model != 0 && en.key.model != model)) continue;
    if (tenant != 0 && key_tenant(en.key) != tenant) continue;
    if (en.busy(now)) continue;
    drop_entry(e);
    ++removed;
  }
  return removed;
}

// ---------------------------------------------------------------- tenants

TenantUsage& Placement::usage_of(const ChunkEntry& en) {
  return usage(key_tenant(en.key));
}

void Placement::set_tenant_quota(uint32_t tag, uint64_t memory_bytes, uint64_t disk_bytes) {
  TenantUsage& u = usage(tag);
  u.memory_quota = memory_bytes;
  u.disk_quota = disk_bytes;
}

TenantUsage Placement::tenant_usage(uint32_t tag) const {
  auto it = tenants_.find(tag);
  return it == tenants_.end() ? TenantUsage{} : it->second;
}

bool Placement::fit_tenant_memory(uint32_t tag, uint64_t size, int32_t keep) {
  TenantUsage& u = usage(tag);
  if (u.memory_quota == 0) return true;
  if (size > u.memory_quota) return false;  // its own chunks need not go for nothing
  struct Mine {
    const Placement* self;
    uint32_t tag;
    int32_t keep;
  } mine{this, tag, keep};
  while (u.memory_bytes + u.memory_filling + size > u.memory_quota) {
    const int32_t v = policy_->victim(
        [](const void* ctx, int32_t c) {
          const auto* m = static_cast<const Mine*>(ctx);
          return c != m->keep && key_tenant(m->self->table_.at(c).key) == m->tag &&
                 m->self->evictable(c);
        },
        &mine);
    if (v < 0) return false;  // the rest is pinned or in flight
    ++u.quota_evictions;
    ++st_->evictions;
    drop_memory(v);  // a copy on disk stays (the disk quota is its own)
  }
  return true;
}

// Before a write-back of the tenant's chunk `keep`: its own coldest disk copies go
// while its disk bytes plus size are over its quota. False if that cannot be.
bool Placement::fit_tenant_disk(uint32_t tag, uint64_t size, int32_t keep) {
  TenantUsage& u = usage(tag);
  if (u.disk_quota == 0) return true;
  if (size > u.disk_quota) return false;
  const uint64_t now = monotonic_ns();
  int32_t v = table_.disk_coldest();
  while (u.disk_bytes + size > u.disk_quota) {
    v = disk_victim_from(v, now, tag, keep);
    if (v < 0) return false;
    const int32_t victim = v;
    v = table_.disk_warmer(v);
    ++u.quota_evictions;
    evict_disk_copy(victim);
  }
  return true;
}

uint64_t Placement::index_bytes_per_chunk() const {
  return table_.bytes_per_chunk() + policy_->bytes_per_chunk();
}

// ---------------------------------------------------------------- sharing
//
// The cache's side of sharing chunks between agents: showing a chunk in place
// (locate) and taking in a chunk another party wrote into the arena (ingest). How
// bytes travel between agents (UCX, a PD push) lives in src/cluster; the cache
// never includes it.

Status Placement::locate(const ChunkKey& key, ChunkPlacement* out) {
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
  ++st_->located;
  return Code::kSuccess;
}

Status Placement::begin_ingest(const ChunkKey& key, const ChunkPlacement& p, bool encoded,
                               uint64_t queued, uint8_t** dst) {
  if (p.stored == 0 || p.size == 0 || dst == nullptr) return Code::kInvalidValue;
  if (p.stored > page_bytes_ || p.size > opts_.max_chunk_bytes) return Code::kTooBig;
  if (p.encoded != encoded) return Code::kNotSupported;  // stored as this cache stores
  if (!p.encoded && p.stored != p.size) return Code::kInvalidValue;
  if (table_.find(key) >= 0) return Code::kBadState;
  int32_t e = insert_entry(key, key.hash());
  uint64_t off = 0;
  if (e >= 0 && !make_room(p.stored, queued, &off)) {
    table_.erase(e);
    e = -1;
  }
  if (e < 0) {
    ++st_->ingest_rejects;
    return Code::kNoMemory;
  }
  ChunkEntry& en = table_.at(e);
  en.size = p.size;
  en.stored = p.stored;
  en.encoded = p.encoded;
  en.checksum = p.checksum;
  en.mem_off = off;
  en.memory = ChunkEntry::Memory::kIngesting;  // not evictable, not yet present
  *dst = arena_at(off);
  return Code::kSuccess;
}

Status Placement::end_ingest(const ChunkKey& key, bool bytes_ok) {
  const int32_t e = table_.find(key);
  if (e < 0 || table_.at(e).memory != ChunkEntry::Memory::kIngesting) return Code::kBadState;
  ChunkEntry& en = table_.at(e);
  const bool same = bytes_ok && chunk_checksum(arena_at(en.mem_off), en.stored) == en.checksum;
  if (!same) {
    if (bytes_ok) {
      ++st_->checksum_failures;
      LOG_WARN("cache: ingested chunk %s (%llu bytes) does not match its checksum; dropped",
               key_text(en.key).c_str(), static_cast<unsigned long long>(en.stored));
    }
    ++st_->ingest_rejects;
    fill_failed(e);
    table_.erase(e);
    room_freed();  // the room it held may be what a waiting store needs
    return bytes_ok ? Status(Code::kCorrupted) : Status(Code::kIoFailed);
  }
  en.memory = ChunkEntry::Memory::kReady;
  en.replica_unread = true;
  policy_->insert_cold(e, en.key_hash, en.stored);
  memory_present(e);
  ++st_->ingests;
  st_->ingest_bytes += en.size;
  table_.announce(e);
  return Code::kSuccess;
}

}  // namespace dpukv
