// Fast path of the control channel (doca_comch_consumer / producer): bulk and
// latency-critical messages through shared-memory rings instead of the socket.
//
// A consumer posts receive buffers from one of its maps. Its ring region (post
// ring + completion ring) and the map are exported to the peer over the control
// channel (CONSUMER_NEW), along with an eventfd doorbell. The peer's producer_send()
// copies a buffer straight into the next posted buffer, writes a completion with
// up to kMaxImmData bytes of immediate data, and rings the doorbell only if the
// consumer said it is going to sleep. A busy pair therefore makes no syscall per
// message; an idle one sleeps in epoll.
//
// Trust: each side keeps its own copy of the indices it owns and checks every
// index, offset, length and post id the other side wrote before using it. A peer
// that writes nonsense into the ring gets its connection closed.
//
// FastPath is the channel's part for all of this: its consumers, the producer side
// of the peer's consumers, their announcements. It reaches its channel only
// through FastPathHost.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "comch/connection.h"
#include "comch/wire.h"
#include "runtime/buf.h"
#include "runtime/context.h"
#include "runtime/mem_region.h"
#include "runtime/mmap.h"
#include "runtime/spsc_ring.h"

namespace dpukv {

inline constexpr uint32_t kMaxImmData = 48;

namespace fastpath {

struct PostEntry {
  uint64_t offset;    // in the consumer's data map
  uint32_t capacity;  // bytes the buffer can take
  uint32_t post_id;   // slot index, < queue size
};
static_assert(sizeof(PostEntry) == 16);

struct CompEntry {
  uint32_t post_id;
  uint32_t len;      // bytes written into the posted buffer
  uint32_t imm_len;  // <= kMaxImmData
  uint32_t reserved;
  uint8_t imm[kMaxImmData];
};
static_assert(sizeof(CompEntry) == 64);

// Shared region layout. Indices are free-running; slot = index & (queue_size - 1).
struct RingShared {
  static constexpr uint32_t kMagic = 0x50464b44;  // "DKFP"
  alignas(64) uint32_t magic;
  uint32_t queue_size;
  alignas(64) std::atomic<uint64_t> post_tail;          // consumer writes
  alignas(64) std::atomic<uint64_t> post_head;          // producer writes
  alignas(64) std::atomic<uint64_t> comp_tail;          // producer writes
  alignas(64) std::atomic<uint64_t> comp_head;          // consumer writes
  alignas(64) std::atomic<uint32_t> consumer_sleeping;  // consumer writes 1 before sleeping
  alignas(64) uint8_t entries[];  // PostEntry[queue_size] then CompEntry[queue_size]
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline size_t ring_bytes(uint32_t q) {
  return sizeof(RingShared) + static_cast<size_t>(q) * (sizeof(PostEntry) + sizeof(CompEntry));
}
inline PostEntry* posts(RingShared* r) {
  return reinterpret_cast<PostEntry*>(r->entries);
}
inline CompEntry* comps(RingShared* r, uint32_t q) {
  return reinterpret_cast<CompEntry*>(r->entries + static_cast<size_t>(q) * sizeof(PostEntry));
}

// A consumer of the peer, as this side's producer sees it (one per announcement).
struct PeerConsumer {
  ComchConnection* conn = nullptr;
  uint64_t id = 0;
  std::unique_ptr<Mmap> ring_map;
  RingShared* ring = nullptr;
  uint32_t q = 0;
  Mmap* data_map = nullptr;
  int doorbell_fd = -1;
  uint64_t post_head = 0;  // private copies of the indices the producer owns
  uint64_t comp_tail = 0;
};

}  // namespace fastpath

class FastPath;
class FastPathConsumer;

// What the fast path needs of the channel it belongs to (ComchBase implements it,
// as an NVMe queue pair reaches its controller through QueueTransport). Its
// methods are the channel's own, not a subclass's: they stay valid while the
// channel is torn down, when the fast path hands back what is posted.
class FastPathHost {
 public:
  // A control message now (with fds), or AGAIN.
  virtual Status send_ctrl(ComchConnection* c, comch::MsgType type, const void* payload,
                           uint32_t len, const int* fds, int nfds) = 0;
  virtual void close_connection(ComchConnection* c, Status reason, const char* why) = 0;
  // A posted buffer came back (the user's on_fp_recv).
  virtual void fast_path_received(FastPathConsumer* fc, Buf* buf, const uint8_t* imm,
                                  uint32_t imm_len, Status st, UserData ud) = 0;
  // A consumer of the peer appeared or expired (the user's callbacks).
  virtual void peer_consumer(ComchConnection* c, uint64_t id, bool created) = 0;

 protected:
  ~FastPathHost() = default;
};

class FastPathConsumer final : public FdWatcher {
 public:
  uint64_t id() const { return id_; }
  ComchConnection* connection() const { return conn_; }
  uint32_t queue_size() const { return q_; }
  uint32_t posted() const { return posted_; }

  // Posts buf's tail room as a receive buffer. AGAIN when queue_size buffers are
  // posted already. The buffer belongs to the channel until it comes back in a
  // receive callback.
  Status post_recv(Buf* buf, UserData ud);

  void on_fd_ready(uint32_t) override;

 private:
  friend class FastPath;
  FastPathConsumer() = default;
  size_t poll();
  bool arm();
  void disarm();

  FastPath* owner_ = nullptr;
  ComchConnection* conn_ = nullptr;
  uint64_t id_ = 0;
  uint32_t q_ = 0;
  Mmap* data_map_ = nullptr;
  std::unique_ptr<MemRegion> ring_mem_;
  std::unique_ptr<Mmap> ring_map_;
  fastpath::RingShared* ring_ = nullptr;
  int doorbell_ = -1;
  uint64_t post_tail_ = 0;  // private copies of the indices this side owns
  uint64_t comp_head_ = 0;
  uint32_t posted_ = 0;
  struct Slot {
    Buf* buf = nullptr;
    UserData ud{};
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  bool sleeping_ = false;
};

class FastPath {
 public:
  struct Counters {
    uint64_t sent = 0, received = 0, doorbells = 0;
  };
  // max_peer_consumers: how many consumers a peer may announce on a connection.
  FastPath(FastPathHost* host, ProgressEngine* pe, uint32_t max_peer_consumers)
      : host_(host), pe_(pe), max_peer_consumers_(max_peer_consumers) {}
  FastPath(const FastPath&) = delete;
  FastPath& operator=(const FastPath&) = delete;

  // As ComchBase's create_consumer, destroy_consumer and producer_send.
  Status create_consumer(ComchConnection* c, Mmap* map, uint32_t queue_size,
                         FastPathConsumer** out);
  Status destroy_consumer(FastPathConsumer* fc);
  Status producer_send(ComchConnection* c, uint64_t consumer_id, const Buf* src, const void* imm,
                       uint32_t imm_len);

  // The peer's control messages about its consumers, their payloads of the size
  // their type has (the channel checked). A bad one closes the connection.
  void on_consumer_new(ComchConnection* c, const uint8_t* payload, int* fds, int nfds);
  void on_consumer_expired(ComchConnection* c, const uint8_t* payload);
  // c is closing: its consumers' posted buffers come back (CONNECTION_RESET) now,
  // before the user hears of the disconnect; the rest goes with forget().
  void flush_consumers_of(ComchConnection* c);
  void forget(ComchConnection* c);

  size_t poll();
  bool arm();  // true: completions arrived meanwhile
  void disarm();
  const Counters& counters() const { return counters_; }

 private:
  friend class FastPathConsumer;
  void flush(FastPathConsumer* fc, Status why);
  fastpath::PeerConsumer* find_peer_consumer(const ComchConnection* c, uint64_t id);
  void close_connection(ComchConnection* c, Status reason, const char* why) {
    host_->close_connection(c, reason, why);
  }

  FastPathHost* host_;
  ProgressEngine* pe_;
  uint32_t max_peer_consumers_;
  std::vector<std::unique_ptr<FastPathConsumer>> consumers_;
  std::vector<std::unique_ptr<fastpath::PeerConsumer>> peer_consumers_;
  uint64_t next_consumer_id_ = 1;
  Counters counters_;
};

}  // namespace dpukv
