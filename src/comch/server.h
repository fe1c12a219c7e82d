// Offload-side end of the control channel (doca_comch_server): listens on a UNIX
// socket path or an abstract name, accepts host clients, and serves each one until
// it leaves, misbehaves, or falls silent.
#pragma once

#include <sys/un.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "comch/channel.h"
#include "comch/wire.h"

namespace dpukv {

// Limits that keep one peer from locking others out. A connection that has not
// said HELLO yet is cheap to drop: when a limit is reached, the oldest of those (of
// the same uid for the per-uid limit) makes room for the new one, as sshd's
// MaxStartups does, so a flood of silent connections cannot keep a real client
// out. A refused client is told why (a REFUSED message) before the close.
struct ComchServerOptions : ComchOptions {
  std::string path;                        // socket path, or "@name" for an abstract socket
  mode_t mode = 0660;                      // permissions of a path socket
  uint32_t max_connections = 1024;         // beyond this, new clients are refused at accept
  uint32_t max_connections_per_uid = 256;  // one uid's share (0: no limit but the total)
  uint32_t hello_timeout_ms = 2000;        // a client must say HELLO within this
  uint32_t max_peer_heartbeat_ms = 60000;  // a HELLO asking for a longer interval is refused
  std::vector<uid_t> allowed_uids;         // empty: any uid the socket mode lets in
  // Asked at accept, with the peer's credentials: false refuses it (kNotAllowed).
  bool (*admit_peer)(void* arg, const PeerCred& peer) = nullptr;
  void* admit_arg = nullptr;
};

class ComchServer final : public ComchBase {
 public:
  static Status create(ProgressEngine* pe, const ComchServerOptions& opts,
                       std::unique_ptr<ComchServer>* out);
  ~ComchServer() override;

  const std::string& path() const { return sopts_.path; }
  uint64_t accepted() const { return accepted_; }
  uint64_t refused() const { return refused_; }
  // Connections the limits let in: max_connections, lowered at start when the
  // process's descriptor limit cannot hold that many (logged).
  uint32_t connection_limit() const { return limit_; }
  // Closes one client (e.g. for breaking policy). Its disconnect event follows.
  void disconnect(ComchConnection* c);
  uint64_t import_bytes_all() const override;
  // fn(arg, c) for every connection (not on a data path: figures, limits).
  void for_each_connection(void (*fn)(void* arg, const ComchConnection* c), void* arg) const;

 private:
  ComchServer(ProgressEngine* pe, const ComchServerOptions& opts);
  Status do_start() override;
  void do_stop() override;
  void on_handshake_msg(ComchConnection* c, const comch::MsgHeader& h,
                        const uint8_t* payload) override;
  void on_connection_closed(ComchConnection* c) override;
  void on_timer() override;
  void accept_all();
  void pause_listener(const char* why);
  // Makes room for a connection of uid under the limits, by dropping the oldest
  // connection still waiting for its HELLO; false (and *reason) if none can go.
  bool admit(uid_t uid, comch::RefuseReason* reason, uint32_t* limit);
  void refuse(int fd, comch::RefuseReason reason, uint32_t limit);
  // A new connection's fd: admitted, or refused (full: the reason when the total
  // is the limit, kFdLimit when the spare descriptor took it).
  void take(int fd, comch::RefuseReason full);
  bool accept_with_spare();
  void fit_descriptor_limit();

  struct Listener final : FdWatcher {
    ComchServer* owner = nullptr;
    int fd = -1;
    void on_fd_ready(uint32_t) override { owner->accept_all(); }
  } listener_;
  ComchServerOptions sopts_;
  std::unordered_map<uint64_t, ComchConnection*> conns_;
  uint64_t next_id_ = 1;
  std::unordered_map<uid_t, uint32_t> per_uid_;  // connections of each uid
  uint32_t limit_ = 0;                           // max_connections, fitted to the descriptor limit
  uint32_t uid_limit_ = 0;                       // max_connections_per_uid, lowered with it
  static constexpr uint32_t kAcceptTickMs = 20;
  uint64_t scan_ns_ = 0, last_scan_ns_ = 0;  // hello deadlines and heartbeats, every scan_ns_
  uint32_t accepts_this_tick_ = 0;
  bool paced_ = false;            // the listener rests until the next tick (accept budget)
  uint64_t paused_until_ns_ = 0;  // the listener is not watched until then
  int spare_fd_ = -1;             // given up at EMFILE to tell one client why
  uint64_t accepted_ = 0;
  uint64_t refused_ = 0;
};

// Fills a sockaddr_un for a path or "@abstract" name; INVALID_VALUE if too long.
Status make_unix_addr(const std::string& path, sockaddr_un* addr, socklen_t* len);

}  // namespace dpukv
