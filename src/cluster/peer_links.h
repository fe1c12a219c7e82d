// The node's links to other nodes. A link is resolved through the directory on
// first use (the description must be the node's own: an entry cannot redirect
// us), then is a UcxNode peer; messages wait on it while it resolves. A link that
// fails (cannot send, lost, not answering, malformed message) is not tried again
// for retry_ms, and the reader and holder sides hear of it (their asks and offers
// on it end). Pins sent with a PLACED are lent to that reader (lent_pins.h) until
// its UNPIN or the lend timeout. A peer that left the directory's live set, with
// nothing in flight to it, is forgotten after forget_peer_ms.
//
// Threading: the cluster node's progress thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_engine.h"
#include "cluster/cluster_options.h"
#include "cluster/directory/directory.h"
#include "cluster/lent_pins.h"
#include "cluster/ucx/ucx_node.h"

namespace dpukv {

// Another node, as this one knows it.
struct PeerLink {
  enum class State : uint8_t { kNew, kResolving, kReady, kFailed };
  uint64_t node = 0;
  State state = State::kNew;
  uint32_t peer = UcxNode::kUnknownPeer;
  uint64_t retry_at_ms = 0;
  uint32_t reads = 0;          // reads in flight from it: the reader picks the least loaded
  uint64_t gone_since_ms = 0;  // not live in the directory since (0: it is, or busy)
  struct Queued {
    std::vector<uint8_t> msg;
    std::vector<ChunkKey> pinned;  // pins this message hands over (PLACED)
  };
  std::vector<Queued> queued;
  ClusterPeerStats stats;

  bool ready() const { return state == State::kReady; }
  // Failed, and not to be tried again before retry_at_ms.
  bool resting(uint64_t now_ms) const { return state == State::kFailed && now_ms < retry_at_ms; }
};

class PeerLinks {
 public:
  // Told when a link fails, before its queued messages go.
  using FailedCb = void (*)(void* arg, PeerLink* l);
  // Whether the reader or holder side has something in flight on l.
  using BusyCb = bool (*)(void* arg, const PeerLink* l);

  PeerLinks(const ClusterOptions& o, CacheEngine* cache, UcxNode* ucx, Directory* dir,
            ClusterCounters* counters);
  void set_listener(FailedCb failed, BusyCb busy, void* arg);

  PeerLink* link(uint64_t node);  // made on first use
  PeerLink* find(uint64_t node);  // nullptr if unknown
  // Sends msg on l (resolving it first); pinned: keys this message lends to that
  // node (a PLACED), unpinned if it cannot go.
  void send(PeerLink* l, std::vector<uint8_t> msg, std::vector<ChunkKey> pinned);
  void fail(PeerLink* l, const char* why);
  // reader's UNPIN of request; false if nothing was lent under it.
  bool give_back(uint64_t reader, uint64_t request) { return lent_.give_back(reader, request); }
  // Lends past their deadline, peers gone from the cluster, connections lost.
  size_t check(uint64_t now_ms);
  void set_stopping() { stopping_ = true; }
  void give_all_back() { lent_.give_all_back(); }
  std::vector<ClusterPeerStats> stats() const;

 private:
  struct Resolve {
    PeerLinks* owner;
    uint64_t node;
  };
  static void on_node(void* arg, Status st, const std::string& description);
  size_t forget_gone(uint64_t now_ms);

  ClusterOptions opts_;
  CacheEngine* cache_;
  UcxNode* ucx_;
  Directory* dir_;
  ClusterCounters* counters_;
  LentPins lent_;  // pins handed to readers with a PLACED
  std::unordered_map<uint64_t, std::unique_ptr<PeerLink>> links_;
  FailedCb failed_cb_ = nullptr;
  BusyCb busy_cb_ = nullptr;
  void* cb_arg_ = nullptr;
  bool stopping_ = false;
  uint64_t lent_check_ms_ = 0, forget_check_ms_ = 0;
};

}  // namespace dpukv
