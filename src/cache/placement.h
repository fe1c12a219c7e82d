// Where the cache's chunks are: the chunk table (one entry per chunk and the
// states of its copies), the memory tier (one exportable arena carved by a slab
// allocator) with its eviction policy, and the optional disk tier with the
// write-backs that fill it. Placement decides which chunk leaves a tier, finds
// room in each, and moves bytes only between its own tiers (write-back); a
// client's bytes are the request pipeline's to move (request_pipeline.h).
//
// Placement owns the chunks' state: others read it through const views (table(),
// memory(), disk()) and change it only through the verbs below, one per step of a
// chunk's life (reserve, begin_fill, store_landed, begin_reload, abandon, ...), as
// LevelDB's VersionSet alone edits its file lists. The arena's bytes are lent to
// the pipeline's copies (arena_map, arena_at): what they hold is the clients'.
//
// Contract:
// - The memory tier never holds more than its capacity; pinned chunks and chunks
//   with a copy under way (filling, read, written back) are never evicted.
// - make_room() either hands out room or says to wait: write-backs it started (or
//   that are under way) will free memory, and the room listener is told when one
//   lands, as when a failed ingest gives its room back.
// - Write-backs are paced (clean_ahead) and at most kMaxSpills are in flight; a
//   disk that fails stops them for a second and the chunks stay in memory.
//   Write-through chunks that find no slot wait in the write queue and are
//   written, oldest first, as slots free: a store is never skipped.
// - Disk completions for write-backs come back through spill_done() (their tags
//   have kSpillTag set; other tags are the pipeline's reloads).
//
// Threading: the owner's progress thread only (CacheEngine's).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "cache/cache_options.h"
#include "cache/chunk_table.h"
#include "cache/eviction_policy.h"
#include "cache/tier/disk_tier.h"
#include "cache/tier/slab_allocator.h"
#include "protocol/chunk_key.h"
#include "runtime/mem_region.h"
#include "runtime/mmap.h"

namespace dpukv {

class Placement {
 public:
  static constexpr uint32_t kMaxSpills = 16;            // write-backs in flight
  static constexpr uint64_t kSpillTag = 1ull << 63;     // a disk tag that is a write-back's
  enum class SpillStart { kStarted, kBusy, kRefused };  // kBusy: retry after a completion

  // The memory tier's slot size for these options: max_chunk_bytes, or with
  // compress the codec's worst case for it (a little more).
  static uint64_t slot_bytes(const CacheOptions& o);
  // st: the counters this part adds to (owned by the cache engine, which shows them).
  Placement(const CacheOptions& o, CacheStats* st);
  ~Placement();
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;
  // The arena, its allocator and policy, the disk tier and the chunks it recovered.
  Status init();

  // Told (on the owner's thread) when memory may have been freed for waiters.
  void set_room_listener(void (*cb)(void* arg), void* arg) {
    room_cb_ = cb;
    room_arg_ = arg;
  }

  // ---- read-only views of placement's state
  const ChunkTable& table() const { return table_; }
  const SlabAllocator& memory() const { return mem_alloc_; }
  const DiskTier* disk() const { return disk_.get(); }
  // ---- the arena, lent to the pipeline's copies
  Mmap* arena_map() const { return arena_map_.get(); }
  uint8_t* arena_at(uint64_t off) const { return static_cast<uint8_t*>(arena_->data()) + off; }
  void arena(void** base, uint64_t* len) const;
  // The allocator's page: the largest slot a chunk may need.
  uint64_t page_bytes() const { return page_bytes_; }

  // ---- the disk tier's ring: one for write-backs (placement's, kSpillTag) and
  // reloads (the pipeline's); the owner polls it and hands each completion on.
  int disk_event_fd() const { return disk_ ? disk_->event_fd() : -1; }
  size_t poll_disk(DiskTier::Completion* out, size_t max) {
    return disk_ ? disk_->poll(out, max) : 0;
  }
  uint32_t disk_inflight() const { return disk_ ? disk_->inflight() : 0; }
  Status sync_disk() { return disk_ ? disk_->sync() : Status(); }

  // ---- the residency feed (chunk_table.h)
  void add_residency_listener(ChunkTable::ResidencyCb cb, void* arg, bool replay) {
    table_.add_listener(cb, arg, replay);
  }
  void remove_residency_listener(ChunkTable::ResidencyCb cb, void* arg) {
    table_.remove_listener(cb, arg);
  }

  // ---- a chunk's life, one verb per step (the request pipeline's)
  // A store: an entry held for a new chunk of `size` bytes taking `stored` in the
  // tiers (encoded: stored with the codec), awaiting room; evicts from every tier
  // while the index is full; -1 if nothing can go.
  int32_t reserve(const ChunkKey& key, uint64_t hash, uint64_t size, uint64_t stored, bool encoded);
  // Memory for size bytes, evicting (or writing back first) as needed. queued:
  // what requests waiting before this one need of the room already coming. False:
  // no room now (it may come: wait for the room listener, or give up).
  bool make_room(uint64_t size, uint64_t queued, uint64_t* off);
  void free_slot(uint64_t off);  // a slot from make_room or smaller_slot, unused
  // A store's copy into the slot at off (from make_room) begins.
  void begin_fill(int32_t e, uint64_t off);
  // A reserved store waits again (for room or an engine), holding no slot.
  void await_room(int32_t e);
  // A reserved store that will not land: its entry goes (it never was present).
  void abandon(int32_t e);
  // An encoded chunk's slot of its own size, when its size class is below the
  // worst-case slot it was encoded into (stored bytes); false if none.
  bool smaller_slot(uint64_t stored, uint64_t len, uint64_t* off);
  // The chunk's encoded bytes, len of them, are (or are being copied) at off.
  void encoded_into(int32_t e, uint64_t off, uint64_t len);
  // A copy into the arena landed: the chunk is present, with this checksum.
  void store_landed(int32_t e, uint64_t checksum);
  // A disk-only chunk is read back into the slot at off (from make_room); the
  // completion comes with `tag` (no kSpillTag). On failure the slot goes back.
  Status begin_reload(int32_t e, uint64_t off, uint64_t tag);
  // A reload from disk landed: the chunk is in memory again.
  void reload_landed(int32_t e);
  // A copy into the arena failed or was abandoned: its room goes back.
  void fill_failed(int32_t e);
  // A retrieve found the chunk (it counts toward disk admission).
  void count_hit(int32_t e);
  // A copy out of the memory copy starts and ends: it is not evicted meanwhile.
  void begin_reading(int32_t e);
  void end_reading(int32_t e);
  // A read succeeded: the chunk is recent, unless it is an ingested replica read
  // for the first time (another agent holds it; this copy goes first).
  void read_done(int32_t e);
  // A copy failed its checksum: the chunk goes once nothing else uses it.
  void drop_corrupt(int32_t e);

  // ---- chunks leaving
  void touch(int32_t e);  // a chunk was used
  bool evictable(int32_t e) const;
  void drop_memory(int32_t e);  // its memory copy goes; a disk-only chunk stays
  void drop_entry(int32_t e);   // the chunk leaves every tier

  // ---- write-back
  SpillStart start_spill(int32_t e);
  // Write-through: the chunk goes to disk now, or waits in the write queue for a
  // write-back slot (or for a failed disk's pause to end); it is never skipped.
  void write_through(int32_t e);
  uint64_t writes_waiting() const { return table_.write_queue_length(); }
  void clean_ahead();  // write back cold chunks ahead of need (a watermark)
  void spill_done(uint64_t tag, Status st, int err);
  uint32_t spills_in_flight() const { return spills_in_flight_; }
  void disk_failed(const char* what, int err);

  // ---- queries (CacheEngine's)
  uint32_t lookup(const ChunkKey* keys, uint32_t n, bool pin);
  void unpin(const ChunkKey* keys, uint32_t n);
  bool contains(const ChunkKey& key) const;
  uint64_t chunk_size(const ChunkKey& key) const;
  Status remove(const ChunkKey& key);
  uint64_t clear(uint64_t model, uint32_t tenant);

  // ---- tenants: each tag's bytes in each tier and its quotas. A tenant over its
  // quota loses its own coldest chunks, never another tenant's: before a store
  // takes room and when a chunk lands (memory), before a write-back (disk).
  void set_tenant_quota(uint32_t tag, uint64_t memory_bytes, uint64_t disk_bytes);
  TenantUsage tenant_usage(uint32_t tag) const;
  // Evicts the tenant's own coldest chunks (never `keep`) while its memory (present
  // and filling) plus `size` is over its quota; false if what is left is pinned or
  // in flight and it still does not fit.
  bool fit_tenant_memory(uint32_t tag, uint64_t size, int32_t keep);
  // A store's slot, held against its tenant's quota from room taken to landing.
  // Only tenants with a memory quota are charged (the pipeline asks): the others'
  // stores cost no bookkeeping beyond their landing.
  bool has_memory_quota(uint32_t tag) { return usage(tag).memory_quota != 0; }
  void charge_fill(uint32_t tag, uint64_t bytes) { usage(tag).memory_filling += bytes; }
  void release_fill(uint32_t tag, uint64_t bytes) { usage(tag).memory_filling -= bytes; }
  uint64_t index_bytes_per_chunk() const;

  // ---- sharing (CacheEngine's)
  Status locate(const ChunkKey& key, ChunkPlacement* out);
  // encoded: how this cache stores chunks; queued: as for make_room.
  Status begin_ingest(const ChunkKey& key, const ChunkPlacement& p, bool encoded, uint64_t queued,
                      uint8_t** dst);
  Status end_ingest(const ChunkKey& key, bool bytes_ok);

 private:
  // An entry for a new chunk, evicting from every tier while the index is full;
  // -1 if nothing can go.
  int32_t insert_entry(const ChunkKey& key, uint64_t hash);
  struct Spill {
    int32_t entry = -1;
    uint64_t disk_off = 0;
  };
  int32_t pick_victim();
  int32_t pick_index_victim();
  bool make_disk_room(uint64_t size, uint64_t* off);
  int32_t disk_victim_from(int32_t v, uint64_t now, uint32_t tag, int32_t keep) const;
  void evict_disk_copy(int32_t victim);
  bool fit_tenant_disk(uint32_t tag, uint64_t size, int32_t keep);
  TenantUsage& usage_of(const ChunkEntry& en);
  // A tag's entry (made on first use). One tenant's stores come in runs: the last
  // tag's entry is kept at hand (entries are never erased, so it stays valid).
  TenantUsage& usage(uint32_t tag) {
    if (tag != last_tag_ || last_usage_ == nullptr) {
      last_usage_ = &tenants_[tag];
      last_tag_ = tag;
    }
    return *last_usage_;
  }
  void memory_present(int32_t e);  // a chunk's bytes count in memory from now
  void drop_disk_copy(int32_t e);
  bool spilling_allowed() const;
  void drain_write_queue();
  void room_freed() {
    if (room_cb_ != nullptr) room_cb_(room_arg_);
  }

  static constexpr uint64_t kSpillBackoffNs = 1000000000ull;
  CacheOptions opts_;
  CacheStats* st_;
  uint64_t page_bytes_ = 0;
  std::unique_ptr<MemRegion> arena_;
  std::unique_ptr<Mmap> arena_map_;
  SlabAllocator mem_alloc_;
  std::unique_ptr<DiskTier> disk_;
  ChunkTable table_;                        // every chunk, its copies' states, the disk queue
  std::unique_ptr<EvictionPolicy> policy_;  // memory-resident chunks
  Spill spills_[kMaxSpills];
  uint32_t free_spills_[kMaxSpills] = {};
  uint32_t spills_in_flight_ = 0;
  uint64_t mem_clean_bytes_ = 0;      // memory held by chunks that also have a disk copy
  uint64_t spill_bytes_ = 0;          // memory being written back
  uint64_t evict_pending_bytes_ = 0;  // memory freed when the writes under way land
  uint64_t spill_off_until_ns_ = 0;   // writing back stopped until then (after an error)
  uint64_t last_disk_log_ns_ = 0, disk_errors_unlogged_ = 0;
  std::unordered_map<uint32_t, TenantUsage> tenants_;  // by tag
  uint32_t last_tag_ = 0;
  TenantUsage* last_usage_ = nullptr;
  void (*room_cb_)(void*) = nullptr;
  void* room_arg_ = nullptr;
};

}  // namespace dpukv
