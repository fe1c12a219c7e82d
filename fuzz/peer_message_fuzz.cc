// A control message as it arrives from another agent (UCX active message): any
// bytes are refused, or parsed into a view whose every item lies inside the input
// and whose PLACED entries are sane.
#include <cstdint>
#include <cstdlib>

#include "cluster/peer_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dpukv::peer::Message m;
  if (!dpukv::peer::parse_peer_message(data, size, &m).ok()) return 0;
  if (m.count == 0 || m.count > dpukv::peer::kMaxKeys ||
      dpukv::peer::message_bytes(m.type, m.count) != size || m.items != data + 24)
    abort();
  uint64_t sum = 0;
  for (uint32_t i = 0; i < m.count; ++i) {
    if (m.type == dpukv::peer::Type::kPlaced) {
      const dpukv::peer::Placed p = m.placed(i);
      if (p.status == 0 && (p.stored == 0 || p.offset + p.stored < p.offset)) abort();
      sum += p.offset;
    } else if (m.type == dpukv::peer::Type::kTaken) {
      if (static_cast<uint8_t>(m.status(i)) >= static_cast<uint8_t>(dpukv::Code::kCount_)) abort();
    } else {
      sum += m.key(i).prefix_hash;
    }
  }
  return sum == 1 ? 1 : 0;  // keeps the reads
}
