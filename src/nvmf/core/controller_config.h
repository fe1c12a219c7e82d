// What describes one NVMe controller to its host: identity strings, IDs, limits,
// and whether it speaks NVMe over Fabrics or is a discovery controller. Read by the
// controller core and by the Identify builders (identify.h).
#pragma once

#include <cstdint>
#include <string>

namespace dpukv::nvme {

struct ControllerConfig {
  std::string serial = "DPUKV00000001";
  std::string model = "dpukv NVMe emulation";
  std::string firmware = "0.1";
  std::string subnqn = "nqn.2026-11.io.dpukv:nvme";
  uint16_t vendor_id = 0x15b3;
  uint16_t cntlid = 1;
  uint16_t max_io_queues = 31;    // I/O queue pairs the controller can allocate
  uint16_t mqes = 1023;           // CAP.MQES: largest queue size, 0-based
  uint16_t num_vectors = 32;      // MSI-X vectors (PCIe)
  uint8_t mdts = 8;               // max transfer = 2^mdts minimum pages (1 MiB)
  bool fabrics = false;           // NVMe over Fabrics identify fields and rules
  bool discovery = false;         // a discovery controller: no I/O, the discovery log
  uint32_t in_capsule_bytes = 0;  // fabrics: in-capsule data the I/O queues accept
};

}  // namespace dpukv::nvme
