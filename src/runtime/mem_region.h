// Allocation helper for memory that maps register: page-aligned, pre-faulted,
// optionally shared (memfd, so it can be exported to another process).
//
// Pre-faulting matters: the first touch of a shared page costs ~2.5 us per 4 KiB
// here, so a pool that is faulted on the data path runs at a fraction of DRAM
// speed. Everything is paid in create().
#pragma once

#include <cstddef>
#include <memory>

#include "runtime/status.h"

namespace dpukv {

struct MemRegionOptions {
  bool shared = true;          // memfd-backed and exportable; false: anonymous private memory
  bool prefault = true;        // touch every page at creation (MAP_POPULATE)
  bool huge_pages = true;      // ask for transparent huge pages (effective for private memory,
                               // and for shared memory only if shmem THP is enabled)
  const char* name = "dpukv";  // memfd name, visible in /proc/PID/maps
};

class MemRegion {
 public:
  static Status create(size_t size, const MemRegionOptions& opts, std::unique_ptr<MemRegion>* out);
  // Makes [addr, addr + size) (whole pages of the caller's memory, e.g. an engine's
  // KV cache) shared in place: its bytes are copied onto a memfd whose pages then
  // replace the old ones at the same addresses, so pointers into it stay valid and
  // the memfd can be exported. The mapping stays the caller's: the region's end
  // closes the memfd only, and the caller's own free unmaps the pages. Nothing may
  // write the range while this runs (its writes would be lost).
  static Status share_in_place(void* addr, size_t size, const char* name,
                               std::unique_ptr<MemRegion>* out);
  ~MemRegion();
  MemRegion(const MemRegion&) = delete;
  MemRegion& operator=(const MemRegion&) = delete;

  void* data() const { return addr_; }
  size_t size() const { return size_; }
  // The memfd, or -1 for private memory. Owned by the region.
  int fd() const { return fd_; }

 private:
  MemRegion(void* addr, size_t size, int fd) : addr_(addr), size_(size), fd_(fd) {}
  void* addr_;
  size_t size_;
  int fd_;
  bool owns_mapping_ = true;  // false: shared in place, the caller's to unmap
};

size_t page_size();

}  // namespace dpukv
