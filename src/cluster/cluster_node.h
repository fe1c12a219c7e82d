// An agent's membership in the cluster: it publishes the chunks its cache holds in
// the directory (Redis), serves them to other agents in place (they read its arena
// one-sided over UCX), and, when a lookup misses locally, finds the missing keys'
// holders in one directory round trip, reads their chunks straight into its own
// arena and keeps each one only if it matches its checksum. The cache knows none of
// this (it offers locate/ingest and a residency listener); the agent asks fetch().
//
// Placement: a key held by several agents is read from the one this node has the
// fewest reads in flight from, an already connected one on a tie. Failures are
// misses, never wrong bytes: a holder that no longer has the chunk (a stale
// directory entry), a read that breaks (the holder died: its entry ages out with
// its lease), a copy that fails its checksum, a holder that does not answer within
// request_timeout_ms. Redis away: fetch() fails at once and the agent serves from
// its own cache; the directory reconnects and republishes in the background.
//
// Trust: every control message is parsed and checked (peer_wire.h); a read is
// bounded by the region the holder described; a holder's answer is taken only
// from the node it was asked. A node that sends a malformed message is
// disconnected and counted; others are served as before. Pins a reader leaves
// behind (it died between PLACED and UNPIN) expire with the cache's pin timeout.
//
// Threading: a Context on the agent's progress engine; its UcxNode and Directory
// are Contexts on the same engine, started and stopped with it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/cache_engine.h"
#include "cluster/directory/directory.h"
#include "cluster/lent_pins.h"
#include "cluster/peer_wire.h"
#include "cluster/remote_tier.h"
#include "cluster/ucx/ucx_node.h"
#include "runtime/context.h"

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

class ClusterNode final : public Context {
 public:
  // fetched: how many leading keys were brought into the local cache (a lookup
  // of the local cache then sees them; they may still be evicted before it does).
  using FetchCb = void (*)(void* arg, uint32_t fetched);
  // taken[i]: SUCCESS if the destination now holds keys[i]; valid during the call.
  using PushCb = void (*)(void* arg, Status st, const uint8_t* taken, uint32_t n);

  struct Counters {
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
  struct PeerStats {
    uint64_t node = 0;
    bool connected = false;
    uint64_t fetched = 0, fetched_bytes = 0, served = 0, served_bytes = 0, errors = 0;
  };

  static Status create(ProgressEngine* pe, CacheEngine* cache, const ClusterOptions& o,
                       std::unique_ptr<ClusterNode>* out);
  ~ClusterNode() override;

  uint64_t node_id() const { return ucx_->node_id(); }
  // Brings the leading keys that other agents hold into the local cache. Calls cb
  // exactly once, later; CONNECTION_RESET at once if the directory is away,
  // BAD_STATE if not running.
  Status fetch(const ChunkKey* keys, uint32_t n, FetchCb cb, void* arg);
  // A prefill-to-decode transfer: offers chunks this node holds to node, which
  // reads them into its cache (one-sided, as any remote hit) and says which it
  // took. cb exactly once, later: CONNECTION_RESET if node cannot be reached,
  // TIMEOUT if it did not answer; INVALID_VALUE at once for more than
  // peer::kMaxKeys keys or this node itself.
  Status push(uint64_t node, const ChunkKey* keys, uint32_t n, PushCb cb, void* arg);

  Counters counters() const;  // with the remote tier's
  std::vector<PeerStats> peer_stats() const;
  bool directory_connected() const { return dir_->connected(); }
  const std::string& directory_down_reason() const { return dir_->down_reason(); }
  Directory::Counters directory_counters() const { return dir_->counters(); }
  size_t directory_replica_keys() const { return dir_->replica_keys(); }
  size_t directory_live_nodes() const { return dir_->live_nodes(); }
  bool directory_replica_ready() const { return dir_->replica_ready(); }

 private:
  struct Link;
  struct Fetch;
  struct Ask;
  struct Pull;
  struct Serve;
  struct Resolve;
  struct Offer;

  ClusterNode(ProgressEngine* pe, CacheEngine* cache, const ClusterOptions& o);
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override { return false; }

  // Reader side.
  static void on_holders(void* arg, Status st, const std::vector<std::vector<uint64_t>>& holders);
  // Sends the asks of f: each key to its pick among holders, or all to only.
  void plan(Fetch* f, const std::vector<std::vector<uint64_t>>* holders, Link* only);
  void on_offer(uint64_t sender, const peer::Message& m);
  void on_taken(Link* l, const peer::Message& m);
  void offer_done(Offer* o, Status st, const uint8_t* taken);
  // The remote tier (remote_tier.h) for the keys at f->tier.
  bool ask_tier(Fetch* f);
  static void on_tier(void* arg, const uint8_t* got, uint32_t n);
  Link* pick_holder(const std::vector<uint64_t>& holders);
  void send_ask(Ask* a);
  void on_placed(Link* l, const peer::Message& m);
  static void on_read(void* arg, Status st);
  void ask_done(Ask* a);
  void ask_failed(Ask* a, uint64_t* counter);
  void fetch_done(Fetch* f);
  // Holder side.
  void on_pin(uint64_t sender, const peer::Message& m);
  static void on_prefetched(void* arg, Status st);
  void answer(Serve* s);
  // Links to other nodes.
  Link* link(uint64_t node);
  void send(Link* l, std::vector<uint8_t> msg, std::vector<ChunkKey> pinned);
  static void on_node(void* arg, Status st, const std::string& description);
  void link_failed(Link* l, const char* why);
  size_t forget_gone_peers(uint64_t now);
  static void on_control(void* arg, uint64_t sender, uint32_t peer, const uint8_t* msg, size_t len);
  static void on_residency(void* arg, const ChunkKey& k, bool present);

  ClusterOptions opts_;
  CacheEngine* cache_;
  bool stopping_ = false;
  uint64_t next_request_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Link>> links_;
  std::unordered_map<uint64_t, std::unique_ptr<Ask>> asks_;  // by request id
  std::vector<std::unique_ptr<Fetch>> fetches_;
  std::vector<Fetch*> free_fetches_;
  std::vector<std::unique_ptr<Serve>> serves_;  // waiting for prefetches
  LentPins lent_;                               // pins handed to readers with a PLACED
  uint64_t lent_check_ms_ = 0;
  uint64_t forget_check_ms_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Offer>> offers_;  // by request id
  uint32_t resolving_ = 0, fetching_ = 0;
  Counters counters_;
  std::unique_ptr<RemoteTier> tier_;  // with ClusterOptions::remote_tier; outlives dir_
  // Last: destroyed first, while everything their callbacks touch still exists.
  std::unique_ptr<UcxNode> ucx_;
  std::unique_ptr<Directory> dir_;
};

}  // namespace dpukv
