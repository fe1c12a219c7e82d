// The repo's conversation trace (traces/) as the block references a policy test
// replays; the test target defines DPUKV_CONVERSATION_TRACE as its path.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dpukv::cache_test {

// The block ids the first `requests` requests of the repo's conversation trace
// reference, in order (every block of a request, as the replay looks them up).
inline std::vector<uint64_t> conversation_trace_refs(int requests) {
  std::ifstream f(DPUKV_CONVERSATION_TRACE);
  EXPECT_TRUE(f) << DPUKV_CONVERSATION_TRACE;
  std::vector<uint64_t> ids;
  std::string line;
  for (int n = 0; n < requests && std::getline(f, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);  // a temporary would dangle
    for (const auto& id : j["hash_ids"]) ids.push_back(id.get<uint64_t>());
  }
  return ids;
}

}  // namespace dpukv::cache_test
