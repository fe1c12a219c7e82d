// The links every eviction policy keeps over the cache's entry ids: intrusive
// doubly linked queues (most recent at the head), one node per entry, sized once,
// so a policy moves chunks between its queues without allocating.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/eviction_policy.h"

namespace dpukv::policy {

struct Node {
  int32_t prev = -1, next = -1;
  uint64_t bytes = 0;
  bool small = false;  // S3-FIFO: in the small queue; ARC: in T1 (used once since entering)
  uint8_t freq = 0;    // S3-FIFO: hits since entering its queue (at most 3)
};

struct Queue {
  int32_t head = -1, tail = -1;
  uint64_t bytes = 0;
};

class Links {
 public:
  explicit Links(uint32_t n) : nodes_(n) {}
  Node& operator[](int32_t e) { return nodes_[static_cast<size_t>(e)]; }
  const Node& operator[](int32_t e) const { return nodes_[static_cast<size_t>(e)]; }
  void push_front(Queue& q, int32_t e) {
    Node& n = (*this)[e];
    n.prev = -1;
    n.next = q.head;
    if (q.head >= 0) (*this)[q.head].prev = e;
    q.head = e;
    if (q.tail < 0) q.tail = e;
    q.bytes += n.bytes;
  }
  void push_back(Queue& q, int32_t e) {
    Node& n = (*this)[e];
    n.next = -1;
    n.prev = q.tail;
    if (q.tail >= 0) (*this)[q.tail].next = e;
    q.tail = e;
    if (q.head < 0) q.head = e;
    q.bytes += n.bytes;
  }
  void unlink(Queue& q, int32_t e) {
    Node& n = (*this)[e];
    if (n.prev >= 0)
      (*this)[n.prev].next = n.next;
    else if (q.head == e)
      q.head = n.next;
    else
      return;  // not linked
    if (n.next >= 0)
      (*this)[n.next].prev = n.prev;
    else
      q.tail = n.prev;
    n.prev = n.next = -1;
    q.bytes -= n.bytes;
  }
  // The coldest chunk of q that may go, or -1.
  int32_t scan(const Queue& q, EvictionPolicy::MayEvict may, const void* ctx) const {
    int32_t v = q.tail;
    while (v >= 0 && !may(ctx, v)) v = (*this)[v].prev;
    return v;
  }

 private:
  std::vector<Node> nodes_;
};

}  // namespace dpukv::policy
