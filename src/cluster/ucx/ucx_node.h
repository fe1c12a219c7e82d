// One agent's endpoint in the cluster, over UCX (ucp): the memory it lets peers
// read (the memory tier's arena, mapped once with ucp_mem_map), the description a
// peer needs to read it (worker address, region, packed remote key), one-sided
// reads of a peer's region straight into local memory (ucp_get_nbx: RDMA where the
// fabric has it, TCP or shared memory otherwise; UCX chooses), and small control
// messages as active messages. A Context on the agent's progress engine: the
// worker's event fd joins its epoll set, no polling thread.
//
// Trust: a peer's description and every control message are checked (sizes,
// magic, version); a read is checked against the region the peer described.
// A peer whose endpoint fails (killed, partitioned) fails its reads with
// CONNECTION_RESET and is counted; others are served as before.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/context.h"
#include "runtime/progress_engine.h"
#include "runtime/status.h"

namespace dpukv {

struct UcxNodeOptions {
  uint32_t max_reads = 1024;  // reads in flight
  uint32_t max_peers = 256;
  // Endpoints report a dead peer (its reads fail, it is counted). UCX 1.13 has no
  // peer-failure handling on its shared-memory transports, so with this on, two
  // agents on one host talk over TCP loopback (0.11-0.14x memcpy here); off, UCX
  // may pick shared memory (cma: 0.77-0.81x memcpy) but a peer's death is not
  // reported: use it only between agents that live and die together.
  bool detect_peer_failure = true;
};

// What a peer publishes (through the directory): parsed and checked.
struct PeerDescription {
  uint64_t node_id = 0;
  uint64_t region_base = 0, region_len = 0;
  std::string worker_address;  // ucp worker address bytes
  std::string rkey;            // packed remote key of the region
};
// INVALID_VALUE unless blob is a whole, well-formed description.
Status parse_peer_description(const uint8_t* blob, size_t len, PeerDescription* out);

class UcxNode final : public Context {
 public:
  using DoneCb = void (*)(void* arg, Status st);
  // sender: the node id the message names; peer: its index if this node is
  // connected to that node, else kUnknownPeer.
  using ControlCb = void (*)(void* arg, uint64_t sender, uint32_t peer, const uint8_t* msg,
                             size_t len);
  static constexpr uint32_t kUnknownPeer = UINT32_MAX;
  static constexpr size_t kMaxControl = 4096;

  struct Counters {
    uint64_t reads = 0, read_bytes = 0, read_errors = 0;
    uint64_t controls_sent = 0, controls_received = 0, bad_messages = 0, peers_failed = 0;
  };

  static Status create(ProgressEngine* pe, const UcxNodeOptions& o, std::unique_ptr<UcxNode>* out);
  // What create() sets in the environment where the user set nothing (UCX's
  // transports read it when they open): non-blocking TCP connects, TCP segments
  // of 256 KiB out and 512 KiB in.
  static void set_transport_defaults();
  // The UCX version and the transport settings from the environment.
  static std::string settings();
  ~UcxNode() override;

  // Lets peers read [base, base + len). Once, while IDLE.
  Status expose(void* base, uint64_t len);
  // This node's description for peers (after expose()).
  Status description(std::string* blob) const;
  uint64_t node_id() const { return node_id_; }

  // Connects to a peer (RUNNING); *peer is its index for read() and send_control().
  Status connect(const uint8_t* blob, size_t len, uint32_t* peer);
  void disconnect(uint32_t peer);
  bool peer_ok(uint32_t peer) const;

  // Reads len bytes at offset in the peer's region into dst; cb on this engine's
  // thread. INVALID_VALUE for a range outside the region, AGAIN when max_reads are
  // in flight, CONNECTION_RESET for a failed peer.
  Status read(uint32_t peer, uint64_t offset, void* dst, uint64_t len, DoneCb cb, void* arg);

  void set_control_handler(ControlCb cb, void* arg);
  // Sends up to kMaxControl bytes (copied: the caller's buffer is free on return).
  Status send_control(uint32_t peer, const void* msg, size_t len);

  const Counters& counters() const { return counters_; }

 private:
  struct Peer;
  struct ReadSlot;
  struct SendSlot;
  // UCX's event fd stays readable until the worker is armed again. Armed only before
  // a sleep, it read as ready on every pass of a busy engine, which so never slept:
  // an idle agent with a live peer spun a core. Arming it as it fires drains it; if
  // UCX still has events (BUSY), poll() in the same pass takes them.
  struct EfdWatch final : FdWatcher {
    UcxNode* owner = nullptr;
    void on_fd_ready(uint32_t) override { (void)owner->arm_notification(); }
  };

  UcxNode(ProgressEngine* pe, const UcxNodeOptions& o);
  Status init();
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override;

  static void read_done(void* request, ucs_status_t st, void* user);
  static void send_done(void* request, ucs_status_t st, void* user);
  static void ep_failed(void* arg, ucp_ep_h ep, ucs_status_t st);
  static ucs_status_t on_control(void* arg, const void* header, size_t header_len, void* data,
                                 size_t len, const ucp_am_recv_param_t* param);
  void finish_read(ReadSlot* s, Status st);

  UcxNodeOptions opts_;
  uint64_t node_id_ = 0;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  EfdWatch efd_watch_;
  ucp_mem_h memh_ = nullptr;
  void* region_ = nullptr;
  uint64_t region_len_ = 0;
  std::string rkey_;
  std::string address_;
  std::vector<std::unique_ptr<Peer>> peers_;
  // Disconnected peers whose endpoint close is still under way (never waited for on
  // the engine's thread: closing an endpoint to a partitioned peer can take long).
  std::vector<std::unique_ptr<Peer>> closing_;
  // UCX < 1.14 only: endpoints to peers that never answered, kept open until the
  // process ends because closing them aborts (see ucx_node.cc).
  std::vector<std::unique_ptr<Peer>> unanswered_;
  bool purge_aborts_ = false;
  void reap_closed();
  std::vector<ReadSlot> reads_;
  std::vector<ReadSlot*> free_reads_;
  std::vector<std::unique_ptr<SendSlot>> sends_;  // control messages in flight
  uint32_t inflight_ = 0;
  ControlCb control_cb_ = nullptr;
  void* control_arg_ = nullptr;
  Counters counters_;
};

}  // namespace dpukv
