// The version the command reports is the agent's (one place: agent/agent.h).
#pragma once

#include "agent/agent.h"

namespace dpukv {
inline constexpr const char* kDpukvVersion = kAgentVersion;
}  // namespace dpukv
