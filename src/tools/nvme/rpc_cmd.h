// `dpukv rpc METHOD [PARAMS]`: a JSON-RPC client for `dpukv nvme`, used like
// SPDK's rpc.py: params as one JSON object or as key=value pairs.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_rpc_command(CLI::App* app, int* exit_code);

}  // namespace dpukv
