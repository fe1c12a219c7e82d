// `dpukv agent` (the offload daemon) and `dpukv stat` (its summary).
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_agent_commands(CLI::App* app, int* exit_code);

}  // namespace dpukv
