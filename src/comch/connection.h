// One peer of a control channel (channel.h): its socket, credentials, sequence
// numbers, unsent messages and the memory it exported. The channel owns it and
// drives it; the fast path (fast_path.h) reads only its public side.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/context.h"
#include "runtime/mmap.h"
#include "runtime/spsc_ring.h"

namespace dpukv {

class ComchBase;
class ComchSendTask;

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  // Its supplementary groups as the kernel saw them at connect (SO_PEERGROUPS),
  // the first kMaxGroups; tenancy rules and the admin group match on them too.
  static constexpr uint32_t kMaxGroups = 32;
  uint32_t ngroups = 0;
  gid_t groups[kMaxGroups] = {};
  bool in_group(gid_t g) const {
    if (gid == g) return true;
    for (uint32_t i = 0; i < ngroups; ++i)
      if (groups[i] == g) return true;
    return false;
  }
};

// One peer. Owned by its channel; valid from on_connect until on_disconnect returns.
class ComchConnection final : public FdWatcher {
 public:
  uint64_t id() const { return id_; }
  const PeerCred& peer() const { return peer_; }
  UserData user_data() const { return ud_; }
  void set_user_data(UserData ud) { ud_ = ud; }
  bool open() const { return state_ == State::kOpen; }
  uint32_t max_msg() const { return max_msg_; }
  // A map the peer exported, by the peer's map id; nullptr if none.
  Mmap* imported_map(uint64_t peer_map_id) const;
  // Bytes of every map the peer exported on this connection.
  uint64_t imported_bytes() const;
  // Memory the peer shares outside comch's exports (GPU memory the agent opened
  // for it), counted against the import limits with the maps.
  void set_other_import_bytes(uint64_t n) { other_import_bytes_ = n; }
  uint64_t other_import_bytes() const { return other_import_bytes_; }
  // Drops an imported map early (the peer unregistered it). The map must have no
  // live buffers. NOT_FOUND if the connection does not hold it.
  Status release_import(Mmap* map);
  int fd() const { return fd_; }
  // When its socket was taken (a server closes one that stays silent too long).
  uint64_t opened_ns() const { return opened_ns_; }

  void on_fd_ready(uint32_t events) override;

 private:
  // Its channel alone drives it; the server and the client record what their
  // handshake agreed through the channel's protected helpers (ComchBase::agree).
  friend class ComchBase;
  enum class State : uint8_t { kHandshake, kOpen, kClosed };
  ComchConnection(ComchBase* owner, int fd, uint64_t id, uint32_t queue_depth);
  ~ComchConnection() = default;

  ComchBase* owner_;
  int fd_;
  uint64_t id_;
  PeerCred peer_;
  UserData ud_{};
  State state_ = State::kHandshake;
  uint32_t send_seq_ = 0;
  uint32_t recv_seq_ = 0;
  uint32_t max_msg_;
  uint32_t peer_heartbeat_ms_;
  uint64_t opened_ns_ = 0;
  uint64_t last_send_ns_ = 0;
  uint64_t last_recv_ns_ = 0;
  bool want_out_ = false;
  uint32_t task_refs_ = 0;            // tasks naming this connection; freed only at 0
  SpscRing<ComchSendTask*> pending_;  // single-threaded FIFO of unsent tasks
  std::vector<std::unique_ptr<Mmap>> imports_;
  uint64_t other_import_bytes_ = 0;
};

}  // namespace dpukv
