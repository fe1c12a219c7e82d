// A user-space NVMe host driver over vfio-user: what SPDK's nvme driver does with
// trtype:VFIOUSER, reduced to what dpukv's tools and tests need. Its memory is a
// memfd given to the controller with DMA_MAP; doorbells are stores into the
// mapped doorbell page (no message per I/O); completions are polled or signalled
// through MSI-X eventfds.
//
// Not thread-safe: one thread drives a driver and all of its queues.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nvme/nvme_spec.h"
#include "nvme/vfio_user_client.h"
#include "runtime/mem_region.h"

namespace dpukv::nvme {

struct DriverOptions {
  uint32_t io_queues = 1;
  uint32_t queue_entries = 256;
  bool interrupts = false;     // MSI-X eventfds; otherwise polled completions
  bool mmap_doorbells = true;  // false: every doorbell is a REGION_WRITE message
  size_t memory_bytes = 64u << 20;
  int connect_timeout_ms = 5000;
};

struct DmaBuffer {
  uint8_t* host = nullptr;
  uint64_t iova = 0;
  size_t len = 0;
};

class VfioUserDriver {
 public:
  static constexpr uint64_t kIovaBase = 0x100000000ull;

  static Status attach(const std::string& socket_path, const DriverOptions& o,
                       std::unique_ptr<VfioUserDriver>* out);
  ~VfioUserDriver();
  VfioUserDriver(const VfioUserDriver&) = delete;
  VfioUserDriver& operator=(const VfioUserDriver&) = delete;

  // Controller bring-up: disable, admin queues, enable, identify, I/O queues.
  // attach() runs it; call again after reset_controller() or function_level_reset().
  Status initialize();
  Status reset_controller();      // CC.EN 1 -> 0, wait for CSTS.RDY 0
  Status function_level_reset();  // PCIe FLR through config space
  Status shutdown(bool abrupt);   // CC.SHN, wait for CSTS.SHST complete
  // Shutdown (unless done), memory unmapped: what the destructor does before it
  // closes the socket. Once.
  void detach();

  // Takes the host memory out of the controller's reach and gives it back, as
  // SPDK's host does around a detach (its queues stay created meanwhile).
  Status unmap_memory();
  Status map_memory();

  // Host memory inside the DMA window (bump allocation, page aligned).
  Status alloc(size_t len, DmaBuffer* out);

  // Admin command with an optional data buffer; fills *cqe. Returns kSuccess if a
  // completion arrived (check its status), kTimeout otherwise.
  Status admin(Sqe cmd, Cqe* cqe, const DmaBuffer* data = nullptr, int timeout_ms = 2000);
  Status identify(uint8_t cns, uint32_t nsid, uint8_t* out4k, uint16_t* status);

  // I/O queue `q` (0-based): submit one command (the driver sets cid and PRPs
  // from `buf` if given) and reap completions.
  Status submit(uint32_t q, Sqe cmd, const DmaBuffer* buf, uint64_t len, uint16_t* cid_out);
  // Reaps up to max completions without blocking.
  int reap(uint32_t q, Cqe* out, int max);
  // Waits for the completion eventfd of queue q (interrupt mode).
  Status wait_interrupt(uint32_t q, int timeout_ms);
  Status wait_one(uint32_t q, Cqe* out, int timeout_ms);
  // Raw submission: the SQE as given, nothing filled in (for conformance tests).
  Status submit_raw(uint32_t q, const Sqe& cmd);
  // Writes any value to a doorbell (for tests of invalid doorbells).
  void ring_doorbell_raw(uint32_t offset, uint32_t value);

  uint32_t read32(uint32_t reg);
  uint64_t read64(uint32_t reg);
  Status write32(uint32_t reg, uint32_t v);
  Status write64(uint32_t reg, uint64_t v);

  // The message channel under the driver: for tests that break the protocol on
  // purpose (a raw doorbell, a masked vector); the driver does not expect it used.
  VfioUserClient& client() { return *client_; }
  uint32_t block_size(uint32_t nsid) const {
    return nsid < ns_block_size_.size() ? ns_block_size_[nsid] : 0;
  }
  uint64_t num_blocks(uint32_t nsid) const {
    return nsid < ns_blocks_.size() ? ns_blocks_[nsid] : 0;
  }
  uint32_t max_transfer() const { return max_transfer_; }
  uint32_t queue_entries() const { return opts_.queue_entries; }
  uint32_t io_queue_count() const { return static_cast<uint32_t>(queues_.size()) - 1; }
  uint32_t interrupts_seen() const { return irqs_seen_; }
  uint32_t prp_list_pages() const { return prp_pages_per_slot_; }
  const std::vector<uint32_t>& namespaces() const { return active_ns_; }
  // Admin completions that arrived while admin() waited for another command (an
  // asynchronous event request answered in between). Taken by the caller.
  std::vector<Cqe> take_stray_admin() { return std::exchange(stray_, {}); }

 private:
  // How often a wait for a completion reads CSTS (a message round trip).
  static constexpr uint64_t kCheckControllerMs = 10;
  Status find_capability(uint8_t id, uint16_t* offset);
  Status setup_pci_function();
  Status check_controller();
  struct Queue {
    uint16_t qid = 0;
    uint32_t entries = 0;
    DmaBuffer sq, cq;
    uint32_t sq_tail = 0, cq_head = 0;
    bool phase = true;
    uint16_t next_cid = 0;
    std::vector<DmaBuffer> prp_lists;  // one list page per command slot
    int irq_fd = -1;
  };
  VfioUserDriver() = default;
  Status wait_ready(bool ready);
  Status create_io_queues();
  void ring(uint32_t offset, uint32_t value);
  Status build_prps(Queue& q, uint16_t slot, uint64_t iova, uint64_t len, Sqe* cmd);

  DriverOptions opts_;
  std::unique_ptr<VfioUserClient> client_;
  std::unique_ptr<MemRegion> mem_;
  size_t mem_used_ = 0;
  size_t mem_reset_mark_ = 0;
  uint32_t* doorbells_ = nullptr;
  void* doorbell_map_ = nullptr;
  size_t doorbell_map_len_ = 0;
  uint64_t cap_ = 0;
  uint32_t timeout_ms_ = 5000;
  uint32_t max_transfer_ = 0;
  uint32_t prp_pages_per_slot_ = 0;
  std::vector<Queue> queues_;  // [0] admin
  std::vector<uint32_t> active_ns_;
  std::vector<uint32_t> ns_block_size_;
  std::vector<uint64_t> ns_blocks_;
  uint32_t irqs_seen_ = 0;
  std::vector<Cqe> stray_;
  bool fatal_logged_ = false;
  bool detached_ = false;
};

}  // namespace dpukv::nvme
