#include "runtime/buf_checks.h"

#include "runtime/mmap.h"

namespace dpukv {
namespace {

// A range in the address space of its backing pages, so aliases compare equal.
struct Extent {
  uint64_t dev, ino, begin, end;
};

Extent extent_of(const Mmap* m, const uint8_t* p, size_t n) {
  const Mmap::Backing& b = m->backing();
  if (b.ino == 0) {
    auto a = reinterpret_cast<uint64_t>(p);
    return {0, 0, a, a + n};
  }
  uint64_t off = b.offset + static_cast<uint64_t>(p - m->addr());
  return {b.dev, b.ino, off, off + n};
}

bool overlaps(const Extent& a, const Extent& b) {
  return a.dev == b.dev && a.ino == b.ino && a.begin < b.end && b.begin < a.end;
}

}  // namespace

Status check_transfer(const Buf* src, const Buf* dst, uint32_t max_list_len, uint64_t max_bytes,
                      bool need_room_for_src) {
  if (src == nullptr || dst == nullptr || src->refcount() == 0 || dst->refcount() == 0)
    return Code::kInvalidValue;
  if (src->list_len() > max_list_len || dst->list_len() > max_list_len) return Code::kTooBig;
  uint64_t src_total = 0;
  for (const Buf* s = src; s != nullptr; s = s->next()) {
    const Mmap* m = s->mmap();
    if (m == nullptr || !m->started()) return Code::kBadState;
    if (!m->readable()) return Code::kNotPermitted;
    if (!m->contains(s->data(), s->data_len())) return Code::kInvalidValue;
    src_total += s->data_len();
  }
  if (src_total > max_bytes) return Code::kTooBig;
  uint64_t room = 0;
  for (const Buf* d = dst; d != nullptr; d = d->next()) {
    const Mmap* m = d->mmap();
    if (m == nullptr || !m->started()) return Code::kBadState;
    if (!m->writable()) return Code::kNotPermitted;
    if (!m->contains(d->data(), d->data_len() + d->tail_room())) return Code::kInvalidValue;
    room += d->tail_room();
  }
  if (need_room_for_src && room < src_total) return Code::kTooBig;
  // Compare each source segment with the bytes each destination segment may
  // receive (all of its room when the output size is not known in advance).
  uint64_t left = need_room_for_src ? src_total : room;
  for (const Buf* d = dst; d != nullptr && left != 0; d = d->next()) {
    size_t n = d->tail_room() < left ? d->tail_room() : static_cast<size_t>(left);
    if (n == 0) continue;
    left -= n;
    Extent de = extent_of(d->mmap(), d->data() + d->data_len(), n);
    for (const Buf* s = src; s != nullptr; s = s->next()) {
      if (s->data_len() != 0 && overlaps(de, extent_of(s->mmap(), s->data(), s->data_len())))
        return Code::kInvalidValue;
    }
  }
  return Code::kSuccess;
}

}  // namespace dpukv
