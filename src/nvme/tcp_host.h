// A user-space NVMe/TCP host (initiator): what Linux's nvme-tcp or SPDK's
// initiator does, reduced to what dpukv's tests and `dpukv nvme perf --transport
// tcp` need. ICReq/ICResp, Fabrics Connect for the admin and I/O queues,
// Property Get/Set, in-capsule writes, R2T/H2CData, C2HData (with or without the
// SUCCESS flag), digests. One thread drives a host and all of its queues.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/nvme_spec.h"
#include "runtime/status.h"

namespace dpukv::nvme {

struct TcpHostOptions {
  std::string addr = "127.0.0.1";
  uint16_t port = 4420;
  std::string subnqn;
  std::string hostnqn = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000dbc0ffee";
  bool header_digest = false, data_digest = false;
  uint16_t queue_depth = 128;
  uint32_t io_queues = 1;
  uint32_t kato_ms = 0;
  bool disable_sq_flow_control = true;  // as Linux does; lets the target use C2H SUCCESS
  int timeout_ms = 5000;
};

// One record of a discovery log page (NVMe over Fabrics).
struct DiscoveryEntry {
  uint8_t trtype = 0, adrfam = 0, subtype = 0, treq = 0, sectype = 0;  // TSAS SECTYPE (TCP)
  uint16_t portid = 0, cntlid = 0, asqsz = 0;
  std::string trsvcid, subnqn, traddr;
};

class NvmeTcpHost {
 public:
  // Connects the admin queue, enables the controller, identifies it and its
  // namespaces, and connects the I/O queues.
  static Status connect(const TcpHostOptions& o, std::unique_ptr<NvmeTcpHost>* out);
  // Connects to the discovery subsystem (o.subnqn is ignored), reads the whole
  // discovery log (again if its GENCTR moved meanwhile) and disconnects.
  static Status discover(const TcpHostOptions& o, uint64_t* genctr,
                         std::vector<DiscoveryEntry>* out);
  // Only the admin queue's Connect (to test refusals); *status gets the NVMe status.
  static Status connect_admin_only(const TcpHostOptions& o, uint16_t* status,
                                   std::unique_ptr<NvmeTcpHost>* out);
  ~NvmeTcpHost();
  NvmeTcpHost(const NvmeTcpHost&) = delete;
  NvmeTcpHost& operator=(const NvmeTcpHost&) = delete;

  Status property_get(uint32_t offset, uint32_t size, uint64_t* value, uint16_t* status);
  Status property_set(uint32_t offset, uint32_t size, uint64_t value, uint16_t* status);
  // Admin command; data (to or from the host) up to 8 KiB.
  Status admin(Sqe cmd, Cqe* cqe, uint8_t* data = nullptr, uint32_t len = 0, bool to_host = true);
  Status identify(uint8_t cns, uint32_t nsid, uint8_t* out4k, uint16_t* status);

  // I/O queue q (0-based). cmd.cid names the command; buf stays owned by the
  // caller until its completion is reaped.
  Status submit(uint32_t q, Sqe cmd, uint8_t* buf, uint32_t len, bool write);
  int reap(uint32_t q, Cqe* out, int max);  // non-blocking
  Status wait_one(uint32_t q, Cqe* out, int timeout_ms);
  // Raw bytes on a queue's socket (malformed PDUs in tests), and the next PDU the
  // target sends there (its type, and for a termination request its FES).
  Status send_raw(uint32_t q, const void* p, size_t n);
  Status recv_pdu(uint32_t q, uint8_t* type, uint16_t* fes, int timeout_ms);
  // Queue index kAdmin addresses the admin queue in submit/reap/send_raw.
  static constexpr uint32_t kAdmin = ~0u;

  uint16_t cntlid() const { return cntlid_; }
  uint32_t block_size(uint32_t nsid) const { return nsid < bs_.size() ? bs_[nsid] : 0; }
  uint64_t num_blocks(uint32_t nsid) const { return nsid < blocks_.size() ? blocks_[nsid] : 0; }
  const std::vector<uint32_t>& namespaces() const { return nsids_; }
  uint32_t in_capsule_bytes() const { return icd_bytes_; }
  uint32_t max_transfer() const { return max_transfer_; }
  uint16_t queue_depth() const { return opts_.queue_depth; }
  // The socket of I/O queue q (readable when the target answered), and sending
  // what submit() batched without waiting for the next reap().
  int queue_fd(uint32_t q) const { return q < io_.size() ? io_[q].fd : -1; }
  Status flush_queue(uint32_t q) { return flush(queue(q)); }

 private:
  struct Pending {
    uint8_t* buf = nullptr;
    uint32_t len = 0;
    bool write = false, busy = false;
  };
  struct Queue {
    int fd = -1;
    uint16_t qid = 0;
    uint32_t maxh2cdata = 0;
    std::vector<uint8_t> rbuf;
    size_t rlen = 0;
    std::vector<Pending> pending;  // by cid
    std::vector<Cqe> ready;        // completions parsed, not yet reaped
    size_t ready_head = 0;
    std::vector<uint8_t> obuf;  // capsules submitted, sent at the next reap (one send)
    bool broken = false;
  };
  NvmeTcpHost() = default;
  Status open_queue(Queue* q, uint16_t qid, uint16_t depth, uint16_t* status);
  Status enable();  // CC.EN with 64/16-byte entries, then CSTS.RDY
  static uint32_t max_transfer_of(const uint8_t* identify_controller);
  Status read_log(uint8_t lid, uint64_t offset, uint8_t* out, uint32_t len);
  Status send_capsule(Queue& q, const Sqe& cmd, const uint8_t* icd, uint32_t icd_len,
                      bool now = true);
  Status flush(Queue& q);
  Status property(uint8_t fctype, uint32_t offset, uint32_t size, uint64_t value, Cqe* e);
  Status send_h2c(Queue& q, uint16_t cid, uint16_t ttag, uint32_t off, uint32_t len);
  int pump(Queue& q);  // reads and handles PDUs; -1 on a broken connection
  Queue& queue(uint32_t q) { return q == kAdmin ? admin_ : io_[q]; }
  Status sync(Queue& q, Sqe cmd, Cqe* cqe, uint8_t* data, uint32_t len, bool to_host);

  TcpHostOptions opts_;
  Queue admin_;
  std::vector<Queue> io_;
  uint16_t cntlid_ = 0;
  uint16_t next_admin_cid_ = 0;
  uint32_t icd_bytes_ = 0, max_transfer_ = 0;
  std::vector<uint32_t> nsids_;
  std::vector<uint32_t> bs_;
  std::vector<uint64_t> blocks_;
};

}  // namespace dpukv::nvme
