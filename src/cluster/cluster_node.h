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
// The node is a façade over three parts: its links to other nodes (peer_links.h),
// the reader side (chunk_reader.h) and the holder side (chunk_holder.h). It routes
// each control message to its part, tells the reader and holder when a link
// fails, and owns the counters they add to.
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
#include "cluster/chunk_holder.h"
#include "cluster/chunk_reader.h"
#include "cluster/cluster_options.h"
#include "cluster/directory/directory.h"
#include "cluster/peer_links.h"
#include "cluster/peer_wire.h"
#include "cluster/remote_tier.h"
#include "cluster/ucx/ucx_node.h"
#include "runtime/context.h"

namespace dpukv {

class ClusterNode final : public Context {
 public:
  // fetched: how many leading keys were brought into the local cache (a lookup
  // of the local cache then sees them; they may still be evicted before it does).
  using FetchCb = ChunkReader::FetchCb;
  // taken[i]: SUCCESS if the destination now holds keys[i]; valid during the call.
  using PushCb = ChunkHolder::PushCb;

  using Counters = ClusterCounters;
  using PeerStats = ClusterPeerStats;

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
  ClusterNode(ProgressEngine* pe, CacheEngine* cache, const ClusterOptions& o);
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override { return false; }
  static void on_control(void* arg, uint64_t sender, uint32_t peer, const uint8_t* msg, size_t len);
  static void on_residency(void* arg, const ChunkKey& k, bool present);
  static void on_link_failed(void* arg, PeerLink* l);
  static bool link_busy(void* arg, const PeerLink* l);

  ClusterOptions opts_;
  CacheEngine* cache_;
  bool stopping_ = false;
  Counters counters_;                 // the parts add to it
  std::unique_ptr<RemoteTier> tier_;  // with ClusterOptions::remote_tier; outlives dir_
  // The parts outlive the UcxNode and the Directory, whose callbacks reach them.
  std::unique_ptr<PeerLinks> links_;
  std::unique_ptr<ChunkReader> reader_;
  std::unique_ptr<ChunkHolder> holder_;
  // Last: destroyed first, while everything their callbacks touch still exists.
  std::unique_ptr<UcxNode> ucx_;
  std::unique_ptr<Directory> dir_;
};

}  // namespace dpukv
