// JSON-RPC methods for transports and their listeners: nvmf_create_transport,
// nvmf_get_transports, nvmf_subsystem_add_listener / remove_listener. The
// transport is looked up by trtype in the application's table.
#pragma once

#include "nvmf/app_state.h"

namespace dpukv::nvme {

void register_transport_methods(AppState& app);

}  // namespace dpukv::nvme
