#include "cache/tier/slab_allocator.h"

#include <algorithm>

namespace dpukv {

Status SlabAllocator::init(uint64_t capacity, uint64_t page_size) {
  page_size = (page_size + kAlign - 1) / kAlign * kAlign;
  if (page_size == 0 || capacity < page_size) return Code::kInvalidValue;
  page_size_ = page_size;
  const uint64_t n = capacity / page_size;
  pages_.assign(n, Page{});
  free_pages_.clear();
  for (uint64_t i = n; i-- > 0;) free_pages_.push_back(static_cast<uint32_t>(i));
  partial_.assign(static_cast<size_t>(class_of(page_size_)) + 1, {});
  used_bytes_ = 0;
  return Code::kSuccess;
}

// Class c: size = 4 KiB * 2^(c/4) * (4 + c%4) / 4.
uint64_t SlabAllocator::size_of_class(int c) const {
  const uint64_t base = kAlign << (c / 4);
  return base + base / 4 * static_cast<uint64_t>(c % 4);
}

// The smallest class that holds `size`, without walking the classes (every store
// asks): size lies in (base, 2 base] for base = 4 KiB << k, where classes 4k+1..4k+3
// and 4(k+1) hold base * 5/4, 6/4, 7/4 and 2.
int SlabAllocator::class_of(uint64_t size) const {
  if (size <= kAlign) return 0;
  const int k = 63 - __builtin_clzll((size - 1) / kAlign);
  const uint64_t base = kAlign << k;
  const uint64_t quarters = (4 * (size - base) + base - 1) / base;  // 1..4
  return 4 * k + static_cast<int>(quarters);
}

uint64_t SlabAllocator::class_size(uint64_t size) const {
  if (size == 0 || size > page_size_) return 0;
  const uint64_t s = size_of_class(class_of(size));
  return s <= page_size_ ? s : page_size_;
}

bool SlabAllocator::take_page(int cls, uint32_t* page) {
  if (free_pages_.empty()) return false;
  const uint32_t p = free_pages_.back();
  free_pages_.pop_back();
  Page& pg = pages_[p];
  pg.cls = cls;
  pg.used = 0;
  const uint64_t sz = std::min(size_of_class(cls), page_size_);
  const uint32_t slots = static_cast<uint32_t>(page_size_ / sz);
  pg.free_slots.clear();
  for (uint32_t s = slots; s-- > 0;) pg.free_slots.push_back(s);
  partial_[static_cast<size_t>(cls)].push_back(p);
  *page = p;
  return true;
}

bool SlabAllocator::alloc(uint64_t size, uint64_t* offset) {
  if (size == 0 || size > page_size_) return false;
  const int cls = class_of(size);
  auto& partial = partial_[static_cast<size_t>(cls)];
  uint32_t p;
  if (!partial.empty()) {
    p = partial.back();
  } else if (!take_page(cls, &p)) {
    return false;
  }
  Page& pg = pages_[p];
  const uint32_t slot = pg.free_slots.back();
  pg.free_slots.pop_back();
  ++pg.used;
  if (pg.free_slots.empty()) partial.erase(std::find(partial.begin(), partial.end(), p));
  const uint64_t sz = std::min(size_of_class(cls), page_size_);
  *offset = static_cast<uint64_t>(p) * page_size_ + slot * sz;
  used_bytes_ += sz;
  return true;
}

bool SlabAllocator::alloc_at(uint64_t offset, uint64_t size) {
  if (size == 0 || size > page_size_ || offset >= capacity()) return false;
  const int cls = class_of(size);
  const uint64_t sz = std::min(size_of_class(cls), page_size_);
  const uint32_t p = static_cast<uint32_t>(offset / page_size_);
  const uint64_t in_page = offset % page_size_;
  if (in_page % sz != 0 || in_page + sz > page_size_) return false;
  Page& pg = pages_[p];
  if (pg.cls == -1) {
    auto it = std::find(free_pages_.begin(), free_pages_.end(), p);
    if (it == free_pages_.end()) return false;
    free_pages_.erase(it);
    free_pages_.push_back(p);  // take_page pops the back
    uint32_t got;
    if (!take_page(cls, &got)) return false;
  } else if (pg.cls != cls) {
    return false;
  }
  const uint32_t slot = static_cast<uint32_t>(in_page / sz);
  auto it = std::find(pg.free_slots.begin(), pg.free_slots.end(), slot);
  if (it == pg.free_slots.end()) return false;  // taken already
  pg.free_slots.erase(it);
  ++pg.used;
  auto& partial = partial_[static_cast<size_t>(cls)];
  if (pg.free_slots.empty()) partial.erase(std::find(partial.begin(), partial.end(), p));
  used_bytes_ += sz;
  return true;
}

void SlabAllocator::free(uint64_t offset) {
  const uint32_t p = static_cast<uint32_t>(offset / page_size_);
  Page& pg = pages_[p];
  const uint64_t sz = std::min(size_of_class(pg.cls), page_size_);
  auto& partial = partial_[static_cast<size_t>(pg.cls)];
  if (pg.free_slots.empty()) partial.push_back(p);
  pg.free_slots.push_back(static_cast<uint32_t>((offset % page_size_) / sz));
  --pg.used;
  used_bytes_ -= sz;
  if (pg.used == 0) {
    partial.erase(std::find(partial.begin(), partial.end(), p));
    pg.cls = -1;
    pg.free_slots.clear();
    // A page of many small slots gives its list back; one of a few keeps it, so a
    // page taken again (large chunks: every store) allocates nothing.
    if (pg.free_slots.capacity() > 64) pg.free_slots.shrink_to_fit();
    free_pages_.push_back(p);
  }
}

}  // namespace dpukv
