// Buffers and inventories (doca_buf, doca_buf_inventory).
//
// A Buf describes a window of a started Mmap: [head, head+len) is the buffer,
// [data, data+data_len) the valid bytes inside it. Every setter keeps both inside
// the map, so a buffer can never describe memory outside its map.
//
// Buffers come from a fixed-capacity BufInventory; taking one never allocates. A
// buffer returns to its inventory when its refcount drops to 0. Buffers chain into
// lists for scatter-gather: releasing the head of a list releases every element.
//
// Thread safety: an inventory and its buffers belong to one thread (the progress
// engine's). While a task is in flight, the engine owns the task's buffers; the
// caller must not touch them until the completion callback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/status.h"

namespace dpukv {

class Mmap;
class BufInventory;

class Buf {
 public:
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  uint8_t* head() const { return head_; }
  size_t len() const { return len_; }
  uint8_t* data() const { return data_; }
  size_t data_len() const { return data_len_; }
  Mmap* mmap() const { return map_; }
  Buf* next() const { return next_; }
  // Number of buffers in the list this buffer heads (1 for a lone buffer).
  uint32_t list_len() const { return list_len_; }
  uint16_t refcount() const { return refcount_; }

  // INVALID_VALUE unless [data, data+data_len) lies inside [head, head+len).
  Status set_data(void* data, size_t data_len);
  Status set_data_len(size_t data_len);
  // Empties the data section (data = head, data_len = 0).
  void reset_data() { data_ = head_, data_len_ = 0; }

  Status inc_refcount(uint16_t* refcount = nullptr);
  // At 0 the buffer (and, for a list head, the whole list) returns to the inventory.
  Status dec_refcount(uint16_t* refcount = nullptr);

  // Engines write received bytes after the current data; this is the room left.
  size_t tail_room() const { return static_cast<size_t>(head_ + len_ - (data_ + data_len_)); }

 private:
  friend class BufInventory;
  friend Status buf_chain_list(Buf*, Buf*);
  friend Status buf_unchain_list(Buf*, Buf*);
  Buf() = default;
  Mmap* map_ = nullptr;
  BufInventory* inv_ = nullptr;
  uint8_t* head_ = nullptr;
  size_t len_ = 0;
  uint8_t* data_ = nullptr;
  size_t data_len_ = 0;
  Buf* next_ = nullptr;
  Buf* last_ = nullptr;  // valid on a list head
  uint32_t list_len_ = 0;
  uint16_t refcount_ = 0;
  bool in_list_ = false;  // an element (not the head) of some list
};

// Appends list2 to list1. Both must be list heads of the same inventory, distinct.
// TOO_BIG if the combined list would exceed kMaxListLen.
Status buf_chain_list(Buf* list1, Buf* list2);
// Detaches list2 (an element of list1 and everything after it) as its own list.
Status buf_unchain_list(Buf* list1, Buf* list2);

class BufInventory {
 public:
  static constexpr uint32_t kMaxListLen = 1u << 16;

  static Status create(uint32_t capacity, std::unique_ptr<BufInventory>* out);
  ~BufInventory();
  BufInventory(const BufInventory&) = delete;
  BufInventory& operator=(const BufInventory&) = delete;

  // A buffer over [addr, addr+len) with an empty data section.
  Status get_by_addr(Mmap* map, void* addr, size_t len, Buf** out);
  // A buffer whose data section is all of [data, data+len).
  Status get_by_data(Mmap* map, void* data, size_t len, Buf** out);

  uint32_t capacity() const { return capacity_; }
  uint32_t num_free() const { return num_free_; }

 private:
  friend class Buf;
  BufInventory() = default;
  void release(Buf* b);
  std::unique_ptr<Buf[]> bufs_;
  std::unique_ptr<Buf*[]> free_;
  uint32_t capacity_ = 0;
  uint32_t num_free_ = 0;
};

}  // namespace dpukv
