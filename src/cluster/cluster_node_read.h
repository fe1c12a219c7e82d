// ClusterNode's reader side: a lookup's missing keys found in the directory and
// read one-sided from their holders into this node's arena, or asked of the remote
// tier. A Fetch is one fetch() (or one OFFER being taken): its keys, which of them
// are local now, and the asks still out. An Ask is one PIN to one holder; a Pull is
// one one-sided read of a chunk that holder placed. Keys are kept in order: a
// fetch answers how many *leading* keys are local. Implemented in
// cluster_node_read.cc; cluster_node.cc starts fetches for OFFERs and ends them
// when links fail.
#pragma once

#include <cstdint>
#include <vector>

#include "cluster/cluster_node.h"
#include "cluster/cluster_node_parts.h"

namespace dpukv {

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

}  // namespace dpukv
