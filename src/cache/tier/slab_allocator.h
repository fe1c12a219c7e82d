// Allocator of chunk-sized objects over an offset space (the memory tier's arena,
// the disk tier's data file). The space is cut into pages; a page serves one size
// class; classes step by 1/4 of a power of two from 4 KiB, so internal waste is at
// most 25% (and under 1/8 on average), and a page whose objects are all freed goes
// back to the free pages, which bounds external fragmentation to the pages in use.
//
// Not thread safe: owned by the cache engine's thread. No allocation per object
// after init() except when a page first serves a class (one slot list per page).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/status.h"

namespace dpukv {

class SlabAllocator {
 public:
  static constexpr uint64_t kAlign = 4096;

  // capacity and page_size are rounded down / up to kAlign.
  Status init(uint64_t capacity, uint64_t page_size);

  // The class size an object of `size` bytes occupies; 0 if it exceeds a page.
  uint64_t class_size(uint64_t size) const;
  // False when no page of the class has a free slot and no page is free.
  bool alloc(uint64_t size, uint64_t* offset);
  // Claims a specific offset for an object of `size` (recovery from a disk log).
  // False if the offset does not fit the allocator's state.
  bool alloc_at(uint64_t offset, uint64_t size);
  void free(uint64_t offset);

  uint64_t capacity() const { return static_cast<uint64_t>(pages_.size()) * page_size_; }
  uint64_t page_size() const { return page_size_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t pages_in_use() const { return pages_.size() - free_pages_.size(); }

 private:
  struct Page {
    int32_t cls = -1;  // -1: free
    uint32_t used = 0;
    std::vector<uint32_t> free_slots;
  };
  int class_of(uint64_t size) const;
  uint64_t size_of_class(int c) const;
  bool take_page(int cls, uint32_t* page);

  uint64_t page_size_ = 0;
  std::vector<Page> pages_;
  std::vector<uint32_t> free_pages_;
  std::vector<std::vector<uint32_t>> partial_;  // per class: pages with a free slot
  uint64_t used_bytes_ = 0;
};

}  // namespace dpukv
