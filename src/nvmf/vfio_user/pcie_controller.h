// The PCIe half of an emulated NVMe controller: queues in host memory found
// through the host's DMA windows, a doorbell page it polls, PRPs, MSI-X through
// an interrupt sink, and the admin commands that only PCIe has (Create/Delete
// I/O SQ and CQ). Everything else is ControllerCore.
#pragma once

#include <cstdint>
#include <vector>

#include "nvmf/core/controller_core.h"
#include "nvmf/vfio_user/dma_map_table.h"

namespace dpukv::nvme {

class InterruptSink {
 public:
  virtual void raise(uint16_t vector) = 0;

 protected:
  ~InterruptSink() = default;
};

class PcieController final : public ControllerCore {
 public:
  // doorbells: the 4 KiB page at BAR0 + 0x1000, shared with the host.
  PcieController(const ControllerConfig& cfg, std::shared_ptr<NamespaceSet> ns, DmaMapTable* dma,
                 InterruptSink* irq, uint32_t* doorbells);
  ~PcieController() override;

  // A doorbell written by message instead of through the shared page.
  void write_doorbell(uint32_t offset, uint32_t value);
  // Fetches and executes commands, reaps bdev completions, raises interrupts.
  // Returns the amount of work done (0: idle).
  int poll();
  // Function-level reset / DEVICE_RESET / client gone: reset plus power-on registers.
  void function_reset();
  // The host is about to unmap [iova, iova+len): in-flight I/O finishes first, and
  // a queue that lives there is parked, not failed (SPDK's host unmaps its memory
  // after a shutdown with CC.EN still 1): it stays created but is neither
  // fetched from nor posted to, and completions for a parked CQ wait.
  void release_dma(uint64_t iova, uint64_t len);
  // The host mapped memory: parked queues inside it resume, with what waited.
  void dma_mapped();
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

  void complete(Request* r, uint16_t status) override;
  uint16_t admin_transport(Request* r) override;
  bool on_enable() override;
  void on_disable() override;
  void on_event_ready() override { cqs_[0].irq_pending = true; }
  void post(Request* r, uint16_t status);

  int process_sq(Sq& sq);
  uint32_t cq_free(Cq& cq);
  void delete_io_queues();
  uint16_t map_prps(uint64_t prp1, uint64_t prp2, uint64_t len, uint32_t prot, iovec* iov,
                    int* iovcnt) const;
  uint16_t create_cq(const Sqe& cmd);
  uint16_t create_sq(const Sqe& cmd);
  uint16_t delete_sq(const Sqe& cmd);
  uint16_t delete_cq(const Sqe& cmd);

  DmaMapTable* dma_;
  InterruptSink* irq_;
  uint32_t* db_;
  std::vector<Sq> sqs_;
  std::vector<Cq> cqs_;
  std::vector<uint16_t> active_sqs_;
  // Completions for CQs whose memory is unmapped (an AER answered meanwhile).
  std::vector<std::pair<Request*, uint16_t>> held_;
  uint32_t parked_ = 0;  // queues waiting for their memory
};

}  // namespace dpukv::nvme
