// The remote tier (LMCache's Redis backend): every chunk this node stores is also
// written to Redis as a value, and keys no live agent holds are looked for there,
// for clusters without a fabric between agents. A member of the ChunkStore family
// in spirit (cache/tier/chunk_store.h), but asynchronous and shared by every node: it
// sits beside the directory, whose Redis link carries its values.
//
// Contract:
//  - A value is a TierValue header, then the chunk's stored bytes. A value is taken
//    only if its header is whole, names the key it was read under, and its bytes
//    match their checksum (the cache's end_ingest checks that): a value copied
//    onto another chunk's key, or cut short, is refused and counted, never served.
//  - Chunks that arrived from elsewhere (the tier itself, another agent) are not
//    written back when the cache announces them (mark_arrival before the ingest).
//  - get() calls its callback exactly once, later (also when the directory is
//    destroyed with the MGET in flight); after stop() nothing more is ingested.
//
// Threading: the cluster node's thread.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "cache/cache_engine.h"
#include "cluster/directory/directory.h"
#include "protocol/chunk_key.h"
#include "runtime/status.h"

namespace dpukv {

// A chunk as a remote-tier value: this header, then the stored bytes.
// The chunk's own key is in the header and checked on ingest: the checksum covers
// the bytes only, and a value copied onto another chunk's Redis key (anyone who
// can write to the Redis can) would otherwise pass it as that chunk. Values of
// the first layout (magic "DKVT", no key) are refused as malformed.
struct TierValue {
  uint32_t magic;  // "DKV2"
  uint8_t encoded;
  uint8_t reserved[3];
  uint64_t size, stored, checksum;
  ChunkKey key;  // model, prefix hash, world size and rank, KV layout
};
static_assert(sizeof(TierValue) == 64, "a value stays in Redis across versions");
constexpr uint32_t kTierMagic = 0x32564b44;

class RemoteTier {
 public:
  struct Counters {
    uint64_t puts = 0, hits = 0, bytes = 0;
    uint64_t rejects = 0;  // values that were malformed or failed their checksum
    uint64_t no_room = 0;  // the local cache had no room for a value
  };
  // got[j]: keys[j] is in the local cache now. Valid during the call.
  using GetCb = void (*)(void* arg, const uint8_t* got, uint32_t n);

  RemoteTier(CacheEngine* cache, Directory* dir) : cache_(cache), dir_(dir) {}

  // The residency feed said k is present: queue its upload, unless it arrived
  // from elsewhere. Uploads go out from poll(), never from inside a cache call.
  void on_present(const ChunkKey& k);
  // k is about to be ingested from elsewhere: its arrival is not uploaded.
  void mark_arrival(const ChunkKey& k) { arrivals_.insert(k); }
  void arrival_failed(const ChunkKey& k) { arrivals_.erase(k); }
  // Writes up to a few queued chunks (each read in place while pinned); returns
  // how many were queued before the call (work for the progress engine).
  size_t poll();
  // One MGET for keys; the leading values that check are ingested, in order, up
  // to the first missing or refused one. Not sent (an error) if the directory
  // cannot take it now.
  Status get(std::vector<ChunkKey> keys, GetCb cb, void* arg);
  void stop() { stopping_ = true; }
  const Counters& counters() const { return counters_; }

 private:
  struct Get;
  static void on_values(void* arg, Status st, const std::vector<std::string>& values);

  CacheEngine* cache_;
  Directory* dir_;
  bool stopping_ = false;
  std::vector<ChunkKey> uploads_;
  struct KeyHash {
    size_t operator()(const ChunkKey& k) const { return k.hash(); }
  };
  std::unordered_set<ChunkKey, KeyHash> arrivals_;
  Counters counters_;
};

}  // namespace dpukv
