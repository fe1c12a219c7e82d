// Offload-side end of the control channel (doca_comch_server): listens on a UNIX
// socket path or an abstract name, accepts host clients, and serves each one until
// it leaves, misbehaves, or falls silent.
#pragma once

#include <sys/un.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "comch/channel.h"

namespace dpukv {

struct ComchServerOptions : ComchOptions {
  std::string path;                  // socket path, or "@name" for an abstract socket
  mode_t mode = 0660;                // permissions of a path socket
  uint32_t max_connections = 1024;   // beyond this, new clients are refused at accept
  uint32_t hello_timeout_ms = 2000;  // a client must say HELLO within this
  std::vector<uid_t> allowed_uids;   // empty: any uid the socket mode lets in
};

class ComchServer final : public ComchBase {
 public:
  static Status create(ProgressEngine* pe, const ComchServerOptions& opts,
                       std::unique_ptr<ComchServer>* out);
  ~ComchServer() override;

  const std::string& path() const { return sopts_.path; }
  uint64_t accepted() const { return accepted_; }
  uint64_t refused() const { return refused_; }
  // Closes one client (e.g. for breaking policy). Its disconnect event follows.
  void disconnect(ComchConnection* c);
  uint64_t import_bytes_all() const override;

 private:
  ComchServer(ProgressEngine* pe, const ComchServerOptions& opts);
  Status do_start() override;
  void do_stop() override;
  void on_handshake_msg(ComchConnection* c, const comch::MsgHeader& h,
                        const uint8_t* payload) override;
  void on_connection_closed(ComchConnection* c) override;
  void on_timer() override;
  void accept_all();

  struct Listener final : FdWatcher {
    ComchServer* owner = nullptr;
    int fd = -1;
    void on_fd_ready(uint32_t) override { owner->accept_all(); }
  } listener_;
  ComchServerOptions sopts_;
  std::unordered_map<uint64_t, ComchConnection*> conns_;
  uint64_t next_id_ = 1;
  uint64_t accepted_ = 0;
  uint64_t refused_ = 0;
};

// Fills a sockaddr_un for a path or "@abstract" name; INVALID_VALUE if too long.
Status make_unix_addr(const std::string& path, sockaddr_un* addr, socklen_t* len);

}  // namespace dpukv
