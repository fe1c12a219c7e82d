// The cache engine's per-chunk entry and per-operation request, shared by the
// files that implement it: cache_engine.cc (life cycle and queries),
// cache_placement.cc (index, memory and disk placement, eviction, write-back
// pacing) and cache_requests.cc (the store, retrieve, prefetch and spill
// pipelines). Internal to src/cache.
#pragma once

#include "cache/cache_engine.h"

namespace dpukv {

struct CacheEngine::Entry {
  ChunkKey key;
  uint64_t size = 0;      // bytes of the chunk as the client gave it
  uint64_t stored = 0;    // bytes it takes in the tiers (encoded size, or size)
  uint64_t checksum = 0;  // xxh3-64 of the stored bytes
  bool encoded = false;
  uint64_t mem_off = 0, disk_off = 0;
  uint64_t pin_deadline = 0;
  // Lookup pins hold until unpinned or their deadline passes.
  bool pinned(uint64_t now) const { return pins != 0 && now < pin_deadline; }
  int32_t dprev = -1, dnext = -1;  // disk queue links (on_disk only)
  uint32_t hits = 0;
  uint16_t pins = 0;     // lookup pins
  uint16_t readers = 0;  // DMA or disk writes reading the memory copy
  bool used = false;
  bool in_mem = false;     // holds memory (maybe still being filled)
  bool mem_ready = false;  // memory copy complete and valid
  bool on_disk = false;    // a complete copy is on disk and logged
  bool spilling = false, loading = false;
  bool evict_when_clean = false;  // drop the memory copy once the spill lands
  bool announced = false;         // the residency listener was told it is present
  bool ingesting = false;         // begin_ingest gave its room to another writer
  // An ingested copy not yet read here: the read it was fetched for does not make
  // it recent (another agent holds the chunk; this copy goes first).
  bool replica_unread = false;
};

// One store, retrieve, prefetch or spill in flight: an explicit state machine.
struct CacheEngine::Request {
  enum class Kind : uint8_t { kStore, kRetrieve, kPrefetch, kSpill };
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

inline const ChunkKey* CacheEngine::EntryKey::operator()(int32_t e) const {
  const Entry& en = engine->entries_[static_cast<size_t>(e)];
  return en.used ? &en.key : nullptr;
}

}  // namespace dpukv
