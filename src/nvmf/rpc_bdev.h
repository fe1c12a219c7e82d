// JSON-RPC methods for block devices: bdev_<kind>_create for every kind in the
// registry, bdev_get_bdevs, bdev_delete.
#pragma once

#include "nvmf/app_state.h"

namespace dpukv::nvme {

void register_bdev_methods(AppState& app);

}  // namespace dpukv::nvme
