// The KV cache engine: an index of chunks over a memory tier (one exportable,
// pre-faulted arena) and an optional disk tier (tier/disk_tier.h), with an eviction
// policy (ARC, LRU or S3-FIFO: eviction_policies.h), pinning, checksums verified on every
// read, and store/retrieve pipelines that move bytes only through the DMA engine or
// a device copier (so a hardware backend can take over).
//
//   store:    caller's buffer --DMA(+xxh3)--> arena            [--io_uring--> disk]
//   retrieve: arena --DMA(+xxh3, verified)--> caller's buffer
//             disk --io_uring--> arena, then as above            (reload)
//   device:   GPU memory <--DeviceCopier (xxh3 where the copier takes it)--> arena
//
// A chunk whose bytes fail their checksum is dropped, counted, and reported as a
// miss (NOT_FOUND): never wrong bytes. Pinned chunks and chunks with I/O in flight
// are never evicted; the memory tier never holds more than its capacity.
//
// The engine is a façade over two parts, cut as LevelDB cuts DBImpl over MemTable
// and VersionSet: placement (placement.h: the chunk table, the policy, the tiers,
// room and write-back) and the request pipeline (request_pipeline.h: the request
// pool, the waiters, the per-state counts, advance()). The pipeline asks placement
// for room; placement tells the pipeline, through a callback this façade wires,
// when room may have come. The façade owns the counters both add to and sends
// each disk completion to the part whose I/O it was.
//
// Threading: a Context on one progress engine; every call and callback on its thread.
// lookup/contains/remove/unpin answer at once (index operations); store, retrieve
// and prefetch complete through their callback.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_options.h"
#include "cache/chunk_table.h"
#include "cache/placement.h"
#include "cache/request_pipeline.h"
#include "engines/device_copier.h"
#include "protocol/chunk_key.h"
#include "runtime/context.h"

namespace dpukv {

class CacheEngine final : public Context {
 public:
  using DoneCb = void (*)(void* arg, Status st);

  // The memory tier's slot size for these options: max_chunk_bytes, or with
  // compress the codec's worst case for it (a little more). The tier must hold one.
  static uint64_t slot_bytes(const CacheOptions& o);
  static Status create(ProgressEngine* pe, const CacheOptions& o,
                       std::unique_ptr<CacheEngine>* out);
  ~CacheEngine() override;

  // Stores src's data section under key. SUCCESS through cb once the bytes are in
  // the memory tier (the index then serves them); NO_MEMORY if nothing can be
  // evicted; an existing key completes at once with SUCCESS (chunks are immutable).
  // The engine holds a reference on src (and on dst in retrieve) until cb: the
  // caller may drop its own reference after the call, but must not change the
  // bytes or the buffer before cb.
  Status store(const ChunkKey& key, Buf* src, DoneCb cb, void* arg);
  // Copies the chunk after dst's data. NOT_FOUND for a miss or a chunk that failed
  // its checksum; TOO_BIG if dst has less room than the chunk.
  Status retrieve(const ChunkKey& key, Buf* dst, DoneCb cb, void* arg);
  // The same for device (GPU) memory the copier reaches: the chunk takes the same
  // path through the tiers (room, eviction, reload from disk, pins, checksums), and
  // only the copy between the arena and the caller's memory is the copier's. The
  // checksum of a stored chunk is taken from the arena once the bytes landed; a
  // retrieve hashes the arena copy while the device copy runs and reports a
  // mismatch as a miss, as store/retrieve do. Chunks go in unencoded (the codec
  // runs on host bytes); an encoded chunk is NOT_SUPPORTED for retrieve_device,
  // and the caller falls back to a host buffer. NOT_SUPPORTED: no copier.
  void set_device_copier(DeviceCopier* c) { pipeline_.set_device_copier(c); }
  // Requests the engine can still take (of CacheOptions::max_requests).
  size_t requests_free() const { return pipeline_.requests_free(); }
  const CacheOptions& options() const { return opts_; }
  Status store_device(const ChunkKey& key, const DeviceRange& src, DoneCb cb, void* arg);
  Status retrieve_device(const ChunkKey& key, const DeviceRange& dst, DoneCb cb, void* arg);
  // Brings a disk-only chunk into memory ahead of a retrieve.
  Status prefetch(const ChunkKey& key, DoneCb cb, void* arg);

  // Number of leading keys present (memory or disk). With pin, those chunks stay
  // until unpin() or pin_timeout_ms.
  uint32_t lookup(const ChunkKey* keys, uint32_t n, bool pin);
  void unpin(const ChunkKey* keys, uint32_t n);
  bool contains(const ChunkKey& key) const;
  Status remove(const ChunkKey& key);  // BAD_STATE while in use
  // Drops every chunk of model (0: of every model) and tenant (a tag,
  // protocol/tenant_key.h; 0: of every tenant) that is not in use or pinned;
  // returns how many.
  uint64_t clear(uint64_t model = 0, uint32_t tenant = 0);
  // Tenants' shares of the tiers (cache/placement.h): quotas in bytes, 0: none.
  void set_tenant_quota(uint32_t tag, uint64_t memory_bytes, uint64_t disk_bytes) {
    placement_.set_tenant_quota(tag, memory_bytes, disk_bytes);
  }
  TenantUsage tenant_usage(uint32_t tag) const { return placement_.tenant_usage(tag); }
  // Size of a stored chunk, or 0.
  uint64_t chunk_size(const ChunkKey& key) const;

  // Sharing with other agents. The cache knows nothing of how
  // bytes travel between agents; it shows a chunk in place and takes one in.
  //
  // The arena: what a transport exposes for one-sided reads.
  void arena(void** base, uint64_t* len) const;
  // A memory-resident chunk, pinned as lookup(pin) pins (release with unpin()).
  // AGAIN: only on disk (prefetch() it, then ask again); NOT_FOUND: absent.
  Status locate(const ChunkKey& key, ChunkPlacement* out);
  // Room in the arena for a chunk that another party writes there (*dst, p.stored
  // bytes); the key is not present until end_ingest. ALREADY present: BAD_STATE;
  // NO_MEMORY when nothing can be evicted now; NOT_SUPPORTED for an encoded chunk
  // without the codec; TOO_BIG beyond max_chunk_bytes.
  Status begin_ingest(const ChunkKey& key, const ChunkPlacement& p, uint8_t** dst);
  // bytes_ok: the writer says the bytes landed. The chunk is present only if they
  // also match p.checksum (CORRUPTED otherwise); every other outcome frees the room.
  Status end_ingest(const ChunkKey& key, bool bytes_ok);
  // Listeners told when a chunk becomes present (memory or disk) and when it
  // leaves every tier, on the engine's thread; with replay, a new listener is
  // first told of every chunk present now. Listeners must not add or remove
  // listeners from the callback.
  using ResidencyCb = ChunkTable::ResidencyCb;
  void add_residency_listener(ResidencyCb cb, void* arg, bool replay);
  void remove_residency_listener(ResidencyCb cb, void* arg);

  CacheStats stats() const;
  uint64_t index_bytes_per_chunk() const;
  Status sync();  // flushes the disk log

 private:
  CacheEngine(ProgressEngine* pe, const CacheOptions& o);
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override;
  static void room_freed(void* self);

  struct DiskWatcher final : FdWatcher {
    void on_fd_ready(uint32_t) override {}  // poll() reaps the ring
  } disk_watch_;
  bool disk_watched_ = false;
  CacheOptions opts_;
  CacheStats st_;  // both parts add to it
  Placement placement_;
  RequestPipeline pipeline_;
};

}  // namespace dpukv
