// The eviction policies, by name: the cache, the agent's settings and the CLI's
// choices and help all come from one table (a new policy is one row), and the
// factories behind it. Each policy implements cache/eviction_policy.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cache/eviction_policy.h"

namespace dpukv {

// What a policy is sized by, once, when the cache starts.
struct EvictionPolicySizing {
  uint32_t max_chunks = 0;      // entry ids are 0..max_chunks-1
  uint64_t capacity_bytes = 0;  // the memory tier
  uint64_t largest_chunk = 0;   // a memory-tier slot: capacity / largest_chunk chunks fit
};

// The policies, by name: the cache, the agent's settings and the CLI's choices and
// help all come from this table (a third policy is one row). The first row is
// the default.
struct EvictionPolicyInfo {
  const char* name;
  const char* summary;
  std::unique_ptr<EvictionPolicy> (*make)(const EvictionPolicySizing&);
};
std::span<const EvictionPolicyInfo> eviction_policies();
// The row of that name, or null.
const EvictionPolicyInfo* find_eviction_policy(std::string_view name);
// The names joined by sep ("arc|lru|s3fifo"), for choices and help.
std::string eviction_policy_names(std::string_view sep);

std::unique_ptr<EvictionPolicy> make_lru_policy(uint32_t max_chunks);
// capacity_bytes: the memory tier. ARC's ghost lists each remember kArcGhostFactor
// times the chunks it holds (cache/arc_policy.h); S3-FIFO's small queue holds up
// to a tenth of it, and `ghosts` evicted hashes are remembered.
std::unique_ptr<EvictionPolicy> make_arc_policy(uint32_t max_chunks, uint64_t capacity_bytes);
std::unique_ptr<EvictionPolicy> make_s3fifo_policy(uint32_t max_chunks, uint64_t capacity_bytes,
                                                   size_t ghosts);

}  // namespace dpukv
