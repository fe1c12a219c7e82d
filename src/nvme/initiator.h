// One queue of an NVMe host, whatever the transport: the interface a benchmark or
// a tool drives (submit by slot, reap completions), with one buffer per slot held
// by the initiator so that each transport keeps its own kind of memory (the
// vfio-user DMA window, plain memory for TCP).
#pragma once

#include <cstdint>
#include <memory>

#include "nvme/nvme_spec.h"
#include "runtime/status.h"

namespace dpukv::nvme {

class VfioUserDriver;
class NvmeTcpHost;

class Initiator {
 public:
  virtual ~Initiator() = default;
  virtual uint32_t nsid() = 0;
  virtual uint32_t block_size() = 0;
  virtual uint64_t num_blocks() = 0;
  virtual uint32_t max_qd() = 0;
  virtual Status prepare(uint32_t qd, uint32_t bytes) = 0;
  virtual Status submit(uint16_t slot, bool write, uint64_t lba, uint32_t nlb, uint32_t bytes) = 0;
  virtual int reap(Cqe* out, int max) = 0;  // < 0: the connection is gone
  virtual void idle_wait() {}
};

// The first I/O queue of an attached vfio-user controller; irq: sleep on its interrupt
// when idle instead of polling.
std::unique_ptr<Initiator> make_vfio_user_initiator(std::unique_ptr<VfioUserDriver> d, bool irq);
// The first I/O queue of a connected NVMe/TCP host of the given queue depth.
std::unique_ptr<Initiator> make_tcp_initiator(std::unique_ptr<NvmeTcpHost> h, uint32_t depth);

}  // namespace dpukv::nvme
