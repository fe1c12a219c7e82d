// The cache's request pipeline: one Request per store, retrieve or prefetch in
// flight, each an explicit state machine. advance() is the one place a request
// moves on: each completion (DMA, codec, device copy, disk read) leaves its result
// in the request, and the state says what the request was waiting for, and so
// what comes next. Every state change goes through set_state(), which keeps the
// count per state that stat and Prometheus show.
//
// The pipeline owns the request pool, the engines that move a client's bytes (DMA,
// compress, a device copier) and the requests waiting for room. Where a chunk
// goes, and what leaves to make room, is placement's (placement.h): the pipeline
// asks it, and a request that finds no room waits until placement says room may
// have come (retry_waiting).
//
// Contract:
// - A request holds its chunk's entry in a state that keeps it from eviction:
//   AwaitingRoom or Filling for a store or reload, a reader for a retrieve.
// - A chunk whose bytes fail their checksum on the way out is dropped, counted,
//   and reported as a miss (NOT_FOUND): never wrong bytes.
// - Every accepted request completes through its callback exactly once, SHUTDOWN
//   when the owner stops while it waits.
//
// Threading: the owner's progress thread only (CacheEngine's).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/cache_options.h"
#include "cache/placement.h"
#include "engines/compress/compress_engine.h"
#include "engines/device_copier.h"
#include "engines/dma/dma_engine.h"
#include "protocol/chunk_key.h"
#include "runtime/context.h"

namespace dpukv {

// What a request does.
enum class RequestKind : uint8_t { kStore, kRetrieve, kPrefetch };
// What a request waits for.
enum class RequestState : uint8_t {
  kFree,
  kWaitRoom,  // waiting for room: a write-back to land, a copy to finish
  kDma,       // a DMA (with checksum) or a device copy is moving the bytes
  kDiskRead,  // reloading from disk into the arena
  kEncode,    // the compress engine encodes the client's bytes into the arena
  kShrink,    // the DMA moves the encoded chunk to a slot of its own size
  kDecode,    // the compress engine decodes the arena copy into the client's buffer
  kDone,      // finished
};

class RequestPipeline {
 public:
  using DoneCb = void (*)(void* arg, Status st);

  // owner: whose state (running, stopping) the requests follow; its progress
  // engine runs the DMA and compress engines. st: counters this part adds to.
  RequestPipeline(Context* owner, const CacheOptions& o, Placement* placement, CacheStats* st);
  ~RequestPipeline();
  RequestPipeline(const RequestPipeline&) = delete;
  RequestPipeline& operator=(const RequestPipeline&) = delete;
  Status init(ProgressEngine* pe);
  Status start();
  void stop();  // waiting requests finish with SHUTDOWN; engines flush theirs
  bool idle() const;

  void set_device_copier(DeviceCopier* c) { device_ = c; }
  bool has_codec() const { return codec_ != nullptr; }
  size_t requests_free() const { return free_requests_.size(); }
  // Memory the waiting requests need (placement serves them first).
  uint64_t room_wanted() const { return room_wanted_bytes_; }

  Status store(const ChunkKey& key, Buf* src, DoneCb cb, void* arg);
  Status store_device(const ChunkKey& key, const DeviceRange& src, DoneCb cb, void* arg);
  Status retrieve(const ChunkKey& key, Buf* dst, DoneCb cb, void* arg);
  Status retrieve_device(const ChunkKey& key, const DeviceRange& dst, DoneCb cb, void* arg);
  Status prefetch(const ChunkKey& key, DoneCb cb, void* arg);

  // A disk read (a reload) landed; tag is the request's.
  void reload_done(uint64_t tag, Status st, int err);
  // Room may have come: requests waiting for it try again.
  void retry_waiting();

  uint32_t disk_reads() const { return disk_reads_; }
  // Requests now in each working state (kWaitRoom through kDecode), by state.
  uint32_t in_state(RequestState s) const { return per_state_[static_cast<size_t>(s)]; }

 private:
  struct Request {
    RequestKind kind = RequestKind::kStore;
    RequestState state = RequestState::kFree;
    int32_t entry = -1;
    ChunkKey key;
    Buf* user = nullptr;
    bool device = false;  // the caller's memory is dev (a DeviceCopier region), not user
    DeviceRange dev;
    Buf* arena_buf = nullptr;
    Buf* arena_buf2 = nullptr;      // the final slot while shrinking
    uint64_t big_off = UINT64_MAX;  // the encode slot while shrinking
    uint64_t tenant_charge = 0;     // memory held against its tenant's quota while filling
    DoneCb cb = nullptr;
    void* arg = nullptr;
    Status result;              // of the last engine operation (DMA, codec, disk I/O)
    uint64_t result_value = 0;  // its checksum (DMA) or output length (codec)
    int result_errno = 0;       // of a failed disk read
    uint32_t index = 0;
    RequestPipeline* owner = nullptr;  // for callbacks that carry only the request
  };
  static constexpr size_t kStates = static_cast<size_t>(RequestState::kDone) + 1;

  void set_state(Request* r, RequestState state);
  Request* new_request();
  Status accept(RequestKind kind, const ChunkKey& key, Buf* user, DoneCb cb, void* arg,
                Request** out);
  void finish(Request* r, Status st);
  bool stopping() const { return owner_->state() == CtxState::kStopping; }
  bool room_may_come() const;
  bool wait_for_engine(Request* r, Status st);  // true: r waits for a ring slot
  void release_arena_bufs(Request* r);
  void release_tenant_charge(Request* r);
  void wait_for_room(Request* r, uint64_t bytes);

  Status begin_store_request(Request* r, uint64_t size);
  void begin_store(Request* r);
  void after_encode(Request* r, Status st, uint64_t out_len);
  void complete_store(Request* r, uint64_t checksum);
  void begin_retrieve_request(Request* r, uint64_t room);
  void begin_read(Request* r);
  void after_copy(Request* r, Status st, uint64_t checksum);
  void finish_read(Request* r, Status st, bool corrupted);
  Status start_reload(Request* r);
  void after_reload(Request* r, Status st);
  void resume_waiting(Request* r);
  void advance(Request* r);

  Status start_dma(Request* r, Buf* src, Buf* dst);
  Status start_codec(Request* r, CompressTask::Op op, Buf* src, Buf* dst);
  Status start_device_copy(Request* r, bool to_device);
  static void dma_done(DmaMemcpyTask* t, UserData task_ud, UserData ctx_ud);
  static void codec_done(CompressTask* t, UserData task_ud, UserData ctx_ud);
  static void device_done(void* arg, Status st);

  Context* owner_;
  CacheOptions opts_;
  Placement* placement_;
  const ChunkTable& table_;  // placement's, read-only: its verbs change a chunk's state
  CacheStats* st_;
  std::unique_ptr<DmaEngine> dma_;
  std::unique_ptr<CompressEngine> codec_;
  DeviceCopier* device_ = nullptr;
  std::unique_ptr<BufInventory> inv_;
  std::vector<Request> requests_;
  std::vector<Request*> free_requests_;
  std::vector<Request*> waiting_;   // requests waiting for room (a spill or a copy to land)
  std::vector<Request*> retrying_;  // waiting_'s previous contents while they are retried
  uint64_t room_wanted_bytes_ = 0;  // memory the requests in waiting_ need
  uint32_t per_state_[kStates] = {};
  uint32_t engine_ops_ = 0;  // DMA, codec and device copies in flight
  uint32_t disk_reads_ = 0;  // reloads in flight
};

}  // namespace dpukv
