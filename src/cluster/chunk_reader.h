// The node's reader side: a lookup's missing keys found in the directory and read
// one-sided from their holders into this node's arena, or asked of the remote
// tier. A Fetch is one fetch() (or one OFFER being taken): its keys, which of them
// are local now, and the asks still out. An Ask is one PIN to one holder for up to
// peer::kMaxKeys keys; a Pull is one one-sided read of a chunk that holder placed.
// Keys are kept in order: a fetch answers how many *leading* keys are local.
//
// Contract: every fetch calls its callback exactly once, later. A key is counted
// only if its copy landed and matched its checksum (the cache's end_ingest); a
// holder that does not have the chunk, a broken read, a wrong copy or a holder
// that does not answer within request_timeout_ms make misses, never wrong bytes.
// An answer is taken only from the node it was asked, for an ask still open.
//
// Threading: the cluster node's progress thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cache/cache_engine.h"
#include "cluster/cluster_options.h"
#include "cluster/directory/directory.h"
#include "cluster/peer_links.h"
#include "cluster/peer_wire.h"
#include "cluster/remote_tier.h"
#include "cluster/ucx/ucx_node.h"

namespace dpukv {

class ChunkReader {
 public:
  // fetched: how many leading keys were brought into the local cache.
  using FetchCb = void (*)(void* arg, uint32_t fetched);

  // tier: the remote tier, or null. self: this node's id (its own stale entries
  // in the directory are not asked).
  ChunkReader(const ClusterOptions& o, uint64_t self, CacheEngine* cache, UcxNode* ucx,
              Directory* dir, RemoteTier* tier, PeerLinks* links, ClusterCounters* counters);

  // As ClusterNode::fetch, once the node is running.
  Status fetch(const ChunkKey* keys, uint32_t n, FetchCb cb, void* arg);
  // Another node offers its chunks (a prefill-to-decode push): read them all
  // from it, then answer TAKEN.
  void take_offer(uint64_t sender, const peer::Message& m);
  void on_placed(PeerLink* l, const peer::Message& m);
  // l failed: its unanswered asks end (answered ones end with their reads).
  void link_failed(PeerLink* l);
  // Asks past their deadline end; their holders are not asked again for retry_ms.
  size_t expire(uint64_t now_ms);
  void set_stopping() { stopping_ = true; }
  void fail_open();  // stopping: unanswered asks end now
  bool uses(const PeerLink* l) const;
  uint32_t fetching() const { return fetching_; }

 private:
  struct Fetch {
    ChunkReader* owner = nullptr;
    FetchCb cb = nullptr;
    void* arg = nullptr;
    std::vector<ChunkKey> keys;
    std::vector<uint8_t> got;  // 1: now in the local cache
    uint32_t asks = 0;
    bool in_use = false;
    uint64_t offer_from = 0, offer_request = 0;  // an OFFER being taken: answer TAKEN
    std::vector<uint32_t> tier;                  // positions asked of the remote tier
    uint32_t tier_from = UINT32_MAX;             // where the keys no live agent listed begin
    bool tier_retried = false;                   // keys whose listed holder failed went to the tier
  };
  struct Ask {
    uint64_t id = 0;
    Fetch* fetch = nullptr;
    PeerLink* link = nullptr;
    uint64_t deadline_ms = 0;
    bool answered = false;
    uint32_t reads = 0;
    std::vector<uint32_t> index;  // positions in fetch->keys, in message order
    std::vector<ChunkKey> unpin;  // chunks the holder pinned for us
  };
  struct Pull {
    ChunkReader* owner;
    Ask* ask;
    uint32_t index;
    uint64_t bytes;
  };

  Fetch* new_fetch(const ChunkKey* keys, uint32_t n);
  static void on_holders(void* arg, Status st, const std::vector<std::vector<uint64_t>>& holders);
  // Sends the asks of f: each key to its pick among holders, or all to only.
  void plan(Fetch* f, const std::vector<std::vector<uint64_t>>* holders, PeerLink* only);
  PeerLink* pick_holder(const std::vector<uint64_t>& holders);
  bool ask_tier(Fetch* f);  // the remote tier for the keys at f->tier
  static void on_tier(void* arg, const uint8_t* got, uint32_t n);
  void send_ask(Ask* a);
  static void on_read(void* arg, Status st);
  void ask_done(Ask* a);
  void ask_failed(Ask* a, uint64_t* counter);
  void fetch_done(Fetch* f);

  ClusterOptions opts_;
  uint64_t self_;
  CacheEngine* cache_;
  UcxNode* ucx_;
  Directory* dir_;
  RemoteTier* tier_;
  PeerLinks* links_;
  ClusterCounters* counters_;
  bool stopping_ = false;
  uint64_t next_request_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Ask>> asks_;  // by request id
  std::vector<std::unique_ptr<Fetch>> fetches_;
  std::vector<Fetch*> free_fetches_;
  uint32_t fetching_ = 0;
};

}  // namespace dpukv
