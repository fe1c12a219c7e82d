// The agent's request latency histograms (Prometheus buckets), shared by the
// request path (agent.cc) and the stats (agent_stats.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "agent/agent.h"

namespace dpukv {

struct Agent::Metrics {
  static constexpr double kBuckets[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                        0.005,   0.01,   0.05,    0.25,   1};
  struct Histogram {
    uint64_t counts[sizeof(kBuckets) / sizeof(double) + 1] = {};
    double sum = 0;
    uint64_t n = 0;
    void add(double s) {
      size_t i = 0;
      while (i < sizeof(kBuckets) / sizeof(double) && s > kBuckets[i]) ++i;
      ++counts[i];
      sum += s;
      ++n;
    }
  } store_lat, retrieve_lat, lookup_lat;
};

}  // namespace dpukv
