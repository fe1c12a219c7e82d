// `dpukv bench client`: store/retrieve through a real agent process against
// memcpy, and the lookup round trip against a bare comch round trip.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_bench_client_command(CLI::App* bench, int* exit_code);

}  // namespace dpukv
