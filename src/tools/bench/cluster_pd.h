// `dpukv bench cluster`'s prefill-to-decode measurement: two agent processes of one
// cluster (Redis started for the run); a prefill client stores chunks on agent A
// and has A push them to agent B, a decode client on B retrieves them; against the
// same store and retrieve on one agent, and a raw TCP stream, in the same run.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/common/bench_common.h"

namespace dpukv {

// chunks of 256 KiB per transfer, reps timed rounds (medians); rows get the
// figures (json: no human lines). 0, or 1 with the reason on stderr.
int measure_cluster_pd(uint32_t chunks, uint32_t reps, bool json, std::vector<bench::Json>* rows);

}  // namespace dpukv
