#include "comch/client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "comch/server.h"
#include "runtime/log.h"

namespace dpukv {

using comch::MsgType;

ComchClient::ComchClient(ProgressEngine* pe, const ComchClientOptions& opts)
    : ComchBase(pe, opts), copts_(opts) {}

Status ComchClient::create(ProgressEngine* pe, const ComchClientOptions& opts,
                           std::unique_ptr<ComchClient>* out) {
  if (pe == nullptr || out == nullptr || opts.path.empty()) return Code::kInvalidValue;
  if (!opts.valid() || opts.retry_interval_ms == 0) return Code::kInvalidValue;
  out->reset(new ComchClient(pe, opts));
  return Code::kSuccess;
}

ComchClient::~ComchClient() = default;

Status ComchClient::do_start() {
  start_ns_ = monotonic_ns();
  last_error_ = Code::kSuccess;
  refusal_ = nullptr;
  closing_ = false;
  uint32_t tick = std::max<uint32_t>(
      5, std::min(copts_.retry_interval_ms, options().heartbeat_interval_ms / 4));
  DPUKV_RETURN_IF_ERROR(start_timer(tick));
  Status st = try_connect();
  if (!st.ok() && st != Code::kAgain) {
    stop_timer();
    return st;
  }
  return Code::kInProgress;  // RUNNING once HELLO_ACK arrives
}

Status ComchClient::try_connect() {
  last_try_ns_ = monotonic_ns();
  sockaddr_un addr;
  socklen_t alen;
  DPUKV_RETURN_IF_ERROR(make_unix_addr(copts_.path, &addr, &alen));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Code::kDriver;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0) {
    int e = errno;
    ::close(fd);
    // No server yet, or its backlog is full: try again on the next tick.
    if (e == ENOENT || e == ECONNREFUSED || e == EAGAIN) {
      last_error_ = Code::kNotFound;
      return Code::kAgain;
    }
    last_error_ = e == EACCES ? Code::kNotPermitted : Code::kDriver;
    return last_error_;
  }
  conn_ = new_connection(fd, 0);
  if (conn_ == nullptr) return Code::kDriver;
  ucred cred{};
  socklen_t clen = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0)
    set_peer(conn_, PeerCred{cred.pid, cred.uid, cred.gid});
  comch::HelloPayload hello{options().max_msg_size, options().heartbeat_interval_ms, 0};
  Status st = send_ctrl(conn_, MsgType::kHello, &hello, sizeof(hello));
  if (!st.ok()) {
    close_connection(conn_, Code::kConnectionReset, "cannot send HELLO");
    return Code::kAgain;
  }
  return Code::kSuccess;
}

void ComchClient::on_handshake_msg(ComchConnection* c, const comch::MsgHeader& h,
                                   const uint8_t* payload) {
  if (static_cast<MsgType>(h.type) == MsgType::kRefused) {
    comch::RefusedPayload r;
    std::memcpy(&r, payload, sizeof(r));
    refusal_ = comch::refuse_reason_text(r.reason);
    const auto why = static_cast<comch::RefuseReason>(r.reason);
    // A limit may have room on the next try; a refused uid or HELLO will not.
    const bool final =
        why == comch::RefuseReason::kNotAllowed || why == comch::RefuseReason::kBadHello;
    last_error_ = why == comch::RefuseReason::kNotAllowed ? Code::kNotPermitted
                  : why == comch::RefuseReason::kBadHello ? Code::kInvalidValue
                                                          : Code::kFull;
    if (r.limit != 0) {
      LOG_WARN_LIMITED("comch: %s refused the connection: %s (limit %u)", copts_.path.c_str(),
                       refusal_, r.limit);
    } else {
      LOG_WARN_LIMITED("comch: %s refused the connection: %s", copts_.path.c_str(), refusal_);
    }
    close_connection(c, Code::kConnectionReset, "refused by the server");
    if (final) {
      const Status keep = last_error_;
      const char* words = refusal_;
      (void)stop();
      last_error_ = keep;
      refusal_ = words;
    }
    return;
  }
  if (static_cast<MsgType>(h.type) != MsgType::kHelloAck) {
    close_connection(c, Code::kInvalidValue, "server did not answer HELLO");
    return;
  }
  comch::HelloAckPayload ack;
  std::memcpy(&ack, payload, sizeof(ack));
  if (ack.max_msg == 0 || ack.max_msg > options().max_msg_size || ack.heartbeat_ms == 0) {
    close_connection(c, Code::kInvalidValue, "bad HELLO_ACK");
    return;
  }
  set_id(c, ack.connection_id);
  agree(c, ack.max_msg, ack.heartbeat_ms);
  set_state(CtxState::kRunning);
  open_connection(c);
}

void ComchClient::on_connection_closed(ComchConnection* c) {
  if (c == conn_) conn_ = nullptr;
  if (closing_) return;
  if (state() == CtxState::kRunning) {
    // The session is over: flush and go back to IDLE; the user may start() again.
    last_error_ = Code::kConnectionReset;
    (void)stop();
  }
  // In STARTING, the timer retries.
}

void ComchClient::do_stop() {
  closing_ = true;
  stop_timer();
  if (conn_ != nullptr) close_connection(conn_, Code::kShutdown, "client stopping");
  conn_ = nullptr;
}

void ComchClient::on_timer() {
  const uint64_t now = monotonic_ns();
  if (state() == CtxState::kStarting) {
    if (conn_ == nullptr) {
      if (copts_.connect_timeout_ms != 0 &&
          now - start_ns_ > static_cast<uint64_t>(copts_.connect_timeout_ms) * 1000000ull) {
        if (refusal_ == nullptr)
          LOG_WARN("comch: no server at %s within %u ms", copts_.path.c_str(),
                   copts_.connect_timeout_ms);
        Status keep = last_error_.ok() ? Status(Code::kTimeout) : last_error_;
        const char* words = refusal_;
        (void)stop();
        last_error_ = keep;
        refusal_ = words;
        return;
      }
      if (now - last_try_ns_ >= static_cast<uint64_t>(copts_.retry_interval_ms) * 1000000ull) {
        Status st = try_connect();
        if (!st.ok() && st != Code::kAgain) {
          Status keep = st;
          const char* words = refusal_;
          (void)stop();
          last_error_ = keep;
          refusal_ = words;
        }
      }
    } else if (now - conn_->opened_ns() > static_cast<uint64_t>(options().heartbeat_interval_ms) *
                                              options().heartbeat_misses * 1000000ull) {
      close_connection(conn_, Code::kTimeout, "server did not answer HELLO in time");
    }
    return;
  }
  if (conn_ != nullptr) heartbeat_tick(conn_, now);
}

}  // namespace dpukv
