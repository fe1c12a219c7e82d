#include "cluster/directory/directory_event.h"

#include <cstring>

namespace dpukv::directory_event {

void begin(uint64_t node, std::string* msg) {
  const Header h{kMagic, kVersion, 0, node};
  msg->assign(reinterpret_cast<const char*>(&h), sizeof(h));
}

void append(Op op, const ChunkKey& key, std::string* msg) {
  Entry e{};
  e.op = static_cast<uint8_t>(op);
  e.key = key;
  msg->append(reinterpret_cast<const char*>(&e), sizeof(e));
  Header h;
  std::memcpy(&h, msg->data(), sizeof(h));
  ++h.count;
  std::memcpy(msg->data(), &h, sizeof(h));
}

bool full(const std::string& msg) {
  return msg.size() >= sizeof(Header) + size_t{kMaxEntries} * sizeof(Entry);
}

Status parse(const uint8_t* msg, size_t len, Header* header, const uint8_t** entries) {
  Header h;
  if (msg == nullptr || len < sizeof(h)) return Code::kInvalidValue;
  std::memcpy(&h, msg, sizeof(h));
  if (h.magic != kMagic || h.version != kVersion || h.count == 0 || h.count > kMaxEntries ||
      len != sizeof(h) + size_t{h.count} * sizeof(Entry))
    return Code::kInvalidValue;
  for (uint32_t i = 0; i < h.count; ++i) {
    Entry e;
    std::memcpy(&e, msg + sizeof(h) + i * sizeof(Entry), sizeof(e));
    if (e.op != static_cast<uint8_t>(Op::kHolds) && e.op != static_cast<uint8_t>(Op::kDrops))
      return Code::kInvalidValue;
    for (uint8_t z : e.zero)
      if (z != 0) return Code::kInvalidValue;
  }
  *header = h;
  *entries = msg + sizeof(h);
  return Code::kSuccess;
}

}  // namespace dpukv::directory_event
