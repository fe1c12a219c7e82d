// The cache engine's request pipeline: one Request per store, retrieve, prefetch
// or spill in flight, an explicit state machine (RequestState in cache_engine.h)
// driven by cache_requests.cc, where advance() takes a request from one state to
// the next on each completion or retry. Every state change goes through
// set_state(), which keeps the count per state that stat and Prometheus show.
// A request holds its chunk's entry (ChunkTable) in a state that keeps it from
// eviction: AwaitingRoom or Filling for a store or reload, a reader for a
// retrieve, Writing (and a reader) for a spill. Internal to src/cache: cache_engine.cc (life
// cycle, queries, placement, sharing) and cache_requests.cc include it.
#pragma once

#include "cache/cache_engine.h"

namespace dpukv {

// One store, retrieve, prefetch or spill in flight: an explicit state machine.
struct CacheEngine::Request {
  using Kind = RequestKind;
  using State = RequestState;
  static_assert(static_cast<size_t>(State::kDecode) - static_cast<size_t>(State::kWaitRoom) + 1 ==
                    kRequestStates,
                "kRequestStateNames lists the working states");
  Kind kind = Kind::kStore;
  State state = State::kFree;
  int32_t entry = -1;
  ChunkKey key;
  Buf* user = nullptr;
  bool device = false;  // the caller's memory is dev (a DeviceCopier region), not user
  DeviceRange dev;
  Buf* arena_buf = nullptr;
  Buf* arena_buf2 = nullptr;      // the final slot while shrinking
  uint64_t big_off = UINT64_MAX;  // the encode slot while shrinking
  DoneCb cb = nullptr;
  void* arg = nullptr;
  uint64_t disk_off = 0;
  Status status;
  Status result;              // of the last engine operation (DMA, codec, disk I/O)
  uint64_t result_value = 0;  // its checksum (DMA) or output length (codec)
  uint32_t index = 0;
  CacheEngine* owner = nullptr;  // for callbacks that carry only the request
};

}  // namespace dpukv
