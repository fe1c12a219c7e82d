#include "cluster/peer_wire.h"

#include <cstring>

namespace dpukv::peer {

size_t message_bytes(Type type, uint32_t count) {
  const size_t item = type == Type::kPlaced  ? sizeof(Placed)
                      : type == Type::kTaken ? 1
                                             : sizeof(ChunkKey);
  return sizeof(Header) + static_cast<size_t>(count) * item;
}

void write_header(Type type, uint64_t request, uint32_t count, uint8_t* out) {
  const Header h{kMagic, kVersion, static_cast<uint16_t>(type), request, count, 0};
  std::memcpy(out, &h, sizeof(h));
}

Status parse_peer_message(const uint8_t* msg, size_t len, Message* out) {
  Header h;
  if (msg == nullptr || len < sizeof(h)) return Code::kInvalidValue;
  std::memcpy(&h, msg, sizeof(h));
  if (h.magic != kMagic || h.version != kVersion || h.reserved != 0) return Code::kInvalidValue;
  const auto type = static_cast<Type>(h.type);
  if (h.type < static_cast<uint16_t>(Type::kPin) || h.type > static_cast<uint16_t>(Type::kTaken))
    return Code::kInvalidValue;
  if (h.count == 0 || h.count > kMaxKeys || len != message_bytes(type, h.count))
    return Code::kInvalidValue;
  if (type == Type::kPlaced) {
    for (uint32_t i = 0; i < h.count; ++i) {
      Placed p;
      std::memcpy(&p, msg + sizeof(h) + i * sizeof(p), sizeof(p));
      if (p.status >= static_cast<uint8_t>(Code::kCount_) || p.encoded > 1)
        return Code::kInvalidValue;
      if (p.status == 0 && (p.stored == 0 || p.size == 0 || p.offset + p.stored < p.offset))
        return Code::kInvalidValue;
    }
  }
  if (type == Type::kTaken)
    for (uint32_t i = 0; i < h.count; ++i)
      if (msg[sizeof(h) + i] >= static_cast<uint8_t>(Code::kCount_)) return Code::kInvalidValue;
  out->type = type;
  out->request = h.request;
  out->count = h.count;
  out->items = msg + sizeof(h);
  return Code::kSuccess;
}

ChunkKey Message::key(uint32_t i) const {
  ChunkKey k;
  std::memcpy(&k, items + static_cast<size_t>(i) * sizeof(k), sizeof(k));
  return k;
}

Placed Message::placed(uint32_t i) const {
  Placed p;
  std::memcpy(&p, items + static_cast<size_t>(i) * sizeof(p), sizeof(p));
  return p;
}

}  // namespace dpukv::peer
