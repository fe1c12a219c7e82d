// The bound a cache policy is measured against: Belady's offline optimum (MIN) over
// the replay's trace and capacity. On a miss the block whose next use is furthest
// in the future leaves, and a block used later than everything cached (or never
// again) is not cached at all. With unit-size blocks no policy, online or offline,
// gets more block hits from the same capacity; the replay counts only a request's
// leading hits, which is never more, so MIN's block hits bound every policy's.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/replay/trace.h"

namespace dpukv::replay {

struct OptimumHits {
  uint64_t block_hits = 0;   // every hit (the bound)
  uint64_t prefix_hits = 0;  // hits before a request's first miss (what the replay counts)
};

// The requests in trace order; capacity in blocks (at least 1).
OptimumHits belady_optimum(const std::vector<Request>& reqs, uint64_t capacity);

}  // namespace dpukv::replay
