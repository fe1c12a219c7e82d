// ClusterNode's links to other nodes, the pushes it made and the PINs it is
// answering: shared by cluster_node.cc (life cycle, links, control messages, the
// holder side, prefill-to-decode offers) and cluster_node_read.cc (the reader
// side, whose own state is in cluster_node_read.h). The pins lent to readers and
// the remote tier are parts of their own (lent_pins.h, remote_tier.h).
#pragma once

#include <cstdint>
#include <vector>

#include "cluster/cluster_node.h"

namespace dpukv {

// Another node, as this one knows it: resolved through the directory on first
// use, then a UcxNode peer. Messages wait here while it is being resolved.
struct ClusterNode::Link {
  enum class State : uint8_t { kNew, kResolving, kReady, kFailed };
  uint64_t node = 0;
  State state = State::kNew;
  uint32_t peer = UcxNode::kUnknownPeer;
  uint64_t retry_at_ms = 0;
  uint32_t reads = 0;          // reads in flight from it: placement picks the least loaded
  uint64_t gone_since_ms = 0;  // not live in the directory since (0: it is, or busy)
  struct Queued {
    std::vector<uint8_t> msg;
    std::vector<ChunkKey> pinned;  // pins this message hands over (PLACED)
  };
  std::vector<Queued> queued;
  PeerStats stats;
};

// A push this node made: waits for the destination's TAKEN.
struct ClusterNode::Offer {
  uint64_t id = 0;
  Link* link = nullptr;
  PushCb cb = nullptr;
  void* arg = nullptr;
  uint32_t n = 0;
  uint64_t deadline_ms = 0;
};

// A PIN being answered; waits while chunks only on disk are prefetched.
struct ClusterNode::Serve {
  ClusterNode* owner = nullptr;
  uint64_t sender = 0, request = 0;
  std::vector<ChunkKey> keys;
  std::vector<ChunkPlacement> placed;
  std::vector<uint8_t> status;
  uint32_t prefetching = 0;
};

struct ClusterNode::Resolve {
  ClusterNode* owner;
  uint64_t node;
};

}  // namespace dpukv
