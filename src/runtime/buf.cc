#include "runtime/buf.h"

#include "runtime/log.h"
#include "runtime/mmap.h"

namespace dpukv {

Status Buf::set_data(void* data, size_t data_len) {
  auto* d = static_cast<uint8_t*>(data);
  if (d < head_ || static_cast<size_t>(d - head_) > len_ ||
      data_len > len_ - static_cast<size_t>(d - head_))
    return Code::kInvalidValue;
  data_ = d;
  data_len_ = data_len;
  return Code::kSuccess;
}

Status Buf::set_data_len(size_t data_len) {
  if (data_len > len_ - static_cast<size_t>(data_ - head_)) return Code::kInvalidValue;
  data_len_ = data_len;
  return Code::kSuccess;
}

Status Buf::inc_refcount(uint16_t* refcount) {
  if (refcount_ == 0 || refcount_ == UINT16_MAX) return Code::kBadState;
  ++refcount_;
  if (refcount) *refcount = refcount_;
  return Code::kSuccess;
}

Status Buf::dec_refcount(uint16_t* refcount) {
  if (refcount_ == 0) return Code::kBadState;
  if (in_list_) return Code::kNotPermitted;  // the list head owns its elements
  --refcount_;
  if (refcount) *refcount = refcount_;
  if (refcount_ == 0) {
    Buf* b = this;
    while (b != nullptr) {
      Buf* next = b->next_;
      inv_->release(b);
      b = next;
    }
  }
  return Code::kSuccess;
}

Status buf_chain_list(Buf* list1, Buf* list2) {
  if (list1 == nullptr || list2 == nullptr || list1 == list2) return Code::kInvalidValue;
  if (list1->refcount_ == 0 || list2->refcount_ == 0 || list1->in_list_ || list2->in_list_ ||
      list1->inv_ != list2->inv_)
    return Code::kInvalidValue;
  if (list2->refcount_ != 1) return Code::kBadState;  // shared buffers cannot join a list
  if (static_cast<uint64_t>(list1->list_len_) + list2->list_len_ > BufInventory::kMaxListLen)
    return Code::kTooBig;
  list1->last_->next_ = list2;
  list1->last_ = list2->last_;
  list1->list_len_ += list2->list_len_;
  list2->in_list_ = true;
  list2->last_ = nullptr;
  list2->list_len_ = 0;
  return Code::kSuccess;
}

Status buf_unchain_list(Buf* list1, Buf* list2) {
  if (list1 == nullptr || list2 == nullptr || list1 == list2 || list1->in_list_)
    return Code::kInvalidValue;
  Buf* prev = list1;
  uint32_t n = 1;
  while (prev->next_ != nullptr && prev->next_ != list2) prev = prev->next_, ++n;
  if (prev->next_ != list2) return Code::kNotFound;
  list2->last_ = list1->last_;
  list2->list_len_ = list1->list_len_ - n;
  list2->in_list_ = false;
  prev->next_ = nullptr;
  list1->last_ = prev;
  list1->list_len_ = n;
  return Code::kSuccess;
}

Status BufInventory::create(uint32_t capacity, std::unique_ptr<BufInventory>* out) {
  if (capacity == 0 || out == nullptr) return Code::kInvalidValue;
  std::unique_ptr<BufInventory> inv(new BufInventory());
  inv->bufs_.reset(new Buf[capacity]);
  inv->free_.reset(new Buf*[capacity]);
  inv->capacity_ = capacity;
  for (uint32_t i = 0; i < capacity; ++i) inv->free_[i] = &inv->bufs_[capacity - 1 - i];
  inv->num_free_ = capacity;
  *out = std::move(inv);
  return Code::kSuccess;
}

BufInventory::~BufInventory() {
  if (num_free_ != capacity_)
    LOG_CRIT("buffer inventory destroyed with %u buffers in use", capacity_ - num_free_);
}

Status BufInventory::get_by_addr(Mmap* map, void* addr, size_t len, Buf** out) {
  if (map == nullptr || out == nullptr || len == 0) return Code::kInvalidValue;
  if (!map->started()) return Code::kBadState;
  if (!map->contains(addr, len)) return Code::kInvalidValue;
  if (num_free_ == 0) return Code::kNoMemory;
  Buf* b = free_[--num_free_];
  b->map_ = map;
  b->inv_ = this;
  b->head_ = b->data_ = static_cast<uint8_t*>(addr);
  b->len_ = len;
  b->data_len_ = 0;
  b->next_ = nullptr;
  b->last_ = b;
  b->list_len_ = 1;
  b->refcount_ = 1;
  b->in_list_ = false;
  ++map->live_bufs_;
  *out = b;
  return Code::kSuccess;
}

Status BufInventory::get_by_data(Mmap* map, void* data, size_t len, Buf** out) {
  DPUKV_RETURN_IF_ERROR(get_by_addr(map, data, len, out));
  (*out)->data_len_ = len;
  return Code::kSuccess;
}

void BufInventory::release(Buf* b) {
  --b->map_->live_bufs_;
  b->refcount_ = 0;
  b->map_ = nullptr;
  b->next_ = nullptr;
  b->in_list_ = false;
  free_[num_free_++] = b;
}

}  // namespace dpukv
