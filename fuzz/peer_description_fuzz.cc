// A peer's description as it arrives from the cluster directory: any bytes are
// refused or parsed into fields whose sizes add up to the input.
#include <cstdint>
#include <cstdlib>

#include "cluster/ucx/ucx_node.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dpukv::PeerDescription d;
  if (!dpukv::parse_peer_description(data, size, &d).ok()) return 0;
  if (40 + d.worker_address.size() + d.rkey.size() != size || d.region_len == 0 ||
      d.region_base + d.region_len < d.region_base)
    abort();
  return 0;
}
