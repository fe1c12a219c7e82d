// Host-side end of the control channel (doca_comch_client). start() returns
// IN_PROGRESS and the context stays STARTING until the server answers HELLO; it
// retries the connection every retry_interval_ms until connect_timeout_ms (0 =
// forever). When the connection ends (server gone, heartbeat silence, protocol
// error) the context fails its in-flight sends with CONNECTION_RESET, reports
// on_disconnect, and returns to IDLE; start() again reconnects.
#pragma once

#include <string>

#include "comch/channel.h"
#include "comch/wire.h"

namespace dpukv {

struct ComchClientOptions : ComchOptions {
  std::string path;                 // server socket path or "@name"
  uint32_t connect_timeout_ms = 0;  // 0: keep trying until stop()
  uint32_t retry_interval_ms = 50;
};

class ComchClient final : public ComchBase {
 public:
  static Status create(ProgressEngine* pe, const ComchClientOptions& opts,
                       std::unique_ptr<ComchClient>* out);
  ~ComchClient() override;

  // The connection while RUNNING, else nullptr.
  ComchConnection* connection() const {
    return conn_ != nullptr && conn_->open() ? conn_ : nullptr;
  }
  // Why the last connection attempt or connection ended. FULL: the server refused
  // for a limit (it may have room later); NOT_PERMITTED: refused for this uid;
  // INVALID_VALUE: it refused our HELLO.
  Status last_error() const { return last_error_; }
  // The server's words for its last refusal (comch::refuse_reason_text), or nullptr
  // if the last attempt was not refused.
  const char* refusal() const { return refusal_; }
  uint64_t import_bytes_all() const override {
    return conn_ != nullptr ? conn_->imported_bytes() + conn_->other_import_bytes() : 0;
  }

 private:
  ComchClient(ProgressEngine* pe, const ComchClientOptions& opts);
  Status do_start() override;
  void do_stop() override;
  void on_handshake_msg(ComchConnection* c, const comch::MsgHeader& h,
                        const uint8_t* payload) override;
  void on_connection_closed(ComchConnection* c) override;
  void on_timer() override;
  Status try_connect();

  ComchClientOptions copts_;
  ComchConnection* conn_ = nullptr;
  uint64_t start_ns_ = 0;
  uint64_t last_try_ns_ = 0;
  Status last_error_;
  const char* refusal_ = nullptr;
  bool closing_ = false;
};

}  // namespace dpukv
