// A message on the directory's event channel (anyone who reaches the cluster's
// Redis can publish one): any bytes are refused, or parsed into a header whose
// entries lie exactly inside the input, each with a known op and zero padding.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cluster/directory/directory_event.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ev = dpukv::directory_event;
  ev::Header h;
  const uint8_t* entries = nullptr;
  if (!ev::parse(data, size, &h, &entries).ok()) return 0;
  if (h.count == 0 || h.count > ev::kMaxEntries || entries != data + sizeof(ev::Header) ||
      size != sizeof(ev::Header) + size_t{h.count} * sizeof(ev::Entry))
    abort();
  uint64_t sum = 0;
  for (uint32_t i = 0; i < h.count; ++i) {
    ev::Entry e;
    std::memcpy(&e, entries + i * sizeof(e), sizeof(e));
    if (e.op != 1 && e.op != 2) abort();
    sum += e.key.prefix_hash;
  }
  return sum == 1 ? 1 : 0;  // keeps the reads
}
