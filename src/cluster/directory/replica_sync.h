// Keeps this node's DirectoryReplica complete and current: a Redis connection of
// its own subscribed to PREFIX:events (every node publishes its edits there after
// applying them), and, each time the subscription starts, a SCAN of every holder
// entry over the directory's command connection, merged into what the events say.
//
// Contract:
//  - ready() only while subscribed and a scan begun after the subscription has
//    finished: the replica then holds every holder Redis listed when the scan read
//    it, and every edit published since the subscription. Lookups may be answered
//    from it.
//  - Losing the subscription clears the replica (events may have been missed);
//    it is scanned again when the subscription is back. More than max_keys chunks
//    stop replication for good (lookups go back to Redis), said once in the log.
//  - Malformed events and holder entries are counted and ignored; a failed scan
//    is retried after retry_ms.
//
// Threading: the directory's progress engine; every call and callback on its thread.
#pragma once

#include <hiredis/async.h>

#include <cstdint>
#include <string>

#include "cluster/directory/directory_keys.h"
#include "cluster/directory/directory_replica.h"
#include "cluster/directory/redis_link.h"
#include "runtime/progress_engine.h"

namespace dpukv {

struct ReplicaSyncOptions {
  std::string host;
  uint16_t port = 0;
  std::string user, password;
  uint32_t retry_ms = 1000;
  uint32_t connect_timeout_ms = 2000;
  size_t max_keys = 1u << 20;
};

class ReplicaSync {
 public:
  struct Counters {
    uint64_t events = 0, bad_events = 0;  // event messages received; malformed ones
    uint64_t syncs = 0;                   // scans that made the replica complete
    uint64_t bad_entries = 0;             // scanned holder lists that were not one
    uint64_t errors = 0;                  // scan replies that were errors or malformed
  };

  // keys: the directory's names; link: its command connection, which carries the
  // scans (the subscribed connection can send nothing else).
  ReplicaSync(ProgressEngine* pe, const ReplicaSyncOptions& o, const DirectoryKeys* keys,
              RedisLink* link);
  ~ReplicaSync();
  ReplicaSync(const ReplicaSync&) = delete;
  ReplicaSync& operator=(const ReplicaSync&) = delete;

  void start(uint64_t now_ms);  // connects the subscription (retried from poll)
  void close() { feed_.close(); }
  void drop() { feed_.drop(); }
  bool open() const { return feed_.open(); }
  bool connecting() const { return feed_.open() && !feed_.up(); }
  // The command connection is up again: a subscription waiting for its scan
  // starts it now.
  void link_up();
  // Reconnects a lost subscription, drops one Redis does not answer, retries a
  // failed scan (with the command connection up).
  void poll(uint64_t now_ms, bool link_up);
  void service() { feed_.service(); }

  bool ready() const { return ready_; }
  const DirectoryReplica& replica() const { return replica_; }
  // A holder said it does not hold k (a stale entry).
  void forget(const ChunkKey& k, uint64_t node) { replica_.drop(k, node); }
  const Counters& counters() const { return counters_; }

 private:
  struct ScanStep;
  struct ScanBatch;
  static void on_feed_up(void* owner);
  static void on_feed_down(void* owner, const char* why);
  static void on_feed_message(redisAsyncContext* c, void* reply, void* priv);
  static void on_scan(redisAsyncContext* c, void* reply, void* priv);
  static void on_scan_values(redisAsyncContext* c, void* reply, void* priv);
  void start_scan();
  void send_scan(const std::string& cursor);
  void scan_failed();
  void scan_settled();
  void overflowed();

  ReplicaSyncOptions opts_;
  const DirectoryKeys* keys_;
  RedisLink* link_;
  DirectoryReplica replica_;
  bool subscribed_ = false, ready_ = false, off_ = false;
  bool scanning_ = false, cursor_done_ = false;
  uint64_t epoch_ = 0;    // replies to a scan of an earlier epoch are ignored
  uint32_t batches_ = 0;  // MGETs of scanned keys not answered yet
  uint64_t retry_at_ms_ = 0, scan_retry_at_ms_ = 0, started_ms_ = 0;
  Counters counters_;
  RedisLink feed_;  // last: destroyed first, while what its callbacks touch exists
};

}  // namespace dpukv
