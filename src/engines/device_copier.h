// The seam between the cache and a copy engine that reaches device (GPU) memory:
// the cache names a region the engine imported (an id), an offset and a length,
// and host memory of its own; the engine moves the bytes and calls back on the
// cache's progress engine. CudaEngine implements it today; a DOCA DMA context
// writing into GPU memory exported to a BlueField would implement it the same way.
#pragma once

#include <cstdint>

#include "runtime/status.h"

namespace dpukv {

class DeviceCopier {
 public:
  using DoneCb = void (*)(void* arg, Status st);
  virtual ~DeviceCopier() = default;
  // host -> region (to_device) or region -> host. checksum (may be null): set to
  // the xxh3-64 of the host bytes before cb runs, as a DMA engine's CRC offload
  // gives it (the bytes read for a copy to the device, those that landed for one
  // from it). INVALID_VALUE: outside the region or the host memory the engine may
  // reach; AGAIN: too many in flight; NOT_SUPPORTED: the engine takes no copies
  // (why it stopped is the engine's to say).
  virtual Status copy(uint64_t region, uint64_t offset, void* host, uint64_t bytes, bool to_device,
                      uint64_t* checksum, DoneCb cb, void* arg) = 0;
};

// A range of a device region, as a store or retrieve names it.
struct DeviceRange {
  uint64_t region = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

}  // namespace dpukv
