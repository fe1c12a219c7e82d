// The client's DMA windows as the emulated device sees them (vfio-user DMA_MAP).
//
// Every address the controller dereferences goes through translate(): an address
// and a length either fall entirely inside one window with the needed permission,
// or the access is refused. Each window is mmap'ed from the fd the client passed
// and registered as a runtime memory map, so engines may use it like any other.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/mmap.h"
#include "runtime/status.h"

namespace dpukv::nvme {

class DmaMapTable {
 public:
  static constexpr uint32_t kRead = 1, kWrite = 2;
  static constexpr size_t kMaxMaps = 1024;

  DmaMapTable() = default;
  ~DmaMapTable() { clear(); }
  DmaMapTable(const DmaMapTable&) = delete;
  DmaMapTable& operator=(const DmaMapTable&) = delete;

  // Maps [iova, iova+size) from fd at offset. Takes no ownership of fd.
  // EXISTS-like overlap -> kBadState; bad size/offset -> kInvalidValue.
  Status add(uint64_t iova, uint64_t size, int fd, uint64_t offset, uint32_t prot);
  // The window must match a previous add() exactly.
  Status remove(uint64_t iova, uint64_t size);
  void clear();

  // Host pointer for [iova, iova+len) if it lies inside one window that allows
  // `prot`; nullptr otherwise. len 0 is refused.
  uint8_t* translate(uint64_t iova, uint64_t len, uint32_t prot) const {
    const Window* w = last_;
    if (w == nullptr || iova < w->iova || iova - w->iova >= w->size) w = find(iova);
    if (w == nullptr || len == 0 || len > w->size - (iova - w->iova) || (w->prot & prot) != prot)
      return nullptr;
    last_ = w;
    return w->host + (iova - w->iova);
  }
  // True if any window intersects [iova, iova+len).
  bool overlaps(uint64_t iova, uint64_t len) const;
  size_t size() const { return windows_.size(); }

 private:
  struct Window {
    uint64_t iova, size;
    uint8_t* host;
    void* mapping;
    size_t mapping_len;
    uint32_t prot;
    std::unique_ptr<Mmap> map;
  };
  const Window* find(uint64_t iova) const;

  std::vector<std::unique_ptr<Window>> windows_;  // sorted by iova
  mutable const Window* last_ = nullptr;
};

}  // namespace dpukv::nvme
