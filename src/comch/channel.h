// Control channel (doca_comch): bounded messages between the host side (client)
// and the offload side (server) over a UNIX SOCK_SEQPACKET socket, with memory
// exports passed as fds, heartbeats, and strict validation of everything the peer
// sends. ComchServer and ComchClient share this base; see server.h and client.h.
//
// Threading: a channel is a Context and belongs to its progress engine's thread.
// Every callback runs inside ProgressEngine::progress().
//
// Bad input from a peer (garbage, wrong sequence, oversized or truncated records,
// unexpected fds, a bad export) closes that connection with a logged reason and a
// disconnect event; other connections are not affected.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comch/connection.h"
#include "comch/fast_path.h"
#include "comch/wire.h"
#include "runtime/clock.h"  // monotonic_ns, used by every comch user
#include "runtime/context.h"
#include "runtime/mmap.h"
#include "runtime/spsc_ring.h"
#include "runtime/task_pool.h"

namespace dpukv {

class ComchBase;
class ComchConnection;
class FastPathConsumer;

// Options shared by both ends. Defaults live here and only here.
struct ComchOptions {
  uint32_t max_msg_size = comch::kDefaultMaxMsg;  // user payload bound, <= 65536
  uint32_t send_queue_depth = 64;  // per connection: messages waiting for socket room
  uint32_t recv_budget = 64;       // messages handled per connection per progress()
  uint32_t heartbeat_interval_ms = 1000;
  // Silence of interval x misses = peer gone. A peer that exits closes the socket
  // and is seen at once; heartbeats only find a peer that hangs, so the bound is
  // generous: an inference host's CPUs are often saturated, and a peer starved of
  // CPU for a few seconds is slow, not gone (docs/architecture.md: what each side
  // survives).
  uint32_t heartbeat_misses = 10;
  uint32_t max_imports_per_connection = 64;
  // Bytes of exported memory one peer may map here, over all its exports and the
  // memory it shares by other means (set_other_import_bytes: the agent's GPU
  // exports): the agent's per-client staging cap. An export past it closes the
  // connection, before anything is mapped.
  uint64_t max_import_bytes_per_connection = UINT64_MAX;
  // The same over every connection together (the agent's staging cap for all its
  // clients): a few clients cannot take the host's memory between them.
  uint64_t max_import_bytes_total = UINT64_MAX;
  // Asked last, before an import past the limits above is mapped: false refuses
  // it, *why a static text. (The agent: staging over all of its sockets, and a
  // tenant's share over all of its clients.)
  bool (*import_allowed)(void* arg, const ComchConnection* c, uint64_t more,
                         const char** why) = nullptr;
  void* import_arg = nullptr;

  bool valid() const {
    return max_msg_size != 0 && max_msg_size <= comch::kMaxMsgLimit && send_queue_depth != 0 &&
           recv_budget != 0 && heartbeat_interval_ms != 0 && heartbeat_misses != 0;
  }
};

class ComchSendTask {
 public:
  ComchConnection* connection() const { return conn_; }
  Status status() const { return status_; }
  UserData user_data() const { return ud_; }

 private:
  friend class ComchBase;
  enum class State : uint8_t { kFree, kAllocated, kQueued, kDone };
  ComchConnection* conn_ = nullptr;
  std::unique_ptr<uint8_t[]> buf_;  // header + payload, max size
  uint32_t len_ = 0;                // bytes in buf_
  int fd_ = -1;                     // borrowed fd to pass (exports)
  UserData ud_{};
  Status status_;
  State state_ = State::kFree;
};

using ComchSendCb = void (*)(ComchSendTask* task, UserData task_ud, UserData ctx_ud);

struct ComchCallbacks {
  void (*on_connect)(ComchConnection* c, UserData ctx_ud) = nullptr;
  // The connection and every map imported through it stay valid until this returns;
  // maps with live buffers are kept until the last buffer is released.
  void (*on_disconnect)(ComchConnection* c, Status reason, UserData ctx_ud) = nullptr;
  void (*on_recv)(ComchConnection* c, const uint8_t* data, uint32_t len, UserData ctx_ud) = nullptr;
  // A peer exported memory; map is imported and started, owned by the connection.
  void (*on_export)(ComchConnection* c, Mmap* map, uint64_t cookie, UserData ctx_ud) = nullptr;
  // Fast path: a consumer on the peer appeared or expired.
  void (*on_consumer_new)(ComchConnection* c, uint64_t consumer_id, UserData ctx_ud) = nullptr;
  void (*on_consumer_expired)(ComchConnection* c, uint64_t consumer_id, UserData ctx_ud) = nullptr;
  ComchSendCb on_send_done = nullptr;
  ComchSendCb on_send_error = nullptr;
  // Fast path: a posted buffer came back. SUCCESS: it holds a message (data_len grew
  // by its length) and imm/imm_len its immediate data. SHUTDOWN or CONNECTION_RESET:
  // flushed unused when the consumer or its connection went away.
  void (*on_fp_recv)(FastPathConsumer* c, Buf* buf, const uint8_t* imm, uint32_t imm_len, Status st,
                     UserData buf_ud, UserData ctx_ud) = nullptr;
};

class ComchBase : public Context, public FastPathHost {
 public:
  ~ComchBase() override;

  // IDLE only. Callbacks may be null except the send callbacks when tasks are used.
  Status set_callbacks(const ComchCallbacks& cb);
  Status set_send_conf(uint32_t num_tasks);

  // A message of len bytes (copied into the task). TOO_BIG above the connection's
  // max message size; NO_MEMORY if the pool is empty; BAD_STATE if not open.
  Status send_alloc_init(ComchConnection* c, const void* data, uint32_t len, UserData ud,
                         ComchSendTask** out);
  // The same, but the caller writes the len bytes at *payload before submitting: a
  // message assembled in place instead of in a buffer of its own and copied.
  Status send_alloc_payload(ComchConnection* c, uint32_t len, UserData ud, ComchSendTask** out,
                            uint8_t** payload);
  // Exports map to the peer (its fd travels with the message). The map must stay
  // started until the task completes.
  Status export_alloc_init(ComchConnection* c, const Mmap& map, uint64_t cookie, UserData ud,
                           ComchSendTask** out);
  // SUCCESS: completes through a callback. AGAIN: the connection's send queue is
  // full (backpressure); retry after progress().
  Status submit(ComchSendTask* t);
  Status free(ComchSendTask* t);

  // Fast path. A consumer receives into buffers posted from map, which must allow
  // export read-write; it is announced to the peer at once (AGAIN if the socket
  // is full). Valid until destroy_consumer() or its connection's disconnect.
  Status create_consumer(ComchConnection* c, Mmap* map, uint32_t queue_size,
                         FastPathConsumer** out);
  // Flushes its posted buffers (SHUTDOWN) and tells the peer it expired.
  Status destroy_consumer(FastPathConsumer* consumer);
  // Producer: copies src's data into the next buffer the peer's consumer posted,
  // with imm_len bytes of immediate data. Synchronous: SUCCESS means the message
  // is in the peer's memory and published. AGAIN: no buffer posted (or completions
  // not drained yet). NOT_FOUND: no such consumer. TOO_BIG: src larger than the
  // posted buffer or imm_len > kMaxImmData.
  Status producer_send(ComchConnection* c, uint64_t consumer_id, const Buf* src, const void* imm,
                       uint32_t imm_len);

  const ComchOptions& options() const { return opts_; }
  size_t num_connections() const { return num_open_; }
  // Imported and otherwise shared bytes over every connection (import limits).
  virtual uint64_t import_bytes_all() const = 0;
  // Whether `more` bytes may be mapped for c within both import limits; if not,
  // why (for the connection's close reason and the agent's refusal).
  bool import_fits(const ComchConnection* c, uint64_t more, const char** why) const;

  // Counters, for tests and metrics.
  struct Counters {
    uint64_t msgs_sent = 0, msgs_received = 0, bytes_received = 0;
    uint64_t protocol_errors = 0, heartbeat_timeouts = 0, connections_closed = 0;
    uint64_t imports = 0, imports_released = 0;
    uint64_t fp_sent = 0, fp_received = 0, fp_doorbells = 0;
  };
  Counters counters() const;

 protected:
  ComchBase(ProgressEngine* pe, const ComchOptions& opts);

  // Subclass hooks.
  virtual void on_handshake_msg(ComchConnection* c, const comch::MsgHeader& h,
                                const uint8_t* payload) = 0;
  virtual void on_connection_closed(ComchConnection* c) = 0;

  ComchConnection* new_connection(int fd, uint64_t id);
  // What a handshake settled, recorded on the connection: the peer's credentials
  // (server, at accept), the message bound and the peer's heartbeat (both ends),
  // and the id the server gave it (client).
  static void set_peer(ComchConnection* c, const PeerCred& peer) { c->peer_ = peer; }
  static void agree(ComchConnection* c, uint32_t max_msg, uint32_t peer_heartbeat_ms) {
    c->max_msg_ = max_msg;
    c->peer_heartbeat_ms_ = peer_heartbeat_ms;
  }
  static void set_id(ComchConnection* c, uint64_t id) { c->id_ = id; }
  // Sends a control message now, or AGAIN. Bypasses the task pool and send queue.
  Status send_ctrl(ComchConnection* c, comch::MsgType type, const void* payload, uint32_t len,
                   const int* fds = nullptr, int nfds = 0) override;
  void open_connection(ComchConnection* c);
  void close_connection(ComchConnection* c, Status reason, const char* why) override;
  void heartbeat_tick(ComchConnection* c, uint64_t now);
  Status start_timer(uint32_t period_ms);
  void stop_timer();
  virtual void on_timer() = 0;
  size_t poll() override;
  bool arm_notification() override;
  void disarm_notification() override;
  bool drained() override;
  void reap();

  // Reads what the connection has (a server reads a new client's HELLO at once).
  void on_conn_ready(ComchConnection* c, uint32_t events);

 private:
  // A subclass reads its options through options() and changes the channel's
  // state only through the methods above: records, heartbeats, import limits and
  // the task pool are this class's alone.
  friend class ComchConnection;  // release_import counts here
  ComchOptions opts_;
  ComchCallbacks cb_;
  Counters counters_;
  size_t num_open_ = 0;
  void handle_record(ComchConnection* c, size_t n, int* fds, int nfds);
  void flush_pending(ComchConnection* c);
  Status write_task(ComchConnection* c, ComchSendTask* t);
  void finish_task(ComchSendTask* t, Status st);

  struct Timer final : FdWatcher {
    ComchBase* owner = nullptr;
    int fd = -1;
    void on_fd_ready(uint32_t) override;
  } timer_;
  TaskPool<ComchSendTask> pool_;
  std::unique_ptr<SpscRing<ComchSendTask*>> done_;  // completed, to deliver
  std::unique_ptr<uint8_t[]> rx_;                   // one record
  std::vector<ComchConnection*> graveyard_;
  std::vector<std::unique_ptr<Mmap>> dead_maps_;  // released with live buffers
  // FastPathHost: the user's callbacks for what the fast path hands back.
  void fast_path_received(FastPathConsumer* fc, Buf* buf, const uint8_t* imm, uint32_t imm_len,
                          Status st, UserData ud) override;
  void peer_consumer(ComchConnection* c, uint64_t id, bool created) override;
  FastPath fp_;  // the fast path's consumers and the peer's
};

}  // namespace dpukv
