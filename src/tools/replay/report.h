// What a replay prints: one JSON object (--json) or a table for a person, and a
// PNG of hit ratio and GB/s over trace time (--plot).
#pragma once

#include <cstdint>

#include "tools/replay/clients.h"
#include "tools/replay/replay.h"
#include "tools/replay/trace.h"

namespace dpukv::replay {

// What the run was, beside its totals.
struct RunShape {
  const Preset* preset;
  uint64_t block;
  uint32_t nodes, nclients;
  bool netns;
  uint64_t agent_peak_rss;  // 0: not our agent
};

// Prints the report; the exit code (1 if a byte failed its check or an entry failed).
int report(const Config& c, const RunShape& s, Totals& t);

}  // namespace dpukv::replay
