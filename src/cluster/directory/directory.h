// The cluster-wide directory of which agents hold which chunks, in Redis (Debian's
// redis-server and libhiredis), driven asynchronously from the agent's progress
// engine (hiredis' async API, its socket watched in the engine's epoll set): the
// agent's threads never wait for Redis.
//
// Data model: the names of directory_keys.h, under a prefix ("dpukv" by default):
// a sorted set of live nodes and their lease deadlines, each node's description,
// and per chunk one string ",NODE,NODE," of its holders, edited by server-side
// scripts; every edit is also published on PREFIX:events (directory_event.h).
// A node renews its lease every lease/3 and re-reads the live nodes every
// live_refresh_ms. Additions and removals are queued and sent pipelined once per
// progress round, each round's also as one event message.
//
// Lookups answer live holders only, so a dead agent's entries age out with its
// lease (and are removed when a lookup meets them). A node keeps a replica of the
// directory (replica_sync.h): a second connection subscribed to the events,
// filled by a scan of the entries when it subscribes; once the scan is done, a
// lookup is answered from the replica in the next progress round, with no round
// trip. Until then, and whenever the subscription is lost (it is then cleared and
// scanned again), or if it outgrows replica_max_keys, a lookup is one MGET.
//
// Redis unreachable: lookups fail at once with CONNECTION_RESET (the agent serves
// locally), the failure is counted, the connection is retried in the background,
// and on reconnection the node publishes again everything it holds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "cluster/directory/directory_keys.h"
#include "cluster/directory/redis_link.h"
#include "cluster/directory/replica_sync.h"
#include "protocol/chunk_key.h"
#include "runtime/context.h"
#include "runtime/progress_engine.h"
#include "runtime/status.h"

namespace dpukv {

struct DirectoryOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 6379;
  // Credentials (AUTH): user empty for Redis' default user, password empty for none.
  std::string user, password;
  std::string prefix = "dpukv";
  uint64_t node_id = 0;
  std::string description;  // published under PREFIX:n:NODE
  uint32_t lease_ms = 10000;
  uint32_t retry_ms = 1000;
  // How often the node re-reads which nodes are live: a node that just joined is
  // not answered as a holder for up to this long (a miss, not an error).
  uint32_t live_refresh_ms = 1000;
  bool replicate = true;               // keep a replica: lookups without a round trip
  size_t replica_max_keys = 1u << 20;  // past this, lookups go back to Redis
  // A lookup Redis has not answered by then is a miss (TIMEOUT), and Redis is taken
  // for hung: the connection is dropped and made again (lookups meanwhile fail at
  // once). A connection whose AUTH/PING is not answered within connect_timeout_ms
  // is dropped too.
  uint32_t lookup_timeout_ms = 500;
  uint32_t connect_timeout_ms = 2000;
  // stop(): what is queued for Redis (leaving the live set) is given this long.
  uint32_t stop_timeout_ms = 1000;
};

class Directory final : public Context {
 public:
  // holders[i]: live nodes holding keys[i]; valid during the callback only.
  using LookupCb = void (*)(void* arg, Status st,
                            const std::vector<std::vector<uint64_t>>& holders);
  using NodeCb = void (*)(void* arg, Status st, const std::string& description);

  struct Counters {
    // Entries Redis took (added, removed), and edits it refused or that were lost.
    uint64_t published = 0, unpublished = 0, publish_failures = 0;
    uint64_t lookups = 0, lookup_keys = 0, lookup_hits = 0;
    uint64_t unreachable = 0, connects = 0, errors = 0, stale_dropped = 0;
    uint64_t rejoined = 0;  // the lease had run out while connected: published again
    uint64_t values_put = 0, value_bytes_put = 0, value_gets = 0;  // puts Redis accepted
    uint64_t value_put_failures = 0;      // refused (e.g. maxmemory), lost or not sent
    uint64_t lookups_local = 0;           // answered from the replica
    uint64_t events_published = 0;        // event messages sent
    uint64_t events = 0, bad_events = 0;  // event messages received; malformed ones
    uint64_t syncs = 0;                   // scans that made the replica complete
    uint64_t bad_entries = 0;             // holder lists that were not one (too long, malformed)
    uint64_t lookup_timeouts = 0;         // lookups Redis did not answer within lookup_timeout_ms
  };

  static Status create(ProgressEngine* pe, const DirectoryOptions& o,
                       std::unique_ptr<Directory>* out);
  ~Directory() override;

  // This node now holds / no longer holds the chunk (sent on the next round).
  void add(const ChunkKey& k);
  void remove(const ChunkKey& k);
  // A holder said it does not hold k (a stale entry): the replica forgets it.
  void forget(const ChunkKey& k, uint64_t node) { sync_.forget(k, node); }
  // Holders of each key: from the replica, or one round trip. CONNECTION_RESET at
  // once if Redis is away.
  Status lookup(const ChunkKey* keys, uint32_t n, LookupCb cb, void* arg);
  // A live node's description; NOT_FOUND if it has none (dead, or never joined).
  Status find_node(uint64_t node_id, NodeCb cb, void* arg);

  // The remote tier: chunk bytes as Redis values (PREFIX:v:CHUNK), for clusters
  // whose agents cannot reach each other's memory. put_value is sent on the next
  // round (copied now; dropped if Redis is away); get_values is one MGET, values[i]
  // empty where there is none, valid during the callback only.
  using ValuesCb = void (*)(void* arg, Status st, const std::vector<std::string>& values);
  void put_value(const ChunkKey& k, std::string value);
  Status get_values(const ChunkKey* keys, uint32_t n, ValuesCb cb, void* arg);

  bool connected() const { return link_.up(); }
  // Why Redis was last unreachable, in its words where it gave some (WRONGPASS,
  // NOAUTH, connection refused); empty while connected.
  const std::string& down_reason() const { return down_reason_; }
  bool replica_ready() const { return sync_.ready(); }
  size_t replica_keys() const { return sync_.replica().size(); }
  // Nodes whose lease was live at the last refresh, this one included.
  size_t live_nodes() const { return live_.size(); }
  bool is_live(uint64_t node) const { return std::binary_search(live_.begin(), live_.end(), node); }
  Counters counters() const;  // with the replica's

 private:
  static constexpr uint64_t kChunkExpiryMs = 7ull * 86400000;  // a value nobody refreshes goes
  // One lookup: a single MGET of the keys' holder strings, or an answer from the
  // replica. Pooled: a lookup allocates nothing once the pool is warm.
  struct LookupOp {
    LookupCb cb = nullptr;
    void* arg = nullptr;
    std::vector<ChunkKey> keys;
    uint64_t deadline_ms = 0;
    bool abandoned = false;  // answered TIMEOUT; Redis' late reply is dropped
  };

  Directory(ProgressEngine* pe, const DirectoryOptions& o);
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override;

  void lost(const char* why);
  void expire_lookups(uint64_t now);
  void flush();
  void publish_events();
  void renew_lease();
  void refresh_live();
  void command(redisCallbackFn* cb, void* priv, std::vector<std::string> argv);
  LookupOp* take_op();
  void drop_dead(const ChunkKey& k);

  static void on_link_up(void* owner);
  static void on_link_down(void* owner, const char* why);
  static void on_reply(redisAsyncContext* c, void* reply, void* priv);
  static void on_edit_reply(redisAsyncContext* c, void* reply, void* priv);
  static void on_live_nodes(redisAsyncContext* c, void* reply, void* priv);
  static void on_lease(redisAsyncContext* c, void* reply, void* priv);
  static void on_put(redisAsyncContext* c, void* reply, void* priv);
  void warn_refused(const char* what, const std::string& why);

  // Lookups taken while the replica was ready, answered as an MGET would be.
  size_t answer_local();
  // The live holders of keys[i] into holders_[i]; entries of dead ones dropped.
  void live_holders(const LookupOp& op, const std::vector<std::vector<uint64_t>>& listed);

  DirectoryOptions opts_;
  DirectoryKeys keys_;
  bool leased_ = false;  // a lease was taken on this connection
  uint64_t retry_at_ms_ = 0, renew_at_ms_ = 0, live_at_ms_ = 0;
  uint64_t down_since_ms_ = 0, last_down_log_ms_ = 0;  // Redis unreachable since (0: it is not)
  uint64_t last_refusal_log_ms_ = 0, refusals_unlogged_ = 0;
  std::vector<ChunkKey> adds_, removes_, published_now_;
  std::string down_reason_;
  struct KeyHash {
    size_t operator()(const ChunkKey& k) const { return k.hash(); }
  };
  std::unordered_set<ChunkKey, KeyHash> held_;  // what this node has published
  // Scratch reused by every command and lookup: no allocation per lookup once warm.
  std::vector<const char*> argv_;
  std::vector<size_t> lens_;
  std::string key_buf_;  // the lookup's MGET, formatted
  std::vector<LookupOp*> free_ops_;
  std::vector<std::vector<uint64_t>> holders_;
  std::vector<LookupOp*> local_ops_, answering_;
  std::vector<LookupOp*> sent_ops_;  // MGETs waiting for Redis, oldest first
  uint64_t link_started_ms_ = 0, stop_deadline_ms_ = 0;
  std::vector<std::vector<uint64_t>> listed_;
  // Last: destroyed first, while what their callbacks touch still exists.
  RedisLink link_;              // commands
  ReplicaSync sync_;            // the replica, its subscription to PREFIX:events, its scans
  std::vector<uint64_t> live_;  // live nodes, sorted, as of the last lease renewal
  Counters counters_;
};

}  // namespace dpukv
