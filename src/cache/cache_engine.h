// The KV cache engine: an index of chunks over a memory tier (one exportable,
// pre-faulted arena) and an optional disk tier (tier/disk_tier.h), with an eviction
// policy (LRU or S3-FIFO: eviction_policy.h), pinning, checksums verified on every
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
// Threading: a Context on one progress engine; every call and callback on its thread.
// lookup/contains/remove/unpin answer at once (index operations); store, retrieve
// and prefetch complete through their callback.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/chunk_table.h"
#include "cache/eviction_policy.h"
#include "cache/tier/disk_tier.h"
#include "cache/tier/slab_allocator.h"
#include "engines/compress/compress_engine.h"
#include "engines/device_copier.h"
#include "engines/dma/dma_engine.h"
#include "protocol/chunk_key.h"
#include "runtime/context.h"
#include "runtime/mem_region.h"
#include "runtime/mmap.h"

namespace dpukv {

struct CacheOptions {
  uint64_t memory_bytes = 1ull << 30;      // memory tier capacity
  uint64_t max_chunk_bytes = 64ull << 20;  // largest chunk (allocator page size)
  uint32_t max_chunks = 1u << 20;          // index capacity
  uint32_t max_requests = 1024;            // store/retrieve/prefetch in flight
  std::string disk_dir;                    // empty: no disk tier
  uint64_t disk_bytes = 0;
  // The NVMe tier: the disk tier's data on an NVMe/TCP namespace ("ADDR:PORT" and
  // subsystem NQN) instead of a local file; the index log stays in disk_dir.
  std::string nvme_address, nvme_nqn;
  bool write_through = false;    // disk tier: write every stored chunk at once (else on eviction)
  uint32_t disk_admit_hits = 0;  // only chunks hit at least this often go to disk
  uint32_t pin_timeout_ms = 30000;  // lookup pins expire after this
  DmaOptions dma;                   // the engine's DMA context
  // Encode chunks with the lossless KV codec on the compress engine before they
  // enter the memory tier (decoded on retrieve). Chunks are taken as bf16 values.
  bool compress = false;
  uint32_t compress_threads = 1;
  // Eviction: LRU, or S3-FIFO (a small FIFO for new chunks, a main FIFO with
  // reinsertion for chunks hit again, and a ghost list of recent small-queue
  // evictions; Yang et al., SOSP 2023).
  std::string policy = "lru";  // a name of eviction_policies()
};

// The working states of a request (CacheEngine's Request::State, WaitRoom through
// Decode), as named in stat and in Prometheus.
inline constexpr size_t kRequestStates = 7;
inline constexpr const char* kRequestStateNames[kRequestStates] = {
    "cache_requests_wait_room",  "cache_requests_dma",    "cache_requests_disk_read",
    "cache_requests_disk_write", "cache_requests_encode", "cache_requests_shrink",
    "cache_requests_decode"};
inline constexpr const char* kRequestStateMetrics[kRequestStates] = {
    "dpukv_cache_requests_wait_room", "dpukv_cache_requests_dma",
    "dpukv_cache_requests_disk_read", "dpukv_cache_requests_disk_write",
    "dpukv_cache_requests_encode",    "dpukv_cache_requests_shrink",
    "dpukv_cache_requests_decode"};

struct CacheStats {
  uint64_t chunks = 0, memory_chunks = 0, disk_chunks = 0;
  uint64_t memory_used = 0, memory_capacity = 0, disk_used = 0, disk_capacity = 0;
  uint64_t stores = 0, store_bytes = 0, retrieves = 0, retrieve_bytes = 0;
  uint64_t hits = 0, misses = 0, evictions = 0, spills = 0, reloads = 0;
  uint64_t checksum_failures = 0, io_errors = 0, recovered = 0, store_rejects = 0;
  uint64_t disk_evictions = 0;      // chunks dropped from the disk tier to make room
  uint64_t disk_log_errors = 0;     // index log records that could not be written
  uint64_t both_chunks = 0;         // chunks with a copy in each tier (counted once in chunks)
  uint64_t disk_ios_in_flight = 0;  // disk tier reads and writes under way now
  uint64_t requests_in_state[kRequestStates] = {};       // requests in each working state now
  uint64_t encoded_bytes_in = 0, encoded_bytes_out = 0;  // compression on store
  uint64_t ingests = 0, ingest_bytes = 0;                // chunks filled by another agent (ingest)
  uint64_t ingest_rejects = 0;                           // ingests refused (no room) or failed
  uint64_t located = 0;                                  // chunks shown in place to another agent
  uint64_t landed_mismatches = 0;  // device reads whose landed bytes differed; chunk intact
};

// Where a memory-resident chunk lies in the arena, and what a copy of it must be
// to be the same chunk: what another agent needs to read it one-sided and check it.
struct ChunkPlacement {
  uint64_t offset = 0;    // in the arena
  uint64_t stored = 0;    // bytes in the arena (encoded size, or size)
  uint64_t size = 0;      // bytes as the client gave them
  uint64_t checksum = 0;  // xxh3-64 of the stored bytes
  bool encoded = false;   // stored with the lossless KV codec
};

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
  void set_device_copier(DeviceCopier* c) { device_ = c; }
  // Requests accept() can still take (of CacheOptions::max_requests).
  size_t requests_free() const { return free_requests_.size(); }
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
  // Drops every chunk of model (0: of every model) that is not in use or pinned;
  // returns how many.
  uint64_t clear(uint64_t model = 0);
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
  struct Request;
  // What a request does (Request in cache_requests.h).
  enum class RequestKind : uint8_t { kStore, kRetrieve, kPrefetch, kSpill };
  // What a request waits for.
  enum class RequestState : uint8_t {
    kFree,
    kWaitRoom,   // waiting for a spill to free memory
    kDma,        // a DMA (with checksum) is moving the bytes
    kDiskRead,   // reloading from disk into the arena
    kDiskWrite,  // spilling from the arena to disk
    kEncode,     // the compress engine encodes the client's bytes into the arena
    kShrink,     // the DMA moves the encoded chunk to a slot of its own size
    kDecode,     // the compress engine decodes the arena copy into the client's buffer
    kDone,       // finished
  };
  CacheEngine(ProgressEngine* pe, const CacheOptions& o);
  Status init();
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override;

  // Placement: which chunk leaves a tier, and room in each (cache_engine.cc).
  void touch(int32_t e);  // a chunk was used
  int32_t pick_victim();
  int32_t pick_index_victim();
  bool make_disk_room(uint64_t size, uint64_t* off);
  void drop_disk_copy(int32_t e);

  bool make_room(uint64_t size, uint64_t* off);
  void drop_memory(int32_t e);
  void drop_entry(int32_t e);
  bool evictable(int32_t e) const;
  enum class SpillStart { kStarted, kBusy, kRefused };  // kBusy: retry after a completion
  SpillStart start_spill(int32_t e);
  bool spilling_allowed() const;
  bool room_may_come() const;
  void wait_for_room(Request* r, uint64_t bytes);
  // Every state change goes through here: it keeps the count per state.
  void set_state(Request* r, RequestState state);  // bytes: memory it needs (0: none)
  void disk_failed(const char* what, int err);
  Request* new_request();
  Status accept(RequestKind kind, const ChunkKey& key, Buf* user, DoneCb cb, void* arg,
                Request** out);
  void finish(Request* r, Status st);
  Status start_dma(Request* r, Buf* src, Buf* dst);
  Status start_device_copy(Request* r, bool to_device);
  static void device_done(void* arg, Status st);
  Status begin_store_request(Request* r, uint64_t size);
  void begin_retrieve_request(Request* r, uint64_t room);
  void begin_store(Request* r);
  Status start_codec(Request* r, CompressTask::Op op, Buf* src, Buf* dst);
  void after_encode(Request* r, Status st, uint64_t out_len);
  void complete_store(Request* r, uint64_t checksum);
  void finish_read(Request* r, Status st, bool corrupted);
  void begin_read(Request* r);
  static void codec_done(CompressTask* t, UserData task_ud, UserData ctx_ud);
  Status start_reload(Request* r);
  void after_copy(Request* r, Status st, uint64_t checksum);
  void clean_ahead();
  void after_spill(Request* r, Status st);
  void after_reload(Request* r, Status st);
  void retry_waiting();
  void resume_waiting(Request* r);
  void advance(Request* r);  // a completion or a retry: the state says what comes next
  static void dma_done(DmaMemcpyTask* t, UserData task_ud, UserData ctx_ud);

  CacheOptions opts_;
  uint64_t page_bytes_ = 0;  // allocator page: the largest slot a chunk may need
  std::unique_ptr<MemRegion> arena_;
  std::unique_ptr<Mmap> arena_map_;
  SlabAllocator mem_alloc_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<DmaEngine> dma_;
  DeviceCopier* device_ = nullptr;
  std::unique_ptr<CompressEngine> codec_;
  std::unique_ptr<BufInventory> inv_;
  struct DiskWatcher final : FdWatcher {
    CacheEngine* owner = nullptr;
    void on_fd_ready(uint32_t) override {}
  } disk_watch_;

  ChunkTable table_;                          // every chunk, its copies' states, the disk queue
  std::unique_ptr<EvictionPolicy> policy_;    // memory-resident chunks
  static constexpr uint32_t kMaxSpills = 16;  // write-backs in flight
  static constexpr uint64_t kSpillBackoffNs = 1000000000ull;
  // Disk reads and writes whose completion the engine has not handled yet (the
  // tier's own count drops when a batch is reaped, before each is handled).
  uint32_t disk_ios_ = 0;
  uint32_t requests_per_state_[kRequestStates + 2] = {};  // [State]: Free and Done too
  uint32_t engine_ops_ = 0;                               // DMA and codec tasks in flight
  int last_io_errno_ = 0;             // errno of the disk completion being handled
  uint64_t mem_clean_bytes_ = 0;      // memory held by chunks that also have a disk copy
  uint64_t spill_bytes_ = 0;          // memory being written back
  uint64_t evict_pending_bytes_ = 0;  // memory freed when the writes under way land
  uint64_t room_wanted_bytes_ = 0;    // memory the requests in waiting_ need
  uint64_t spill_off_until_ns_ = 0;   // writing back stopped until then (after an error)
  uint64_t last_disk_log_ns_ = 0, disk_errors_unlogged_ = 0;
  std::vector<Request> requests_;
  std::vector<Request*> free_requests_;
  std::vector<Request*> waiting_;   // requests waiting for room (a spill or a copy to land)
  std::vector<Request*> retrying_;  // waiting_'s previous contents while they are retried
  CacheStats st_;
};

}  // namespace dpukv
