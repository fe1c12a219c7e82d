// The cluster-wide directory of which agents hold which chunks, in Redis (Debian's
// redis-server and libhiredis), driven asynchronously from the agent's progress
// engine (hiredis' async API, its socket watched in the engine's epoll set): the
// agent's threads never wait for Redis.
//
// Data model (keys under a prefix, "dpukv" by default):
//   PREFIX:nodes            sorted set: node id (16 hex) -> lease deadline (ms, wall clock)
//   PREFIX:n:NODE           the node's peer description (what UcxNode::connect takes)
//   PREFIX:c:CHUNK          string ",NODE,NODE,": the holders (CHUNK: the key's 32 bytes),
//                           edited by server-side scripts
// A node renews its lease every lease/3 and re-reads the live nodes every
// live_refresh_ms; a lookup is one MGET of its keys and answers only live holders, so a dead
// agent's entries age out with its lease (and are removed when a lookup meets them). Additions and
// removals are queued and sent pipelined once per progress round.
//
// Redis unreachable: lookups fail at once with CONNECTION_RESET (the agent serves
// locally), the failure is counted, the connection is retried in the background,
// and on reconnection the node publishes again everything it holds.
#pragma once

#include <hiredis/async.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "protocol/chunk_key.h"
#include "runtime/context.h"
#include "runtime/progress_engine.h"
#include "runtime/status.h"

namespace dpukv {

struct DirectoryOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 6379;
  std::string prefix = "dpukv";
  uint64_t node_id = 0;
  std::string description;  // published under PREFIX:n:NODE
  uint32_t lease_ms = 10000;
  uint32_t retry_ms = 1000;
  // How often the node re-reads which nodes are live: a node that just joined is
  // not answered as a holder for up to this long (a miss, not an error).
  uint32_t live_refresh_ms = 1000;
};

class Directory final : public Context {
 public:
  // holders[i]: live nodes holding keys[i]; valid during the callback only.
  using LookupCb = void (*)(void* arg, Status st,
                            const std::vector<std::vector<uint64_t>>& holders);
  using NodeCb = void (*)(void* arg, Status st, const std::string& description);

  struct Counters {
    uint64_t published = 0, unpublished = 0, lookups = 0, lookup_keys = 0, lookup_hits = 0;
    uint64_t unreachable = 0, connects = 0, errors = 0, stale_dropped = 0;
    uint64_t rejoined = 0;  // the lease had run out while connected: published again
    uint64_t values_put = 0, value_bytes_put = 0, value_gets = 0;
  };

  static Status create(ProgressEngine* pe, const DirectoryOptions& o,
                       std::unique_ptr<Directory>* out);
  ~Directory() override;

  // This node now holds / no longer holds the chunk (sent on the next round).
  void add(const ChunkKey& k);
  void remove(const ChunkKey& k);
  // Holders of each key, one round trip. CONNECTION_RESET at once if Redis is away.
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

  bool connected() const { return ctx_ != nullptr && ready_; }
  const Counters& counters() const { return counters_; }

 private:
  struct Watch final : FdWatcher {
    Directory* owner = nullptr;
    void on_fd_ready(uint32_t events) override;
  };
  struct LookupOp;

  Directory(ProgressEngine* pe, const DirectoryOptions& o);
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override;

  void connect();
  void lost(const char* why);
  void flush();
  void renew_lease();
  void command(redisCallbackFn* cb, void* priv, std::vector<std::string> argv);
  bool send_argv(redisCallbackFn* cb, void* priv);  // argv_ and lens_
  void write_through();
  size_t key_size() const;
  void format_key(char* p, char kind, const ChunkKey& k) const;
  std::string chunk_key(const ChunkKey& k) const;
  std::string value_key(const ChunkKey& k) const;
  std::string node_key(uint64_t node) const;
  static std::string hex16(uint64_t v);

  static void on_connect(const redisAsyncContext* c, int status);
  static void on_disconnect(const redisAsyncContext* c, int status);
  static void on_reply(redisAsyncContext* c, void* reply, void* priv);
  static void on_live_nodes(redisAsyncContext* c, void* reply, void* priv);
  static void on_lease(redisAsyncContext* c, void* reply, void* priv);
  static void add_read(void* p);
  static void del_read(void* p);
  static void add_write(void* p);
  static void del_write(void* p);
  static void cleanup(void* p);
  void update_watch();

  DirectoryOptions opts_;
  redisAsyncContext* ctx_ = nullptr;
  bool ready_ = false;
  bool leased_ = false;  // a lease was taken on this connection
  bool reading_ = false, writing_ = false, watched_ = false;
  uint32_t watched_events_ = 0;  // what the epoll set has for fd_
  int fd_ = -1;
  Watch watch_;
  uint64_t retry_at_ms_ = 0, renew_at_ms_ = 0, live_at_ms_ = 0;
  uint64_t down_since_ms_ = 0, last_down_log_ms_ = 0;  // Redis unreachable since (0: it is not)
  void refresh_live();
  std::vector<ChunkKey> adds_, removes_;
  struct KeyHash {
    size_t operator()(const ChunkKey& k) const { return k.hash(); }
  };
  std::unordered_set<ChunkKey, KeyHash> held_;  // what this node has published
  uint32_t pending_replies_ = 0;
  // Scratch reused by every command and lookup: no allocation per lookup once warm.
  std::vector<const char*> argv_;
  std::vector<size_t> lens_;
  std::string key_buf_;  // the lookup's MGET, formatted
  std::vector<LookupOp*> free_ops_;
  std::vector<std::vector<uint64_t>> holders_;
  std::vector<uint64_t> live_;  // live nodes, sorted, as of the last lease renewal
  Counters counters_;
};

}  // namespace dpukv
