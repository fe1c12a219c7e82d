// Fuzzes the import of a memory-export descriptor: the bytes a peer sends with its
// fd. Whatever the bytes, import must either map a range that lies inside the fd
// or refuse; never crash or map past the file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "runtime/log.h"
#include "runtime/mem_region.h"
#include "runtime/mmap.h"

using namespace dpukv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<MemRegion> region = [] {
    log_set_level(LogSource::kLib, LogLevel::kDisable);
    std::unique_ptr<MemRegion> r;
    if (!MemRegion::create(1 << 20, MemRegionOptions{}, &r).ok()) abort();
    return r;
  }();
  std::unique_ptr<Mmap> m;
  Status st = Mmap::import(data, size, region->fd(), &m);
  if (st.ok()) {
    // Everything the map claims must be readable without a fault.
    uint8_t acc = 0;
    for (size_t i = 0; i < m->length(); i += 4096) acc ^= m->addr()[i];
    acc ^= m->addr()[m->length() - 1];
    asm volatile("" : : "r"(acc));
    if (m->length() > region->size()) abort();
  }
  return 0;
}
