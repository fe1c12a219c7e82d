// The transport-independent half of an NVMe controller: registers, the admin
// commands every transport shares (Identify, Get Log Page, Get/Set Features,
// Asynchronous Event Request, Abort, Keep Alive), the NVM command set on block
// devices, and the state behind them (features, logs, events, namespaces).
//
// A transport turns its wire into Requests: it copies the command, prepares the
// data buffer (`iov`: PRP-mapped host memory for PCIe, a receive buffer for TCP)
// and calls execute(). The core answers through complete(), which the transport
// implements (a CQE in host memory, a response capsule on a socket), and the
// transport then gives the request back with release(). Commands the core does
// not know (queue management on PCIe, Fabrics commands) go to admin_transport().
//
// Threading: one thread owns a controller and everything it touches.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/nvme_spec.h"
#include "nvmf/bdev/bdev.h"
#include "nvmf/core/controller_config.h"
#include "nvmf/core/features.h"
#include "nvmf/core/log_pages.h"

namespace dpukv::nvme {

struct ControllerStats {
  uint64_t admin_commands = 0, io_commands = 0, errors = 0;
  uint64_t reads = 0, writes = 0, bytes_read = 0, bytes_written = 0;
  uint64_t interrupts = 0, invalid_doorbells = 0, fatal = 0;
};

// Namespaces of a subsystem: shared by every controller of it.
struct NamespaceSet {
  static constexpr uint32_t kMax = 32;
  std::array<std::shared_ptr<Bdev>, kMax + 1> ns{};  // [nsid]; 0 unused
  uint64_t generation = 0;                           // bumped on every change
  Bdev* get(uint32_t nsid) const { return nsid >= 1 && nsid <= kMax ? ns[nsid].get() : nullptr; }
};

class ControllerCore {
 public:
  static constexpr uint32_t kMaxNamespaces = NamespaceSet::kMax;
  static constexpr uint32_t kMaxInflight = 256;
  static constexpr uint32_t kAerLimit = 4;  // AERL + 1
  static constexpr uint32_t kAbortLimit = 4;
  static constexpr uint32_t kMaxIov = 257;      // 1 MiB of 4 KiB pages, unaligned
  static constexpr uint16_t kPending = 0xffff;  // admin_transport: completes later

  struct DsmRange {
    uint32_t attributes, nlb;
    uint64_t slba;
  };
  struct Request;
  // A fabrics queue's transport, as SPDK's spdk_nvmf_transport_ops: what its
  // controller calls to answer a request the queue brought, and to end the queue.
  // (PCIe answers through the controller's own completion queues and has none.)
  class QueueTransport {
   public:
    virtual void req_complete(Request* r, uint16_t status) = 0;
    virtual void req_drop(Request* r) = 0;  // ends it without a response (an AER)
    virtual void close(const char* why) = 0;
    virtual bool closed() const = 0;

   protected:
    ~QueueTransport() = default;
  };
  struct Request {
    BdevIo io;  // first: the completion callback finds the request from it
    ControllerCore* ctrl = nullptr;
    Sqe cmd{};
    uint16_t qid = 0;
    uint32_t dw0 = 0, dw1 = 0;
    const iovec* iov = nullptr;  // the command's data buffer, prepared by the transport
    int iovcnt = 0;
    uint32_t step = 0, steps = 0;     // DSM ranges / namespaces of a flush-all
    QueueTransport* queue = nullptr;  // the fabrics queue it came on (PCIe: none)
    uint32_t tag = 0;                 // the transport's slot for the request
    union {
      iovec iov_storage[kMaxIov];  // for transports that map host memory (PCIe)
      DsmRange ranges[256];
    };
  };

  // pool_size: requests that can be in flight at once over all queues.
  explicit ControllerCore(const ControllerConfig& cfg,
                          std::shared_ptr<NamespaceSet> namespaces = nullptr,
                          uint32_t pool_size = kMaxInflight);
  virtual ~ControllerCore();
  ControllerCore(const ControllerCore&) = delete;
  ControllerCore& operator=(const ControllerCore&) = delete;

  Status add_namespace(uint32_t nsid, std::shared_ptr<Bdev> bdev);
  Status remove_namespace(uint32_t nsid);
  const NamespaceSet& namespaces() const { return *ns_; }

  // Registers [0, 0x40): 1..8-byte reads; 4- and 8-byte aligned writes (PCIe MMIO
  // and Fabrics Property Get/Set).
  uint64_t read_reg(uint32_t offset, uint32_t size) const;
  void write_reg(uint32_t offset, uint32_t size, uint64_t value);

  // How many data bytes a command moves and in which direction; an error status
  // if the length itself is invalid (beyond MDTS). No data: *len = 0.
  uint16_t data_length(const Sqe& cmd, bool admin, uint64_t* len, bool* to_host) const;

  Request* alloc_request();  // nullptr when all kMaxInflight are in use
  bool has_free_request() const { return !free_requests_.empty(); }
  void release(Request* r);
  // Runs a command whose data buffer is ready; completes through complete().
  void execute(Request* r);

  // Reaps block-device completions; returns how many.
  int poll_bdevs();
  void drain_inflight();

  bool ready() const { return (csts_ & kCstsRdy) != 0; }
  uint32_t csts() const { return csts_; }
  uint32_t cc() const { return cc_; }
  const ControllerStats& stats() const { return stats_; }
  const ControllerConfig& config() const { return cfg_; }
  uint32_t keep_alive_timeout_ms() const { return features_.keep_alive_ms(); }
  // The KATO a Fabrics Connect gave: the feature's value from then on (Get
  // Features reports the KATO in force, as hosts adopt what it says), kept over
  // controller resets; Set Features changes it as the host asks.
  void set_connect_kato(uint32_t ms) { features_.set_keep_alive_ms(ms); }
  // Number of Queues as granted: SQs and CQs apart (PCIe SQs may share a CQ); a
  // Fabrics queue is a pair, so it may use the smaller of the two.
  uint16_t allocated_sqs() const { return allocated_sqs_; }
  uint16_t allocated_cqs() const { return allocated_cqs_; }
  uint32_t inflight() const { return inflight_; }
  // The discovery log changed: a notice to hosts that asked for one (AEC bit 31).
  void discovery_log_changed();
  // The admin queue is gone (a Fabrics host disconnected): its outstanding
  // Asynchronous Event Requests end unanswered, giving their slots back.
  void drop_async_events();

 protected:
  // Transport hooks.
  virtual void complete(Request* r, uint16_t status) = 0;
  virtual uint16_t admin_transport(Request* r) {
    (void)r;
    return kInvalidOpcode;
  }
  virtual bool on_enable() { return true; }  // false: fatal
  virtual void on_disable() {}
  virtual void on_event_ready() {}  // an AER completed (PCIe raises the admin vector)
  // Log pages the transport keeps (the discovery log): false if it has no such page.
  virtual bool transport_log(uint8_t lid, std::vector<uint8_t>* page) {
    (void)lid;
    (void)page;
    return false;
  }
  // A request ends without a completion (an AER at reset): the transport gives
  // back what it holds for it, then release()s it.
  virtual void drop(Request* r) { release(r); }

  void fatal(const char* why);
  void controller_reset();  // CC.EN 1 -> 0
  void registers_to_power_on();
  void record_error(uint16_t qid, uint16_t cid, uint16_t status, uint64_t lba, uint32_t nsid);
  void queue_event(uint8_t type, uint8_t info, uint8_t log_page);
  uint32_t page_size() const { return 1u << (12 + cc_mps(cc_)); }
  uint64_t max_transfer() const { return uint64_t{page_size()} << cfg_.mdts; }

  ControllerConfig cfg_;
  std::shared_ptr<NamespaceSet> ns_;
  std::vector<Bdev*> distinct_bdevs_;
  uint64_t seen_generation_ = ~uint64_t{0};
  uint64_t cap_;
  uint32_t cc_ = 0, csts_ = 0, aqa_ = 0, intms_ = 0;
  uint64_t asq_ = 0, acq_ = 0;
  uint16_t allocated_sqs_, allocated_cqs_;  // Number of Queues feature
  bool queues_created_since_reset_ = false;
  ControllerStats stats_;

 private:
  void write_cc(uint32_t value);
  void execute_admin(Request* r);
  void execute_io(Request* r);
  uint16_t identify(Request* r);
  uint16_t get_log_page(Request* r);
  uint16_t set_features(Request* r);
  uint16_t get_features(Request* r);
  void async_event_request(Request* r);
  void deliver_events();
  uint16_t copy_to_data(Request* r, const void* src, size_t len);
  uint16_t copy_from_data(Request* r, void* dst, size_t len);
  static void bdev_done(BdevIo* io, Status st);
  void finish(Request* r, uint16_t status);
  void start_chain(Request* r);
  void rebuild_bdev_list();
  void submit_bdev(Bdev* b, Request* r);

  std::vector<Request> requests_;
  std::vector<Request*> free_requests_;
  uint32_t inflight_ = 0;
  uint32_t at_bdev_ = 0;  // requests a block device holds (what a drain waits for)

  FeatureSet features_;
  uint16_t temperature_ = 313;  // Kelvin, composite sensor
  uint8_t critical_warning_ = 0;

  // Asynchronous events.
  std::vector<Request*> aers_;
  struct Event {
    uint8_t type, info, log;
  };
  std::vector<Event> events_;
  std::array<bool, 8> event_masked_{};

  ErrorLog error_log_;
};

}  // namespace dpukv::nvme
