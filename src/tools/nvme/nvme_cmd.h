// `dpukv nvme target|identify|perf`: the emulated NVMe controller, what it
// identifies as, and how fast it serves I/O through a real vfio-user client.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_nvme_commands(CLI::App* app, int* exit_code);

}  // namespace dpukv
