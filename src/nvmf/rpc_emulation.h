// JSON-RPC methods of the emulation manager, named as the BlueField NVMe
// application names them (nvmf_doca_*): managers, and functions created,
// destroyed and listed.
#pragma once

#include "nvmf/app_state.h"

namespace dpukv::nvme {

void register_emulation_methods(AppState& app);

}  // namespace dpukv::nvme
