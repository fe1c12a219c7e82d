// JSON-RPC methods for subsystems: create, delete, list; their namespaces and
// allowed hosts; the target's counters (nvmf_get_stats).
#pragma once

#include "nvmf/app_state.h"

namespace dpukv::nvme {

void register_subsystem_methods(AppState& app);

}  // namespace dpukv::nvme
