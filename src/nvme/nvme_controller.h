// An NVMe controller over PCIe registers and host memory (NVMe Base 2.0, NVM
// command set), transport-independent: it sees BAR0 register accesses, a doorbell
// page it polls, the host's DMA windows and an interrupt sink. The vfio-user
// function wires those to a socket; a DOCA DevEmu function would wire them to
// the BlueField's emulated PCIe function.
//
// Threading: one poller thread owns the controller (register accesses, poll(),
// resets). The only memory shared with the host is queue memory, data buffers and
// the doorbell page, all read with acquire loads and copied before validation, so
// a host changing an entry under the controller cannot make it act on an
// unchecked value.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/bdev.h"
#include "nvme/dma_map_table.h"
#include "nvme/nvme_spec.h"

namespace dpukv::nvme {

class InterruptSink {
 public:
  virtual void raise(uint16_t vector) = 0;

 protected:
  ~InterruptSink() = default;
};

struct ControllerConfig {
  std::string serial = "DPUKV00000001";
  std::string model = "dpukv NVMe emulation";
  std::string firmware = "0.1";
  std::string subnqn = "nqn.2026-11.io.dpukv:nvme";
  uint16_t vendor_id = 0x15b3;
  uint16_t cntlid = 1;
  uint16_t max_io_queues = 31;  // I/O queue pairs the controller can allocate
  uint16_t mqes = 1023;         // CAP.MQES: largest queue size, 0-based
  uint16_t num_vectors = 32;    // MSI-X vectors
  uint8_t mdts = 8;             // max transfer = 2^mdts minimum pages (1 MiB)
};

struct ControllerStats {
  uint64_t admin_commands = 0, io_commands = 0, errors = 0;
  uint64_t reads = 0, writes = 0, bytes_read = 0, bytes_written = 0;
  uint64_t interrupts = 0, invalid_doorbells = 0, fatal = 0;
};

class NvmeController {
 public:
  static constexpr uint32_t kMaxNamespaces = 32;
  static constexpr uint32_t kMaxInflight = 256;
  static constexpr uint32_t kMaxIov = 257;  // 1 MiB of 4 KiB pages, unaligned

  // doorbells: the 4 KiB page at BAR0 + 0x1000, shared with the host.
  NvmeController(const ControllerConfig& cfg, DmaMapTable* dma, InterruptSink* irq,
                 uint32_t* doorbells);
  ~NvmeController();
  NvmeController(const NvmeController&) = delete;
  NvmeController& operator=(const NvmeController&) = delete;

  Status add_namespace(uint32_t nsid, std::shared_ptr<Bdev> bdev);
  Status remove_namespace(uint32_t nsid);

  // BAR0 register file [0, 0x1000): 1..8-byte reads; 4- and 8-byte aligned writes.
  uint64_t read_reg(uint32_t offset, uint32_t size) const;
  void write_reg(uint32_t offset, uint32_t size, uint64_t value);
  // A doorbell written by message instead of through the shared page.
  void write_doorbell(uint32_t offset, uint32_t value);

  // Runs the controller: reaps bdev completions, fetches and executes commands,
  // raises interrupts. Returns the amount of work done (0: idle).
  int poll();

  // Function-level reset / vfio-user DEVICE_RESET / client gone: controller reset
  // plus registers back to their power-on values.
  void function_reset();
  // The host is about to unmap [iova, iova+len): finish in-flight I/O and drop any
  // queue that lives there (a fatal condition for the host's driver).
  void release_dma(uint64_t iova, uint64_t len);

  bool ready() const { return (csts_ & kCstsRdy) != 0; }
  uint32_t csts() const { return csts_; }
  const ControllerStats& stats() const { return stats_; }
  uint32_t active_io_queues() const;

 private:
  struct Cq {
    bool active = false;
    uint16_t id = 0;
    uint32_t size = 0;
    uint64_t iova = 0;
    Cqe* base = nullptr;
    uint32_t tail = 0, head = 0;
    uint32_t reserved = 0;  // completions promised to fetched commands
    bool phase = true;
    bool ien = false;
    bool irq_pending = false;
    uint16_t vector = 0;
    uint16_t sq_refs = 0;
    bool bad_doorbell = false;
  };
  struct Sq {
    bool active = false;
    uint16_t id = 0;
    uint32_t size = 0;
    uint64_t iova = 0;
    const Sqe* base = nullptr;
    uint32_t head = 0;
    uint16_t cqid = 0;
    uint32_t inflight = 0;
    bool bad_doorbell = false;
  };
  struct DsmRange {
    uint32_t attributes, nlb;
    uint64_t slba;
  };
  struct Request {
    BdevIo io;  // first: the completion callback finds the request from it
    NvmeController* ctrl = nullptr;
    uint16_t sqid = 0, cid = 0;
    uint8_t opc = 0;
    uint32_t nsid = 0;
    uint64_t slba = 0;
    uint32_t step = 0, steps = 0;  // DSM ranges / namespaces of a flush-all
    union {
      iovec iov[kMaxIov];
      DsmRange ranges[256];
    };
  };
  struct ErrorEntry {
    uint64_t count;
    uint16_t sqid, cid, status;
    uint64_t lba;
    uint32_t nsid;
  };

  // Register flows.
  void write_cc(uint32_t value);
  void enable();
  void controller_reset();
  void fatal(const char* why);

  // Queues.
  int process_sq(Sq& sq);
  uint32_t cq_free(Cq& cq);
  void post(uint16_t sqid, uint16_t cid, uint16_t status, uint32_t dw0);
  void delete_io_queues();

  // Commands.
  void admin(const Sqe& cmd);
  void io(Sq& sq, const Sqe& cmd);
  uint16_t identify(const Sqe& cmd);
  void nguid(uint32_t nsid, uint8_t* out) const;
  uint16_t get_log_page(const Sqe& cmd);
  uint16_t set_features(const Sqe& cmd, uint32_t* dw0);
  uint16_t get_features(const Sqe& cmd, uint32_t* dw0);
  uint16_t create_cq(const Sqe& cmd);
  uint16_t create_sq(const Sqe& cmd);
  uint16_t delete_sq(const Sqe& cmd);
  uint16_t delete_cq(const Sqe& cmd);
  void async_event_request(const Sqe& cmd);
  void queue_event(uint8_t type, uint8_t info, uint8_t log_page);
  void deliver_events();

  // Data transfer.
  uint32_t page_size() const { return 1u << (12 + cc_mps(cc_)); }
  uint16_t map_prps(uint64_t prp1, uint64_t prp2, uint64_t len, uint32_t prot, iovec* iov,
                    int* iovcnt) const;
  uint16_t copy_to_host(const Sqe& cmd, const void* src, size_t len);
  uint16_t copy_from_host(const Sqe& cmd, void* dst, size_t len);

  // Bdev path.
  Request* alloc_request();
  void free_request(Request* r);
  static void bdev_done(BdevIo* io, Status st);
  void finish_request(Request* r, uint16_t status);
  void start_chain(Request* r);
  void drain_inflight();
  void record_error(uint16_t sqid, uint16_t cid, uint16_t status, uint64_t lba, uint32_t nsid);

  ControllerConfig cfg_;
  DmaMapTable* dma_;
  InterruptSink* irq_;
  uint32_t* db_;

  // Registers.
  uint64_t cap_;
  uint32_t cc_ = 0, csts_ = 0, aqa_ = 0, intms_ = 0;
  uint64_t asq_ = 0, acq_ = 0;

  std::vector<Sq> sqs_;
  std::vector<Cq> cqs_;
  std::vector<uint16_t> active_sqs_;
  uint16_t allocated_queues_;  // Number of Queues feature
  bool queues_created_since_reset_ = false;

  std::array<std::shared_ptr<Bdev>, kMaxNamespaces + 1> ns_{};
  std::vector<Bdev*> distinct_bdevs_;

  std::array<iovec, kMaxIov> scratch_iov_{};  // admin and DSM buffers
  std::vector<Request> requests_;
  std::vector<Request*> free_requests_;
  uint32_t inflight_ = 0;

  // Features (current values).
  uint32_t feat_arbitration_ = 0, feat_power_ = 0, feat_error_recovery_ = 0, feat_vwc_ = 1;
  uint32_t feat_coalescing_ = 0, feat_aec_ = 0, feat_kato_ = 0, feat_write_atomicity_ = 0;
  uint16_t temp_over_ = 343, temp_under_ = 0;  // Kelvin, composite sensor
  uint16_t temperature_ = 313;
  uint8_t critical_warning_ = 0;

  // Asynchronous events.
  std::vector<uint16_t> aer_cids_;
  struct Event {
    uint8_t type, info, log;
  };
  std::vector<Event> events_;
  std::array<bool, 8> event_masked_{};

  std::array<ErrorEntry, 8> error_log_{};
  uint64_t error_count_ = 0;

  ControllerStats stats_;
};

}  // namespace dpukv::nvme
