// ClusterNode's private parts, shared by its files: cluster_node.cc (life cycle,
// links, control messages), cluster_node_read.cc (the reader side: fetches, asks,
// one-sided reads, the remote tier) and cluster_node_serve.cc (the holder side:
// PINs answered; prefill-to-decode offers). The pins lent to readers are a part
// of their own (lent_pins.h).
#pragma once

#include <cstdint>
#include <vector>

#include "cluster/cluster_node.h"

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

// One fetch(): the keys, which are local now, and asks still out.
struct ClusterNode::Fetch {
  ClusterNode* owner = nullptr;
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

// A push this node made: waits for the destination's TAKEN.
struct ClusterNode::Offer {
  uint64_t id = 0;
  Link* link = nullptr;
  PushCb cb = nullptr;
  void* arg = nullptr;
  uint32_t n = 0;
  uint64_t deadline_ms = 0;
};

// One PIN sent to one holder for up to peer::kMaxKeys keys of a fetch.
struct ClusterNode::Ask {
  uint64_t id = 0;
  Fetch* fetch = nullptr;
  Link* link = nullptr;
  uint64_t deadline_ms = 0;
  bool answered = false;
  uint32_t reads = 0;
  std::vector<uint32_t> index;  // positions in fetch->keys, in message order
  std::vector<ChunkKey> unpin;  // chunks the holder pinned for us
};

struct ClusterNode::Pull {
  ClusterNode* owner;
  Ask* ask;
  uint32_t index;
  uint64_t bytes;
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
