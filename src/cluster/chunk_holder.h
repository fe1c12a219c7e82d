// The node's holder side: it answers another node's PIN with where each chunk
// lies in its arena (PLACED), pinned until that reader's UNPIN or the lend
// timeout, prefetching chunks that are only on disk first; and it offers its
// chunks to a decode node (a prefill-to-decode push), which reads them as any
// remote hit and says which it took (TAKEN).
//
// Contract: a push's callback runs exactly once, later: with the destination's
// answer, CONNECTION_RESET if its link fails, TIMEOUT if it does not answer, or
// SHUTDOWN when the node stops. A TAKEN is taken only from the node offered to,
// for an offer still open and of the same count.
//
// Threading: the cluster node's progress thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cache/cache_engine.h"
#include "cluster/cluster_options.h"
#include "cluster/peer_links.h"
#include "cluster/peer_wire.h"

namespace dpukv {

class ChunkHolder {
 public:
  // taken[i]: SUCCESS if the destination now holds keys[i]; valid during the call.
  using PushCb = void (*)(void* arg, Status st, const uint8_t* taken, uint32_t n);

  ChunkHolder(const ClusterOptions& o, CacheEngine* cache, PeerLinks* links,
              ClusterCounters* counters);

  void on_pin(uint64_t sender, const peer::Message& m);
  // As ClusterNode::push, its arguments checked.
  void push(uint64_t node, const ChunkKey* keys, uint32_t n, PushCb cb, void* arg);
  void on_taken(PeerLink* l, const peer::Message& m);
  void link_failed(PeerLink* l);   // its offers end with CONNECTION_RESET
  size_t expire(uint64_t now_ms);  // offers past their deadline end with TIMEOUT
  void end_offers(Status st);
  bool uses(const PeerLink* l) const;
  bool serving() const { return !serves_.empty(); }  // PINs waiting for prefetches

 private:
  // A PIN being answered; waits while chunks only on disk are prefetched.
  struct Serve {
    ChunkHolder* owner = nullptr;
    uint64_t sender = 0, request = 0;
    std::vector<ChunkKey> keys;
    std::vector<ChunkPlacement> placed;
    std::vector<uint8_t> status;
    uint32_t prefetching = 0;
  };
  // A push this node made: waits for the destination's TAKEN.
  struct Offer {
    uint64_t id = 0;
    PeerLink* link = nullptr;
    PushCb cb = nullptr;
    void* arg = nullptr;
    uint32_t n = 0;
    uint64_t deadline_ms = 0;
  };

  static void on_prefetched(void* arg, Status st);
  void answer(Serve* s);
  void offer_done(Offer* o, Status st, const uint8_t* taken);

  ClusterOptions opts_;
  CacheEngine* cache_;
  PeerLinks* links_;
  ClusterCounters* counters_;
  uint64_t next_request_ = 1;
  std::vector<std::unique_ptr<Serve>> serves_;                   // waiting for prefetches
  std::unordered_map<uint64_t, std::unique_ptr<Offer>> offers_;  // by request id
};

}  // namespace dpukv
