// The NVMe/TCP transport's queue pair: one TCP connection of one controller.
// It parses PDUs (ICReq, command capsules, H2CData), checks digests and lengths,
// hands commands to its controller and sends responses, R2T and C2HData.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "nvmf/core/poll_group.h"
#include "nvmf/core/target_side.h"
#include "nvmf/tcp/tcp_transport_options.h"
#include "runtime/clock.h"

namespace dpukv::nvme {

class TcpConnection final : public ControllerCore::QueueTransport, public PollWatcher {
 public:
  // poll_fd: the poll group's epoll set, which fd is in (close() takes it out: a
  // plain call, as close runs when the process may be out of descriptors).
  TcpConnection(TargetSide* t, const TcpTransportOptions* opts, int poll_fd, int fd,
                std::string listener)
      : PollWatcher(&readable),
        t_(t),
        opts_(opts),
        poll_fd_(poll_fd),
        fd_(fd),
        listener_(std::move(listener)),
        opened_ms_(monotonic_ms()) {
    // Grown as PDUs need (on_readable): a connection that sends nothing costs little.
    rbuf_.resize(8 * 1024);
  }
  ~TcpConnection() {
    if (fd_ >= 0) ::close(fd_);
    if (data_area_ != nullptr) munmap(data_area_, data_area_len_);
  }

  int fd() const { return fd_; }
  bool closed() const override { return closing_; }
  bool ready() const { return ready_; }  // its ICReq was answered
  uint64_t opened_ms() const { return opened_ms_; }
  uint64_t ready_ms() const { return ready_ms_; }  // when its ICReq was answered
  // Since when the first PDU still incomplete in the buffer has been waiting for
  // its rest (0: none waits).
  uint64_t partial_since_ms() const { return partial_since_ms_; }
  const std::string& listener() const { return listener_; }
  bool idle() const { return busy_slots_ == 0; }
  FabricsController* controller() const { return ctrl_; }
  uint16_t qid() const { return qid_; }

  // Reads what the socket has and handles every whole PDU in it. Returns work done.
  int on_readable();
  static int readable(PollWatcher* self, uint32_t) {
    return static_cast<TcpConnection*>(self)->on_readable();
  }
  // Sends pending output; returns false if the connection broke.
  bool flush();
  bool has_output() const { return !segs_.empty(); }
  void close(const char* why) override;
  void req_complete(ControllerCore::Request* r, uint16_t status) override;
  // Ends a request without a response (an AER at reset or disconnect).
  void req_drop(ControllerCore::Request* r) override;

 private:
  // A slot's life, as SPDK's TCP_REQUEST_STATE_*: kFree -> kExecuting (a command
  // capsule took it) [-> kAwaitingData -> kExecuting, for host data sent by R2T and
  // H2CData] -> kSendingData (answered, its C2HData queued from the slot's buffer)
  // -> kFree; or from any state to kFree when its command ends without data out.
  // Every change goes through set_slot().
  enum class SlotState : uint8_t {
    kFree,          // on free_slots_
    kExecuting,     // at its controller: a block device, or the admin path
    kAwaitingData,  // an R2T went out; H2CData PDUs fill the buffer
    kSendingData,   // answered; the socket has not taken its C2HData yet (r is null)
  };
  struct Slot {
    ControllerCore::Request* r = nullptr;
    uint8_t* buf = nullptr;
    uint32_t len = 0, received = 0;
    SlotState state = SlotState::kFree;
    bool to_host = false;       // the command reads: its data goes to the host
    bool digest_error = false;  // an H2CData PDU of it failed its data digest
    iovec iov{};
  };
  // Output in order: runs of obuf_ (headers, digests, small PDUs) and C2H data
  // sent from the slot's own buffer, so read data is not copied once more on
  // its way to the socket; the slot is freed when the socket has taken it.
  struct OutSeg {
    const uint8_t* data;  // nullptr: obuf_[off, off + len)
    size_t off, len;
    uint16_t slot;
  };

  bool handle_pdu(const uint8_t* p, uint32_t plen);
  bool on_icreq(const uint8_t* p, uint32_t plen);
  bool on_capsule(const uint8_t* p, uint32_t plen, const uint8_t* data, uint32_t dlen);
  bool on_h2c_data(const uint8_t* p, const uint8_t* data, uint32_t dlen);
  void on_connect(const Sqe& sqe, const uint8_t* data, uint32_t dlen);
  bool setup_queue(uint16_t depth);
  void send_resp(uint16_t cid, uint16_t status, uint32_t dw0, uint32_t dw1);
  void send_r2t(uint16_t cid, uint16_t ttag, uint32_t len);
  void send_c2h(uint16_t cid, uint16_t slot, uint32_t len, bool success);
  void fatal(uint16_t fes, uint32_t fei, const uint8_t* hdr, uint32_t hlen);
  // n bytes appended to the output (not zeroed: every caller writes them all).
  uint8_t* out(size_t n) {
    if (olen_ + n > ocap_) {
      const size_t cap = std::max({ocap_ * 2, olen_ + n, size_t{4096}});
      std::unique_ptr<uint8_t[]> b(new uint8_t[cap]);
      if (olen_ > 0) std::memcpy(b.get(), obuf_.get(), olen_);
      obuf_ = std::move(b);
      ocap_ = cap;
    }
    if (!segs_.empty() && segs_.back().data == nullptr)
      segs_.back().len += n;
    else
      segs_.push_back(OutSeg{nullptr, olen_, n, 0});
    uint8_t* at = obuf_.get() + olen_;
    olen_ += n;
    return at;
  }
  void out_slot_data(uint16_t slot, const uint8_t* data, size_t len) {
    set_slot(slot, SlotState::kSendingData);
    segs_.push_back(OutSeg{data, 0, len, slot});
  }
  // The one transition function: keeps free_slots_ and busy_slots_ with the states,
  // and checks each change against the life cycle above (slot_transition_allowed).
  void set_slot(uint16_t slot, SlotState to);
  static bool slot_transition_allowed(SlotState from, SlotState to);
  void discard_output();  // the socket is gone: queued slots are freed
  void put_header(uint8_t type, uint8_t flags, uint8_t hlen, uint8_t pdo, uint32_t plen,
                  const void* rest, size_t rest_len);

  TargetSide* t_;                    // the target that owns this connection
  const TcpTransportOptions* opts_;  // the target's, current (set_tcp_options)
  int poll_fd_;
  int fd_;
  std::string listener_;
  uint64_t opened_ms_;
  uint64_t ready_ms_ = 0;
  uint64_t partial_since_ms_ = 0;
  bool closing_ = false;
  bool ready_ = false;  // ICReq done
  bool hdgst_ = false, ddgst_ = false;
  uint32_t hpda_ = 0;
  FabricsController* ctrl_ = nullptr;
  uint16_t qid_ = 0;
  bool sq_flow_control_ = true;
  uint16_t sqhd_ = 0;
  uint32_t depth_ = 0;

  std::vector<uint8_t> rbuf_;
  size_t rlen_ = 0;
  std::unique_ptr<uint8_t[]> obuf_;
  size_t olen_ = 0, ocap_ = 0;
  std::vector<OutSeg> segs_;
  size_t seg_pos_ = 0;  // bytes of segs_.front() already sent

  std::vector<Slot> slots_;
  std::vector<uint16_t> free_slots_;
  uint32_t busy_slots_ = 0;
  uint8_t* data_area_ = nullptr;
  size_t data_area_len_ = 0;
};

}  // namespace dpukv::nvme
