// An emulated PCIe NVMe function as a vfio-user server sees it (the devemu layer):
// PCI config space, BAR0 (controller registers, a shared doorbell page, MSI-X
// table and PBA), MSI-X vectors delivered through the client's eventfds, the
// client's DMA windows, and the NVMe controller behind them.
//
// handle() is the whole protocol engine: one request message in, one reply out,
// no socket involved, so the connection code stays thin and the fuzzer can drive
// every message type directly. It never trusts a length, index or offset.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/vfio_user_wire.h"
#include "nvmf/vfio_user/dma_map_table.h"
#include "nvmf/vfio_user/pcie_controller.h"

namespace dpukv::nvme {

struct FunctionConfig {
  ControllerConfig controller;
  uint16_t device_id = 0x6001;
  uint16_t subsystem_id = 0x0001;
  // The doorbell page as a sparse mmap area of BAR0 (the host writes doorbells
  // to shared memory); false: every doorbell write is a region-write message
  // (SPDK's disable_mappable_bar0).
  bool mappable_doorbells = true;
};

class NvmePciFunction final : public InterruptSink {
 public:
  static constexpr uint32_t kConfigSize = 0x1000;
  static constexpr uint32_t kCapPm = 0x40, kCapMsix = 0x50, kCapPcie = 0x60;

  // ns: a namespace set shared with other controllers, or nullptr for its own.
  static Status create(const FunctionConfig& cfg, std::shared_ptr<NamespaceSet> ns,
                       std::unique_ptr<NvmePciFunction>* out);
  ~NvmePciFunction();
  NvmePciFunction(const NvmePciFunction&) = delete;
  NvmePciFunction& operator=(const NvmePciFunction&) = delete;

  const PcieController& controller() const { return *ctrl_; }
  // A namespace of its own (a function made without a subsystem's set).
  Status add_namespace(uint32_t nsid, std::shared_ptr<Bdev> bdev);

  // Handles one complete message. fds are owned by the call: the function keeps
  // those it uses and closes the rest. Sets *reply (empty when the request asked
  // for no reply) and reply fds (owned by the function; send, do not close).
  void handle(const uint8_t* msg, size_t len, int* fds, int nfds, std::vector<uint8_t>* reply,
              std::vector<int>* reply_fds);

  // The client went away: forget its DMA windows and eventfds, reset the device,
  // be ready for the next client.
  void disconnect();

  int poll() { return ctrl_->poll(); }
  void raise(uint16_t vector) override;

  struct Counters {
    uint64_t messages = 0, errors = 0, irqs_sent = 0, irqs_pending = 0;
  };
  const Counters& counters() const { return counters_; }
  bool negotiated() const { return negotiated_; }

 private:
  explicit NvmePciFunction(const FunctionConfig& cfg) : cfg_(cfg) {}
  Status init(std::shared_ptr<NamespaceSet> ns);
  void build_config_space();

  // Each returns 0 or an errno for the reply.
  int on_version(const uint8_t* p, size_t n, std::vector<uint8_t>* out);
  int on_dma_map(const uint8_t* p, size_t n, int* fds, int nfds);
  int on_dma_unmap(const uint8_t* p, size_t n, std::vector<uint8_t>* out);
  int on_device_info(const uint8_t* p, size_t n, std::vector<uint8_t>* out);
  int on_region_info(const uint8_t* p, size_t n, std::vector<uint8_t>* out,
                     std::vector<int>* out_fds);
  int on_irq_info(const uint8_t* p, size_t n, std::vector<uint8_t>* out);
  int on_set_irqs(const uint8_t* p, size_t n, int* fds, int nfds);
  int on_region_read(const uint8_t* p, size_t n, std::vector<uint8_t>* out);
  int on_region_write(const uint8_t* p, size_t n, std::vector<uint8_t>* out);
  void device_reset();

  uint64_t bar0_read(uint32_t off, uint32_t size);
  void bar0_write(uint32_t off, uint32_t size, uint64_t v);
  void config_write(uint32_t off, const uint8_t* data, uint32_t size);
  bool vector_masked(uint16_t v) const;
  void fire_pending();
  bool msix_enabled_by_config() const;

  FunctionConfig cfg_;
  std::array<uint8_t, kConfigSize> config_{};
  std::array<uint8_t, kConfigSize> wmask_{};  // writable bits of config space
  int doorbell_fd_ = -1;
  uint8_t* doorbell_map_ = nullptr;  // 8 KiB memfd mapping; doorbells in the second page
  std::vector<uint8_t> msix_table_;
  std::vector<int> irq_fds_;
  std::vector<uint8_t> irq_masked_;   // vfio-user SET_IRQS mask state
  std::vector<uint8_t> irq_pending_;  // the PBA
  DmaMapTable dma_;
  std::unique_ptr<PcieController> ctrl_;
  bool negotiated_ = false;
  Counters counters_;
};

}  // namespace dpukv::nvme
