// What a cluster node is built with (ClusterOptions) and what it counts, in all
// and per peer: the words the node's parts (peer_links.h, chunk_reader.h,
// chunk_holder.h) and its façade (cluster_node.h) share with the agent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dpukv {

struct ClusterOptions {
  std::string redis_host = "127.0.0.1";
  uint16_t redis_port = 6379;
  std::string redis_user, redis_password;  // AUTH; empty: none (default user)
  std::string prefix = "dpukv";            // Redis keys of this cluster
  uint32_t lease_ms = 10000;               // a dead agent's entries age out after this
  uint32_t live_refresh_ms = 1000;
  uint32_t request_timeout_ms = 2000;  // a holder's answer to a pin request
  uint32_t lookup_timeout_ms = 500;    // Redis' answer to a lookup (then a miss)
  // Chunks pinned for a reader (PLACED) stay pinned until its UNPIN or this long.
  uint32_t lend_timeout_ms = 16000;
  uint32_t retry_ms = 1000;  // before a failed peer is tried again
  // A peer that has left the directory's live set, with nothing of ours in flight
  // to it, is forgotten (its connection, its stats and metrics) after this long.
  uint32_t forget_peer_ms = 60000;
  bool detect_peer_failure = true;  // see UcxNodeOptions
  // The remote tier: every chunk this node stores is also written to Redis as a
  // value, and keys no live agent holds are looked for there (LMCache's Redis
  // backend), for clusters without a fabric between agents. Off by default: it
  // sends every stored byte to Redis.
  bool remote_tier = false;
  // The directory replica (see Directory): lookups without a round trip for up to
  // this many chunks in the cluster; 0: every lookup asks Redis.
  size_t replica_max_keys = 1u << 20;
};

struct ClusterCounters {
  uint64_t fetches = 0, fetch_keys = 0;
  uint64_t remote_hits = 0, remote_bytes = 0;  // chunks read from peers and kept
  uint64_t stale = 0;                          // a listed holder did not have the chunk
  uint64_t read_errors = 0;                    // a read broke (holder died, partition)
  uint64_t checksum_failures = 0;              // a copy did not match its checksum
  uint64_t timeouts = 0;                       // a holder did not answer in time
  uint64_t no_room = 0;                        // the local cache had no room for a copy
  uint64_t directory_unreachable = 0;
  uint64_t served_requests = 0, served_chunks = 0, served_bytes = 0;
  uint64_t bad_messages = 0;  // malformed control messages (sender disconnected)
  uint64_t pins_expired = 0;  // chunks pinned for a reader that never unpinned them
  uint64_t peers_failed = 0;
  uint64_t peers_forgotten = 0;             // left the cluster and were dropped from peer_stats()
  uint64_t pushes = 0, pushed_chunks = 0;   // prefill side: offers made, chunks taken
  uint64_t offers = 0, offered_chunks = 0;  // decode side: offers received, chunks taken
  uint64_t tier_puts = 0, tier_hits = 0, tier_bytes = 0;  // the remote tier
  uint64_t tier_rejects = 0;    // values that were malformed or failed their checksum
  uint64_t tier_fallbacks = 0;  // lookups whose listed holders failed, asked of the tier
};
struct ClusterPeerStats {
  uint64_t node = 0;
  bool connected = false;
  uint64_t fetched = 0, fetched_bytes = 0, served = 0, served_bytes = 0, errors = 0;
};

}  // namespace dpukv
